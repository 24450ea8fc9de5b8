"""Invariance tests like Neculoiu et al. (2016, section 5): can a system find a ticket from its subject with typos,
extra words or two words swapped, when it never trained on that ticket?

A seeded share of the knowledge base's tickets is held out; the character-level Siamese BLSTM
(`recommender.model.char_siamese`) and the Replicated Siamese LSTM (label-free, `unsupervised.train_without_labels`)
train on the others. Each held-out subject, clean and with each perturbation (`augment.Augmenter.perturb`: every
word typo'd at 20 % substituted / 5 % deleted characters; 2 extra words of the knowledge base; two words swapped),
then queries the whole knowledge base (held-out tickets included) and must find its own ticket: Acc@1 and Acc@10
(ties count against the system: the own ticket's rank is 1 + the number of other tickets scoring at least as high).

Systems: the char-Siamese network (subject against subjects); the character-trigram matcher (TF-IDF over
char 3-grams, subjects); BM25 over the subjects alone and over whole tickets (`lexical.bm25.Bm25Scorer`); the
Replicated Siamese model (the subject as a query with an empty description against whole tickets, its own metric
with its BM25 channel, as `score_pairs` computes it).

    .venv/bin/python benchmarks/invariance.py [--held-out 150] [--seed 0] [--char-epochs 8,20] [--siamese-epochs 2]
        [--workdir /tmp/invariance] [--json out.json]

The trained networks are saved in --workdir and reused by a later run with the same settings (--retrain forces).
Prints a markdown table and the command that produced it.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recommender.data.records import Query, Ticket  # noqa: E402

from shared_data import SEAMONKEY, SEAMONKEY_MAP  # noqa: E402

KINDS = ("clean", "typos", "extra_words", "word_order")


def rank_of_own(scores: np.ndarray, own: int) -> int:
    """1 + the number of other rows scoring at least as high as row `own` (ties count against the system)."""
    return int((scores >= scores[own]).sum())


def held_out_split(tickets: list[Ticket], n: int, seed: int) -> tuple[list[int], list[Ticket]]:
    """Rows of `n` held-out tickets (seeded; subjects of at least two different words, so a swap changes them) and
    the training tickets (all the others)."""
    rng = np.random.default_rng(seed)
    usable = [i for i, t in enumerate(tickets) if len(set(t.subject.split())) >= 2 and (t.description or t.solution)]
    held = sorted(int(i) for i in rng.choice(usable, min(n, len(usable)), replace=False))
    keep = set(held)
    return held, [t for i, t in enumerate(tickets) if i not in keep]


def queries_for(tickets: list[Ticket], held: list[int], seed: int) -> dict[str, list[str]]:
    """kind → the held-out subjects with that perturbation (extra words from the knowledge base's frequent words)."""
    from recommender.model.char_siamese import knowledge_base_augmenter

    augmenter = knowledge_base_augmenter(tickets, seed + 1)
    out = {"clean": [tickets[i].subject for i in held]}
    for kind in KINDS[1:]:
        out[kind] = [augmenter.perturb(tickets[i].subject, kind, key=tickets[i].id) for i in held]
    return out


def char_siamese(train: list[Ticket], workdir: Path, epochs: int | None, seed: int, retrain: bool):
    from recommender.model.char_siamese import CharSiamese, CharSiameseConfig

    config = CharSiameseConfig() if epochs is None else CharSiameseConfig(epochs=epochs)
    path = workdir / f"char-siamese-e{config.epochs}-s{seed}"
    if path.exists() and not retrain:
        return CharSiamese.load(path), "loaded"
    started = time.time()
    model = CharSiamese(config).fit(train, seed=seed, progress=False,
                                                              echo=lambda line: print(line, file=sys.stderr))
    model.save(path)
    return model, f"trained in {time.time() - started:.0f} s"


def replicated_siamese(train: list[Ticket], workdir: Path, epochs: int, seed: int, pretrained: bool, retrain: bool):
    from recommender.model.bundle import TicketModel
    from recommender.model.unsupervised import label_free_config, train_without_labels

    path = workdir / f"replicated-e{epochs}-s{seed}{'-S' if pretrained else ''}"
    if path.exists() and not retrain:
        return TicketModel.load(path), "loaded"
    started = time.time()
    config = label_free_config(pretrained=pretrained, epochs=epochs)
    model = train_without_labels(train, config, path, seed=seed, mining={"adapt_pretrained": False}, progress=False,
                                 echo=lambda line: print(line, file=sys.stderr))
    return model, f"trained in {time.time() - started:.0f} s"


def ranks(systems: dict, queries: dict[str, list[str]], held: list[int]) -> dict[str, dict[str, list[int]]]:
    """system → kind → the own ticket's rank for each held-out query."""
    out: dict[str, dict[str, list[int]]] = {}
    for name, score_all in systems.items():
        out[name] = {kind: [rank_of_own(score_all(text), own) for text, own in zip(texts, held)]
                     for kind, texts in queries.items()}
    return out


def build_systems(tickets: list[Ticket], char_models: dict, siamese_model) -> dict:
    """name → score_all(subject) → float [n] over `tickets` (`char_models`: epochs → a trained CharSiamese)."""
    from recommender.lexical.bm25 import Bm25Scorer
    from recommender.lexical.trigram import TrigramMatcher

    subjects = [t.subject for t in tickets]
    systems = {}
    for epochs, char_model in char_models.items():
        matrix = char_model.encode(subjects)
        systems[f"char-Siamese BLSTM, {epochs} epochs (SUB–SUB)"] = (
            lambda text, m=char_model, t=matrix: m.similarity(m.encode([text])[0], t))
    trigrams = TrigramMatcher(subjects)
    systems["char trigrams, TF-IDF (SUB–SUB)"] = trigrams.scores
    bm25_sub = Bm25Scorer([Ticket(t.id, t.subject, "", "") for t in tickets])
    systems["BM25 (SUB–SUB)"] = bm25_sub.scores
    bm25_all = Bm25Scorer(tickets)
    systems["BM25 (SUB–whole ticket)"] = bm25_all.scores
    if siamese_model is not None:
        encoded = siamese_model.encode_tickets(tickets)
        n = len(tickets)
        lexical = siamese_model.metric_spec().get("bm25", 0) > 0

        def replicated(text: str) -> np.ndarray:
            q = siamese_model.encode_queries([Query(text, "")])
            q = {k: np.repeat(v, n, axis=0) for k, v in q.items()}
            return siamese_model.score_encoded(q, encoded, bm25_all.lexical(f"{text}\n") if lexical else None)

        systems["Replicated Siamese LSTM, label-free (SUB–whole ticket)"] = replicated
    return systems


def table(result: dict[str, dict[str, list[int]]], n: int) -> str:
    lines = ["| system | " + " | ".join(f"{k.replace('_', ' ')} Acc@1 | Acc@10" for k in KINDS) + " |",
             "|---|" + "---|---|" * len(KINDS)]
    for name, by_kind in result.items():
        cells = []
        for kind in KINDS:
            r = np.array(by_kind[kind])
            cells += [f"{(r <= 1).mean():.3f}", f"{(r <= 10).mean():.3f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n{n} held-out subjects per column."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", default=str(SEAMONKEY), help="knowledge base (SeaMonkey CSV by default)")
    parser.add_argument("--map", action="append", default=None, metavar="FIELD=COLUMN",
                        help="column mapping of --kb (default: the SeaMonkey export's)")
    parser.add_argument("--held-out", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--char-epochs", default=None,
                        help="epochs of the char-Siamese network, several comma-separated (one row each); default: "
                             "CharSiameseConfig's")
    parser.add_argument("--siamese-epochs", type=int, default=2)
    parser.add_argument("--pretrained", action="store_true",
                        help="the Replicated Siamese model with the packaged S channel (not adapted)")
    parser.add_argument("--no-siamese", action="store_true", help="leave the Replicated Siamese model out")
    parser.add_argument("--workdir", default="/tmp/ticketrec-invariance")
    parser.add_argument("--retrain", action="store_true")
    parser.add_argument("--json", default=None, help="also write the ranks and the table as JSON here")
    args = parser.parse_args(argv)

    import torch

    from recommender.data.importers import load

    torch.set_num_threads(1)
    mapping = dict(m.split("=", 1) for m in args.map) if args.map else SEAMONKEY_MAP
    if not Path(args.kb).is_file():
        print(f"error: {args.kb} does not exist; give the knowledge base with --kb (see ../shared/data/README.md)",
              file=sys.stderr)
        return 2
    tickets = list({t.id: t for t in load(args.kb, mapping=mapping).tickets}.values())
    held, train = held_out_split(tickets, args.held_out, args.seed)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"{len(tickets)} tickets, {len(held)} held out, {len(train)} to train on", file=sys.stderr)
    from recommender.model.char_siamese import CharSiameseConfig

    char_models, char_notes = {}, []
    for epochs in ([int(e) for e in args.char_epochs.split(",")] if args.char_epochs else [CharSiameseConfig().epochs]):
        char_models[epochs], note = char_siamese(train, workdir, epochs, args.seed, args.retrain)
        history = char_models[epochs].meta.get("history", [])
        kept = max(history[1:], key=lambda r: (r["held_out_mrr@10"], -r["epoch"]), default=None)
        char_notes.append(f"{epochs} epochs {note}, held-out MRR@10 untrained "
                          f"{history[0]['held_out_mrr@10'] if history else '?'}, kept epoch "
                          f"{kept['epoch'] if kept else '?'} {kept['held_out_mrr@10'] if kept else ''}")
    char_note = "; ".join(char_notes)
    siamese_model, siamese_note = (None, "left out") if args.no_siamese else replicated_siamese(
        train, workdir, args.siamese_epochs, args.seed, args.pretrained, args.retrain)
    queries = queries_for(tickets, held, args.seed)
    result = ranks(build_systems(tickets, char_models, siamese_model), queries, held)
    command = ".venv/bin/python benchmarks/invariance.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = table(result, len(held))
    examples = [{kind: queries[kind][i] for kind in KINDS} for i in range(min(3, len(held)))]
    print(f"```\n{command.strip()}\n```\n\n{text}\n\nchar-Siamese: {char_note}; Replicated Siamese: {siamese_note}")
    print("\nExamples:\n" + "\n".join("- " + " / ".join(f"{k}: {v!r}" for k, v in e.items()) for e in examples))
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "held_out": [tickets[i].id for i in held],
                                               "queries": queries, "ranks": result, "table": text,
                                               "char_siamese": {str(e): {"version": m.version, "history":
                                                                         m.meta.get("history")}
                                                                for e, m in char_models.items()},
                                               "replicated": None if siamese_model is None else
                                               {"version": siamese_model.version, "note": siamese_note,
                                                "metric": siamese_model.metric_spec()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
