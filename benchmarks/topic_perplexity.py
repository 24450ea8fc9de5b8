"""DocNADE vs LDA held-out perplexity, like Table 3 of Gupta et al. (2018): models trained on SUB+DESC ("M1")
and on SUB+DESC+SOL ("M2"), evaluated on the same held-out text, on SemEval-2016 and on synthetic tickets.

    .venv/bin/python benchmarks/topic_perplexity.py [--topics 100] [--corpus semeval synthetic]

Prints one markdown table per corpus and the command that reproduces it.
"""
from __future__ import annotations

import argparse
import random
import shlex
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recommender.data.importers import load  # noqa: E402
from recommender.data.records import Ticket  # noqa: E402
from recommender.lexical.analyzer import token_documents  # noqa: E402
from topic_models.perplexity import build_id_documents, compare, markdown_table  # noqa: E402

SEMEVAL_DIR = ROOT.parent / "shared" / "data" / "semeval2016"
HELDOUT = ["SUB+DESC", "SUB+DESC+SOL"]


def read_semeval_tickets(path: Path) -> list[Ticket]:
    """Related questions of a SemEval-2016 Task 3 file as tickets (SOL = the Good comments, all when none is)."""
    return list(load(path).tickets)


def run(name: str, train: list[Ticket], heldout: list[Ticket], args) -> str:
    def texts(tickets):
        return {"SUB+DESC": token_documents(tickets, False, args.stop_words),
                "SUB+DESC+SOL": token_documents(tickets, True, args.stop_words)}

    train_texts, held_texts = texts(train), texts(heldout)
    words, train_ids, held_ids = build_id_documents(train_texts, held_texts, vocab_from="SUB+DESC+SOL",
                                                    min_count=args.min_count, max_vocab=args.max_vocab)
    if args.shuffle_words:  # bag-of-words comparison: DocNADE can no longer use the order of template text
        rng = random.Random(args.seed)
        shuffle = lambda ds: [rng.sample(d, len(d)) for d in ds]  # noqa: E731
        train_ids = {k: shuffle(v) for k, v in train_ids.items()}
        held_ids = {k: shuffle(v) for k, v in held_ids.items()}
    if args.max_doc_len:
        cut = lambda ds: [d[: args.max_doc_len] for d in ds]  # noqa: E731
        train_ids = {k: cut(v) for k, v in train_ids.items()}
        held_ids = {k: cut(v) for k, v in held_ids.items()}
    rows = compare({"M1 SUB+DESC": train_ids["SUB+DESC"], "M2 SUB+DESC+SOL": train_ids["SUB+DESC+SOL"]},
                   held_ids, vocab_size=len(words), n_topics=args.topics, seed=args.seed,
                   docnade_options={"epochs": args.epochs, "lr": args.lr, "softmax": args.softmax,
                                    "batch_size": args.batch_size, "max_doc_len": None},
                   lda_options={"passes": args.passes}, progress=not args.quiet)
    held_words = {h: rows[0][f"{h} words"] for h in HELDOUT}
    return (f"### {name}: {len(train)} training tickets, {len(heldout)} held-out tickets, vocabulary {len(words):,} "
            f"(min count {args.min_count}{', content words' if not args.stop_words else ''}"
            f"{', words shuffled' if args.shuffle_words else ''}), {args.topics} topics\n"
            f"held-out words: {held_words}\n\n" + markdown_table(rows, HELDOUT))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", nargs="+", choices=["semeval", "synthetic"], default=["semeval", "synthetic"])
    parser.add_argument("--semeval-dir", type=Path, default=SEMEVAL_DIR)
    parser.add_argument("--synthetic-tickets", type=int, default=1000, help="generated tickets (70%% train, 30%% held out)")
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--min-count", type=int, default=2)
    parser.add_argument("--max-vocab", type=int, default=None)
    parser.add_argument("--max-doc-len", type=int, default=300, help="cut every document (train and held-out) to N tokens")
    parser.add_argument("--stop-words", action="store_true", help="keep stop words (default: content words only)")
    parser.add_argument("--shuffle-words", action="store_true",
                        help="shuffle the words of every document (seeded): compare as bags of words, not ordered text")
    parser.add_argument("--softmax", choices=["full", "tree"], default="full")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--passes", type=int, default=20, help="LDA passes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    out = []
    if "semeval" in args.corpus:
        if not (args.semeval_dir / "train-part2.xml").exists():
            out.append(f"SemEval skipped: no train-part2.xml in {args.semeval_dir}")
        else:
            out.append(run("SemEval-2016 (train-part2 -> dev)", read_semeval_tickets(args.semeval_dir / "train-part2.xml"),
                           read_semeval_tickets(args.semeval_dir / "dev.xml"), args))
    if "synthetic" in args.corpus:
        try:
            from recommender.data.synthetic import generate
        except ImportError as exc:
            out.append(f"synthetic skipped: recommender.data.synthetic is not available ({exc})")
        else:
            tickets = list(generate(n_tickets=args.synthetic_tickets, n_queries=0, seed=args.seed).tickets)
            n_train = int(len(tickets) * 0.7)
            out.append(run("Synthetic", tickets[:n_train], tickets[n_train:], args))
    print("\n\n".join(out))
    print("\ncommand: .venv/bin/python benchmarks/topic_perplexity.py " + " ".join(map(shlex.quote, sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
