"""How English does a knowledge base read? The share of its words that are English stop words (`analyzer.STOP_WORDS`),
the figure behind the warning of `ticketrec import` and `train` (`analyzer.ENGLISH_STOP_SHARE`, README "Languages").

Real English knowledge bases (SeaMonkey's bug reports, SemEval-2016's forum questions with their answers), the
synthetic one, and a few hand-written German and French help-desk tickets (below; we have no real non-English export).

    .venv/bin/python benchmarks/stop_word_share.py
"""
from __future__ import annotations

from shared_data import SEAMONKEY, SEMEVAL, seamonkey_tickets

#: (subject, description, solution) of hand-written help-desk tickets in German and French.
GERMAN = [
    ("Drucker druckt nicht mehr", "Seit dem Update am Montag druckt der Drucker im zweiten Stock keine Seiten mehr. "
     "Die Warteschlange zeigt die Aufträge an, aber nichts passiert. Ich habe den Drucker schon neu gestartet und das "
     "Kabel geprüft.", "Der Treiber war nach dem Update beschädigt. Wir haben ihn deinstalliert und die aktuelle "
     "Version installiert; danach lief alles wieder."),
    ("VPN-Verbindung bricht ab", "Die VPN-Verbindung bricht jeden Nachmittag gegen 17 Uhr ab. Im Log steht Fehler "
     "809. Das passiert nur im Homeoffice, im Büro ist alles in Ordnung.", "Die Leerlaufzeit am Gateway war zu kurz "
     "eingestellt. Wir haben sie auf acht Stunden erhöht."),
]
FRENCH = [
    ("L'imprimante n'imprime plus", "Depuis la mise à jour de lundi, l'imprimante du deuxième étage n'imprime plus "
     "aucune page. La file d'attente affiche les travaux mais rien ne se passe. J'ai redémarré l'imprimante et vérifié "
     "le câble.", "Le pilote était endommagé après la mise à jour. Nous l'avons désinstallé puis installé la version "
     "actuelle."),
    ("Le VPN se déconnecte", "La connexion VPN se coupe tous les après-midi vers 17 heures. Le journal indique "
     "l'erreur 809. Cela n'arrive qu'en télétravail, au bureau tout fonctionne.", "Le délai d'inactivité de la "
     "passerelle était trop court. Nous l'avons porté à huit heures."),
]


def main() -> None:
    from recommender.data.importers import load
    from recommender.data.records import Ticket, ticket_text
    from recommender.data.synthetic import generate
    from recommender.lexical.analyzer import ENGLISH_STOP_SHARE, stop_word_share

    sets = []
    if SEAMONKEY.exists():
        sets.append(("SeaMonkey bug reports", seamonkey_tickets()))
    if (SEMEVAL / "train-part2.xml").exists():
        sets.append(("SemEval-2016 train-part2 (questions and answers)", load(SEMEVAL / "train-part2.xml").tickets))
    sets.append(("synthetic, 2,000 tickets (seed 0)", generate(2000, 0, seed=0).tickets))
    for name, texts in (("German, hand-written", GERMAN), ("French, hand-written", FRENCH)):
        sets.append((name, [Ticket(str(i), *t) for i, t in enumerate(texts)]))
    print("    .venv/bin/python benchmarks/stop_word_share.py\n")
    print(f"| knowledge base | tickets | English stop words (warned below {ENGLISH_STOP_SHARE:.0%}) |")
    print("|---|---|---|")
    for name, tickets in sets:
        print(f"| {name} | {len(tickets):,} | {stop_word_share(ticket_text(t) for t in tickets):.1%} |")


if __name__ == "__main__":
    main()
