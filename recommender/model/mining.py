"""Training pairs mined from the knowledge base itself, for a help desk that has tickets but no labelled pairs.

A ticket's SUBJECT (optionally with the first sentences of its DESCRIPTION, at most `prefix_words` words) is a
query; the ticket's *view* — its other fields, the rest of the DESCRIPTION and the SOLUTION, with the SUBJECT left
out — is the target it must find. The target never holds the query's words: a target that still contains the
subject makes pairs a lexical match solves, and weights selected on them lean toward BM25 (findings.md).

Per query: one positive (YES = 5, its own view) and `negatives` negatives (NO = 1): a `hard_share` of them hard
(among the `hard_pool` views of highest BM25 for the query, never its own), the rest random. Training queries
also come in `augmented` noisy variants (`augment.Augmenter`: typos, synonyms, extra and dropped words) with
the same target and fresh negatives. A held-out slice of the tickets (`held_out`, by ticket: neither its
query nor its augmentations are trained on) serves early stopping and the selection of channel and pair weights;
its queries carry whole sentences up to half of the description (`held_out_prefix_words`), not the training
queries' 30 words, so that the weights are chosen on queries as long as a new ticket's.
A view has no subject, so the slice cannot show how much two tickets' subjects say (SUB1–SUB2), and it hides the
view's subject from BM25; a help desk's duplicates are whole tickets, subjects on both sides. With an augmenter,
each held-out ticket therefore also gives a *paraphrase* query (`held_out_paraphrases`): a noisy variant of its
subject (`Augmenter.augment`: typos, synonyms, extra and dropped words, as another engineer might word it) with the
same description prefix, which must find its ticket among the *full views* (each view with its subject back). The
paraphrase queries select weights only (`weight_selection.select_on_held_out`); the network never trains on them.
Labelled pairs, when a help desk has some, are added to the mined pairs (`unsupervised.py`), not a replacement.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import ClassVar, Sequence

import numpy as np

from ..data.records import NO, YES, Query, Ticket, query_text
from ..errors import InputError
from ..lexical.bm25 import Bm25Scorer
from .augment import Augmenter
from .saved_config import SavedConfig

#: The fewest minable tickets label-free training accepts. With the default 15 % held-out slice (at least
#: `MIN_HELD_OUT` tickets) that leaves ≥ 20 tickets to train on, and each query needs `negatives` (4) other
#: tickets, 2 of them among the 10 most similar: below about 30 tickets the held-out ranking that selects the
#: weights is a handful of queries over a handful of tickets, too few to tell one weighting from another.
MIN_TICKETS = 30
#: The fewest held-out tickets (queries) the weight selection ranks.
MIN_HELD_OUT = 8
#: Where a description's sentences end, for the query/view cut: after . ! or ? followed by white space, or at a
#: line break.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")


@dataclass
class MiningConfig(SavedConfig):
    """How pairs are mined, and whether they adapt the S encoder (JSON-serialisable; stored with the model's
    training report)."""

    negatives: int = 4
    hard_share: float = 0.5
    hard_pool: int = 10
    held_out: float = 0.15
    max_held_out: int = 300
    prefix_words: int = 30
    # held-out queries take whole sentences up to half of the description, however many words (0: as training):
    # the slice that selects the weights should look like what serving gets, a whole new ticket against whole old
    # ones, so a channel that learnt only the short training queries does not earn its weight there
    held_out_prefix_words: int = 1_000_000
    augmented: int = 1
    # each held-out ticket also as a paraphrased-subject query against the views with their subjects (see above)
    held_out_paraphrases: bool = True
    # the weights are selected only among those that rank the held-out tickets, pasted whole as queries, first
    # about as well as the best weighting does (weight_selection.select_on_held_out): the promise that a ticket pasted
    # as its own query is found first
    held_out_pasted: bool = True
    labelled_weight: int = 2
    # the pretrained channel S adapted on the mined pairs (adaptation.py), kept only when it ranks the held-out
    # slice better: at most `adapt_pairs` pairs (one per training ticket), `adapt_epochs` epochs
    adapt_pretrained: bool = True
    adapt_pairs: int = 2000
    adapt_epochs: int = 1
    # the longest text (word pieces) the adaptation reads, longer ones cut: 128, the length all-MiniLM-L6-v2 was
    # trained at. 256, what S reads of a description when serving, is an option: tried on 2026-11-29 and not kept
    # (docs/internals.md, "Learning without labels", step 3)
    adapt_max_tokens: int = 128
    # each adaptation pair with a third text, its query's hardest mined negative (a training ticket's view), as the
    # triplets of MultipleNegativesRankingLoss. An option, not the default: tried on 2026-11-27 and not kept
    # (docs/internals.md, "Learning without labels", step 3)
    adapt_hard_negatives: bool = False
    # lines of a field that recur in at least this share of the tickets beside other lines (forms, user agents,
    # signatures) are left out of what the learned channels read (`template_lines.py`); 0: none. An option
    # (e.g. 0.01), not the default: tried on 2026-11-27 and not kept (docs/internals.md, "Template lines")
    template_share: float = 0.0
    # whether each calibration query's 5th-20th ticket is a NO pair (`mined_calibration.band_negatives`): "auto"
    # decides from where those tickets score (`mined_calibration.band_is_no`); "always" or "never" overrides it, for a
    # help desk that knows whether its problems recur (the automatic switch misjudges clusters of about fifteen
    # tickets: docs/internals.md, "Kept: the band left out where it scores like the own tickets")
    band_as_no: str = "auto"
    # with labelled pairs (`--train` files, the store's pairs), the channel and BM25 weights re-selected on their
    # queries: each query's labelled tickets reranked, the simplest weighting within one standard error of the best
    # MAP, the pair weights kept (`weight_selection.select_on_labelled`; at least `MIN_LABELLED_QUERIES` queries with
    # a relevant and a non-relevant ticket); the labels then train nothing. An option, not the default: +1.23, +0.08
    # and +0.36 MAP over three SemEval-2016 cross-validation seeds, −0.42 on dev over seeds 0–2 (docs/internals.md,
    # "A selection that reads the labels" and "Over three cross-validation seeds it does not pay")
    select_on_labelled: bool = False

    ADDED_FIELDS: ClassVar[dict] = {"template_share": 0.0,  # `SavedConfig`: models trained before the fields
                                    "adapt_hard_negatives": False, "adapt_max_tokens": 128, "band_as_no": "auto",
                                    "select_on_labelled": False}
    BAND_AS_NO: ClassVar[tuple] = ("auto", "always", "never")

    def __post_init__(self):
        if self.negatives < 1:
            raise InputError("mining needs at least 1 negative per positive (negatives ≥ 1): positives alone "
                             "cannot teach a ranking")
        if not 0.0 <= self.hard_share <= 1.0:
            raise InputError(f"hard_share must be within [0, 1], not {self.hard_share}")
        if not 0.0 < self.held_out < 0.5:
            raise InputError(f"held_out must be within (0, 0.5), not {self.held_out}")
        if not 0.0 <= self.template_share < 1.0:
            raise InputError(f"template_share must be within [0, 1), not {self.template_share}")
        if self.band_as_no not in self.BAND_AS_NO:
            raise InputError(f"band_as_no must be one of {', '.join(self.BAND_AS_NO)}, not {self.band_as_no!r}")
        if (self.prefix_words < 0 or self.held_out_prefix_words < 0 or self.augmented < 0 or self.labelled_weight < 1
                or self.hard_pool < 1 or self.adapt_pairs < 2 or self.adapt_epochs < 1
                or not 8 <= self.adapt_max_tokens <= 512):
            raise InputError("prefix_words, held_out_prefix_words and augmented must be ≥ 0, labelled_weight, hard_pool "
                             "and adapt_epochs ≥ 1, adapt_pairs ≥ 2, adapt_max_tokens within [8, 512] (the encoder's "
                             "longest input)")

    @classmethod
    def from_dict(cls, data: dict | None) -> "MiningConfig":
        """Build from JSON (e.g. SiameseConfig.mining); an unknown key raises InputError naming it."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown mining option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class MinedPairs:
    """Pairs over mined queries and the knowledge base's views: pair k is (queries[q[k]], views[t[k]]) with label y[k].

    `held_out_truth[i]` is the row in `views` of held-out query i's own ticket (its only relevant view).
    `full_views[r]` is `views[r]` with its ticket's subject; `paraphrase_queries[i]` (a held-out ticket's subject
    paraphrased, its description prefix) must find row `paraphrase_truth[i]` of `full_views` (empty without an
    augmenter or with `held_out_paraphrases` off). `originals[r]` is the ticket whose view is `views[r]`.
    `train_hard[i]` is the row in `views` of training query i's hardest negative (of the hard ones mined for it, the
    one of highest BM25), -1 when it has none.
    """

    views: list[Ticket]
    train_queries: list[Query]
    train_q: np.ndarray
    train_t: np.ndarray
    train_y: np.ndarray
    held_out_queries: list[Query]
    held_out_q: np.ndarray
    held_out_t: np.ndarray
    held_out_y: np.ndarray
    held_out_truth: np.ndarray
    stats: dict
    full_views: list[Ticket]
    paraphrase_queries: list[Query]
    paraphrase_truth: np.ndarray
    originals: list[Ticket]
    train_hard: np.ndarray


def split_ticket(ticket: Ticket, prefix_words: int) -> tuple[Query, Ticket] | None:
    """(query, view) of one ticket, or None when it has no subject or nothing beside it.

    The query is the SUBJECT plus the DESCRIPTION's first whole sentences, as many as fit in `prefix_words` words
    and in half of the description (none when the first sentence does not fit; the last sentence always stays); the
    view is the ticket without the query's text: SUBJECT empty, the rest of the DESCRIPTION, SOLUTION. Cutting
    between sentences, not after a fixed number of words, keeps two artefacts of the cut out of the held-out task:
    a sentence broken across query and view, and a prefix that is exactly half of a short description (its length
    would give away the view's).
    """
    subject = (ticket.subject or "").strip()
    description = (ticket.description or "").strip()
    solution = (ticket.solution or "").strip()
    if not subject or not (description or solution):
        return None
    prefix, rest = "", description
    sentences = [" ".join(s.split()) for s in _SENTENCE_BREAK.split(description) if s.strip()]
    total = sum(len(s.split()) for s in sentences)
    taken = n = 0
    for sentence in sentences[:-1]:
        words = len(sentence.split())
        if taken + words > prefix_words or 2 * (taken + words) > total:
            break
        taken, n = taken + words, n + 1
    if n:
        prefix, rest = " ".join(sentences[:n]), " ".join(sentences[n:])
    query = Query(subject, prefix, id=f"mined:{ticket.id}")
    return query, Ticket(ticket.id, "", rest, solution)


def require_minable(tickets: Sequence[Ticket], config: MiningConfig | None = None) -> int:
    """The number of minable tickets (a subject and a description or solution); InputError below `MIN_TICKETS`."""
    config = config or MiningConfig()
    usable = sum(1 for t in tickets if split_ticket(t, config.prefix_words) is not None)
    if usable < MIN_TICKETS:
        no_subject = sum(1 for t in tickets if not (t.subject or "").strip())
        subject_only = len(tickets) - usable - no_subject
        missing = "; ".join(f"{count} {what}" for count, what in (
            (subject_only, "have a subject and nothing else"), (no_subject, "have no subject")) if count)
        field = "description" if subject_only >= no_subject else "subject"
        todo = ("Import more tickets (ticketrec import FILE)" if len(tickets) < MIN_TICKETS else
                f"Import them again with the column that holds their {field} mapped (ticketrec import FILE --map "
                f"{field}=COLUMN …; a ticket imported under an id already stored replaces it)")
        raise InputError(
            f"label-free training needs at least {MIN_TICKETS} tickets with a subject and a description or "
            f"solution (it learns from each ticket's subject asked against the rest of it); the knowledge base "
            f"has {usable} (of {len(tickets)} tickets{': ' + missing if missing else ''}). {todo}, or give "
            "labelled pairs with --train FILE --no-mined")
    return usable


def draw_excluding(rng: np.random.Generator, n: int, excluded: Sequence[int], k: int) -> list[int]:
    """k distinct rows of range(n) that are not among the few `excluded` ones (fewer when fewer remain), drawn
    without replacement. The draws, and the generator's state after them, are those of `rng.choice(others, k,
    replace=False)` over the array `others` of every row not excluded, which this does not build: built for every
    mined query, that array made mining grow with the square of the knowledge base."""
    skip = sorted(set(int(e) for e in excluded))
    remaining = n - len(skip)
    rows = []
    for i in rng.choice(remaining, min(k, remaining), replace=False):
        row = int(i)  # the i-th row not excluded: step over each excluded row at or before it
        for e in skip:
            if e > row:
                break
            row += 1
        rows.append(row)
    return rows


def mine_pairs(tickets: Sequence[Ticket], config: MiningConfig | None = None, seed: int = 0,
               augmenter: Augmenter | None = None) -> MinedPairs:
    """Mine training and held-out pairs from `tickets` (deterministic for a seed); raises InputError when the
    knowledge base cannot give enough (fewer than `MIN_TICKETS` tickets with a subject and a description or
    solution)."""
    config = config or MiningConfig()
    split = [(t, split_ticket(t, config.prefix_words)) for t in tickets]
    usable = [(t, s) for t, s in split if s is not None]
    require_minable(tickets, config)
    if len({t.id for t, _ in usable}) != len(usable):
        raise InputError("the knowledge base holds two tickets with one id; give every ticket its own id")
    rng = np.random.default_rng(seed)
    n = len(usable)
    n_held = int(min(config.max_held_out, max(MIN_HELD_OUT, round(config.held_out * n))))
    held = np.zeros(n, dtype=bool)
    held[rng.permutation(n)[:n_held]] = True
    if config.held_out_prefix_words:  # held-out tickets cut with their own prefix length (same subject, so minable)
        usable = [(t, split_ticket(t, config.held_out_prefix_words) if held[i] else s)
                  for i, (t, s) in enumerate(usable)]
    views = [s[1] for _, s in usable]
    base_queries = [s[0] for _, s in usable]
    scorer = Bm25Scorer(views)
    n_hard = int(round(config.negatives * config.hard_share))

    def negatives(text: str, own: int) -> tuple[list[int], int]:
        """`config.negatives` rows for a query of row `own`, the hard ones first (highest BM25 first), and how many
        of them are hard."""
        chosen: list[int] = []
        if n_hard:
            rows, _ = scorer.top_k(text, config.hard_pool + 1)
            pool = [int(r) for r in rows if r != own][: config.hard_pool]
            if pool:
                chosen = [pool[i] for i in sorted(rng.choice(len(pool), min(n_hard, len(pool)), replace=False))]
        hard = len(chosen)
        want = config.negatives - hard  # random ones fill in when too few tickets share a word
        return chosen + draw_excluding(rng, n, chosen + [own], want), hard

    sides = {"train": ([], [], [], []), "held": ([], [], [], [])}
    truth: list[int] = []
    paraphrases: list[Query] = []
    paraphrase_truth: list[int] = []
    train_hard: list[int] = []
    n_augmented = 0
    for i, query in enumerate(base_queries):
        key = "held" if held[i] else "train"
        queries, q, t, y = sides[key]
        variants = [query]
        if key == "train" and augmenter is not None:
            for copy in range(config.augmented):
                text = augmenter.augment(query.subject, key=f"{query.id}:{copy}")
                if text and text != query.subject:
                    variants.append(Query(text, query.description, id=f"{query.id}:aug{copy + 1}"))
                    n_augmented += 1
        for variant in variants:
            qi = len(queries)
            queries.append(variant)
            if key == "held" and variant is query:
                truth.append(i)
                paraphrase = _paraphrase(query, augmenter) if config.held_out_paraphrases else None
                if paraphrase is not None:
                    paraphrases.append(paraphrase)
                    paraphrase_truth.append(i)
            rows, hard = negatives(query_text(variant), i)
            if key == "train":
                train_hard.append(rows[0] if hard else -1)
            for row, label in [(i, YES)] + [(r, NO) for r in rows]:
                q.append(qi)
                t.append(row)
                y.append(label)
    arr = {k: (v[0], np.array(v[1], np.int64), np.array(v[2], np.int64), np.array(v[3], np.float64))
           for k, v in sides.items()}
    stats = {"tickets": len(tickets), "minable_tickets": n, "held_out_tickets": n_held,
             "train_queries": len(arr["train"][0]), "augmented_queries": n_augmented,
             "train_pairs": len(arr["train"][3]), "held_out_pairs": len(arr["held"][3]),
             "positives": int((arr["train"][3] == YES).sum() + (arr["held"][3] == YES).sum()),
             "paraphrase_queries": len(paraphrases), "with_prefix": sum(1 for qq in base_queries if qq.description),
             "held_out_query_words": float(np.mean([len(f"{q.subject} {q.description}".split())
                                                    for q, h in zip(base_queries, held) if h])),
             "config": config.to_dict()}
    full_views = [Ticket(view.id, t.subject, view.description, view.solution) for (t, _), view in zip(usable, views)]
    return MinedPairs(views, *arr["train"], *arr["held"], np.array(truth, np.int64), stats, full_views, paraphrases,
                      np.array(paraphrase_truth, np.int64), [t for t, _ in usable], np.array(train_hard, np.int64))


def _paraphrase(query: Query, augmenter: Augmenter | None) -> Query | None:
    """`query` with its subject reworded by `augmenter` (the first of three tries that changes it), or None (no
    augmenter, or a subject it leaves as it is: an unchanged subject finds its ticket by copy, not by meaning)."""
    if augmenter is None:
        return None
    for attempt in range(3):
        text = augmenter.augment(query.subject, key=f"{query.id}:paraphrase{attempt}")
        if text and text.lower() != query.subject.lower():
            return Query(text, query.description, id=f"{query.id}:paraphrase")
    return None
