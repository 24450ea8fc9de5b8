"""Topic models: `ticketrec topics perplexity` and `topics show`."""
from __future__ import annotations

import click

from .common import echo_json, main, settings


@main.group()
def topics() -> None:
    """Topic models: DocNADE vs LDA perplexity, and the topics of a trained model."""


def _topic_texts(path: str, with_solution: bool, stop_words: bool) -> list[list[str]]:
    """One token document per ticket of a data file: SUB+DESC, or SUB+DESC+SOL."""
    from ..data.importers import load
    from ..lexical.analyzer import token_documents

    return token_documents(load(path).tickets, with_solution, stop_words)


@topics.command("perplexity")
@click.option("--train", "train_file", required=True, type=click.Path(dir_okay=False, exists=True),
              help="tickets to train on (JSONL, CSV or SemEval XML)")
@click.option("--heldout", "heldout_file", required=True, type=click.Path(dir_okay=False, exists=True),
              help="held-out tickets to measure perplexity on")
@click.option("--topics", "n_topics", type=int, default=100, show_default=True)
@click.option("--min-count", type=int, default=2, show_default=True,
              help="drop words seen fewer times in training text")
@click.option("--max-doc-len", type=int, default=300, show_default=True, help="cut every document to N tokens")
@click.option("--stop-words/--content-words", default=False, help="keep stop words (default: content words only)")
@click.option("--softmax", type=click.Choice(["full", "tree"]), default="full", show_default=True)
@click.option("--epochs", type=int, default=30, show_default=True,
              help="DocNADE epochs (early stopping on 10%% of train)")
@click.option("--passes", type=int, default=20, show_default=True, help="LDA passes")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON rows instead of a markdown table")
def topics_perplexity(train_file, heldout_file, n_topics, min_count, max_doc_len, stop_words, softmax, epochs, passes,
                      seed, as_json) -> None:
    """DocNADE vs LDA held-out perplexity, trained on SUB+DESC (M1) and SUB+DESC+SOL (M2), as in the paper's Table 3."""
    from topic_models import TopicModelError
    from topic_models.perplexity import build_id_documents, compare, markdown_table

    from ..errors import InputError

    kinds = {"SUB+DESC": False, "SUB+DESC+SOL": True}
    train_texts = {k: _topic_texts(train_file, sol, stop_words) for k, sol in kinds.items()}
    held_texts = {k: _topic_texts(heldout_file, sol, stop_words) for k, sol in kinds.items()}
    try:
        words, train_ids, held_ids = build_id_documents(train_texts, held_texts, "SUB+DESC+SOL", min_count)
        cut = (lambda docs: [d[:max_doc_len] for d in docs]) if max_doc_len else (lambda docs: docs)
        if not any(held_ids["SUB+DESC"]):
            raise TopicModelError(f"no held-out ticket in {heldout_file} has a word of the training vocabulary")
        rows = compare({"M1 SUB+DESC": cut(train_ids["SUB+DESC"]), "M2 SUB+DESC+SOL": cut(train_ids["SUB+DESC+SOL"])},
                       {k: cut(v) for k, v in held_ids.items()}, vocab_size=len(words), n_topics=n_topics, seed=seed,
                       docnade_options={"epochs": epochs, "softmax": softmax, "max_doc_len": None},
                       lda_options={"passes": passes}, progress=True)
    except TopicModelError as exc:
        raise InputError(str(exc)) from exc
    if as_json:
        echo_json({"vocabulary": len(words), "topics": n_topics, "rows": rows})
    else:
        click.echo(f"vocabulary {len(words):,} words, {n_topics} topics\n")
        click.echo(markdown_table(rows, list(kinds)))


@topics.command("show")
@click.option("--model", "model_dir", type=click.Path(file_okay=False), default=None,
              help="model directory (default: TICKETREC_MODEL)")
@click.option("-k", "k", type=int, default=10, show_default=True, help="words per topic")
@click.option("--json", "as_json", is_flag=True)
def topics_show(model_dir, k: int, as_json: bool) -> None:
    """The top words of every DocNADE topic of a trained model (like the paper's Table 8)."""
    from ..errors import ModelError
    from ..model.bundle import TicketModel

    model = TicketModel.load(model_dir or settings().model)
    words = model.topic_words(k)
    if not words:
        raise ModelError(f"the model at {model_dir or settings().model} has no topic channel T; "
                         "train one with a preset that uses T (e.g. --preset ml_cl_hET)")
    if as_json:
        echo_json([{"id": i, "words": w} for i, w in enumerate(words)])
    else:
        for i, w in enumerate(words):
            click.echo(f"topic {i:3d}: {' '.join(w)}")
