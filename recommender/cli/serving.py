"""Serving: `ticketrec index`, `status`, `reindex`, `recommend`, and the Celery `worker` and `beat`."""
from __future__ import annotations

import sys

import click

from ..config import PIN_ALL
from ..errors import TicketrecError
from .common import echo_json, main, one_line, open_store, settings, when


def _build_index_here(model_dir, full: bool, float16: bool | None, workers: int | None = None) -> dict:
    """Build an index version in this process and describe the version that serves afterwards."""
    from ..serving.reindex import reindex as reindex_here

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
    from ..errors import InputError
    from ..serving.index import verify_version

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
    """The serving index version: its model and tickets (and what the next reindex would change), storage, and how
    much of its vectors and postings is in memory now."""
    from ..model.bundle import TicketModel
    from ..serving.index import current_version, open_current
    from ..serving.reindex import model_age, pending_changes

    cfg = settings()
    index = open_current(cfg)  # the version a server would serve (an older good one when CURRENT fails its checks)
    saved = TicketModel.saved_config(cfg.model)  # the served model's record, when TICKETREC_MODEL holds that model
    store = open_store()
    try:
        memory = index.memory()
        pending = pending_changes(cfg, store, index)
        trained = model_age(saved if saved and saved.get("version") == index.model_version else None, store)
    finally:
        index.close()
        store.close()
    info = {"version": index.version, "current": current_version(cfg), "tickets": len(index),
            "dtype": index.manifest.get("dtype", "float32"), "model_version": index.model_version,
            "model_trained": trained, "pending": pending,
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
    click.echo(f"model     {index.model_version[:12]}" + (
        f" (TICKETREC_MODEL holds another, {pending['other_model'][:12]}: the next `ticketrec index` or reindex "
        "serves it)"
        if pending["other_model"] else ""))
    changed = trained["changed_since"]
    if trained["tickets"] is not None or trained["trained_at"] is not None:
        on = f" on {trained['tickets']:,} tickets" if trained["tickets"] is not None else ""
        click.echo(f"trained   {when(trained['trained_at'])}{on}" + (
            "" if changed is None else
            f"; {changed:,} tickets added or changed since (when to retrain: README, \"When to retrain\")" if changed
            else "; no ticket added or changed since"))
    moved = [f"{pending[key]:,} {key}" for key in ("new", "changed", "removed") if pending[key]]
    click.echo(f"tickets   {len(index):,}" + (
        f"; the store has {', '.join(moved)} since this version: `ticketrec reindex` (or the nightly reindex) "
        "brings them in" + (" (removed ones are already left out of results)" if pending["removed"] else "")
        if moved else ", as in the store"))
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
    from ..serving.distributed import REINDEX, send_task

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
@click.option("--where", "where", multiple=True, metavar="CONDITION",
              help="only tickets whose imported field passes: FIELD=V1,V2 (any of them), FIELD!=V1,V2 (none), "
                   "FIELD>=V or FIELD<=V (numbers, ISO dates); repeat it for several, which must all hold")
@click.option("--json", "as_json", is_flag=True, help='print {"results": [...], "info": {...}} as JSON')
def recommend(text: str | None, subject: str, description: str, k: int, index_version: str | None,
              where: tuple[str, ...], as_json: bool) -> None:
    """The k historical tickets most similar to a new one, with their solutions.

    TEXT is the new ticket in one string (its first line the subject, the rest the description); or give
    --subject and --description. The index version answers with the model it was built with. With --where, only
    tickets whose imported columns pass (e.g. --where status=RESOLVED,VERIFIED --where created>=2024-01), each
    scored as without it."""
    from ..data.filters import parse_filter
    from ..data.records import NO_SOLUTION, SAME_TEXT, Query
    from ..errors import InputError
    from ..serving.engine import CHANNEL_LABELS, NO_CHANNEL_SETS_IT_APART, Recommender, share_percentages
    from ..serving.index import open_version

    if text is not None:
        if subject or description:
            raise InputError("give the ticket either as TEXT or with --subject/--description, not both")
        subject, _, description = text.strip().partition("\n")
    ticket_filter = parse_filter(where)
    cfg = settings()
    pinned = open_version(cfg, index_version) if index_version else None
    store = open_store()
    try:
        answer = Recommender(cfg, store=store, index=pinned).recommend(Query(subject, description.strip()), k=k,
                                                                       where=ticket_filter)
    finally:
        store.close()
    info = answer.info
    if as_json:
        echo_json({"results": [r.to_dict() for r in answer.items], "info": info.to_dict()})
        return
    if not answer.items:
        click.echo("no tickets in the index" if ticket_filter is None else f"no ticket passes {ticket_filter}")
    rank_of = {r.ticket.id: r.rank for r in answer.items}
    for r in answer.items:
        t = r.ticket
        click.secho(f"{r.rank:>2}. [{r.score:.2f}] {one_line(t.id)}: {one_line(t.subject)}", bold=True)
        if r.same_text_as is not None:  # a copy: its text and why are those of the result it copies
            click.echo(f"    {SAME_TEXT} result {rank_of[r.same_text_as]} ({one_line(r.same_text_as)})")
            continue
        solution = one_line(t.solution, 300)
        click.echo(f"    solution: {solution or NO_SOLUTION}")
        if not solution and t.description.strip():  # then the description is what tells whether it fits
            click.echo(f"    description: {one_line(t.description, 300)}")
        why = ", ".join(f"{CHANNEL_LABELS.get(c, (c,))[0]} {p} %" for c, p in share_percentages(r.channel_shares))
        click.echo(f"    why: {why or NO_CHANNEL_SETS_IT_APART}")
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
