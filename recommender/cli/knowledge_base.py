"""Knowledge base and BM25 search: `ticketrec import`, `export`, `remove`, `synth`, `stats`, `search`,
`prefilter-index`."""
from __future__ import annotations

import click

from ..errors import TicketrecError
from .common import (column_mapping, echo_json, html_option, main, one_line, open_store, settings, warn,
                     warn_if_not_english)


@main.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["auto", "jsonl", "csv", "xlsx", "semeval"]), default="auto",
              show_default=True, help="file format; auto picks it from the extension (.jsonl/.json, .csv/.tsv, .xlsx, .xml)")
@click.option("--map", "maps", multiple=True, metavar="FIELD=COLUMN",
              help='read a help desk export of tickets: FIELD (id, subject, description, solution) from COLUMN, '
                   'e.g. --map id="Issue id" --map subject=Summary; repeat per field')
@click.option("--mapping", "mapping_file", type=click.Path(dir_okay=False), default=None,
              help="the same mapping in a file: a JSON object or FIELD=COLUMN lines (--map entries override it)")
@html_option
@click.option("--prune", is_flag=True,
              help="the files are the whole knowledge base (a help desk's full export, synced nightly): remove the "
                   "stored tickets they do not hold, in the same transaction (asks first; --yes)")
@click.option("--yes", is_flag=True, help="with --prune: remove without asking (scripts, cron)")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def import_(files, fmt: str, maps, mapping_file, html: str, prune: bool, yes: bool, quiet: bool) -> None:
    """Import tickets, queries and labelled pairs from FILE... in one transaction (all or nothing)."""
    from ..data.importers import load_many

    mapping = column_mapping(maps, mapping_file)
    with open_store() as store:
        known_queries = [q.id for q in store.queries()]
        stored = store.ticket_ids()
        data = load_many(list(files), fmt, progress=not quiet, known_ticket_ids=stored,
                         known_query_ids=known_queries, mapping=mapping, warn=warn, html=html)
        if prune:
            imported = {t.id for t in data.tickets}
            stale = [tid for tid in stored if tid not in imported]
            if stale:
                _confirm(f"--prune removes {_count(len(stale), 'ticket')} that the files do not hold "
                         f"({_first(stale)}) from {store.path}", yes)
        if not quiet:
            judged = f", {len(data.feedback)} feedback judgements" if data.feedback else ""
            click.echo(f"writing {len(data.tickets)} tickets, {len(data.queries)} queries, "
                       f"{len(data.pairs)} pairs{judged} to {store.path} ...", err=True)
        counts = store.import_dataset(data, prune=prune)
        total = store.stats()
    warn_if_not_english(data.tickets)
    _note_copies(data.tickets)
    pruned = (f"; removed {_count(counts['removed'], 'ticket')} the files do not hold (with "
              f"{_count(counts['removed_pairs'], 'labelled pair')}, "
              f"{_count(counts['removed_feedback'], 'feedback judgement')})" if prune else "")
    judgements = f", {_count(counts['feedback'], 'feedback judgement')}" if data.feedback else ""
    if counts["feedback"] < len(data.feedback):
        judgements += f" (of {len(data.feedback):,}; the others were stored already)"
    click.echo(f"imported {_count(counts['tickets'], 'ticket')}, {_count(counts['queries'], 'query', 'queries')}, "
               f"{_count(counts['pairs'], 'labelled pair')}{judgements}{pruned}; the knowledge base now holds "
               f"{_count(total['tickets'], 'ticket')}, {_count(total['queries'], 'query', 'queries')}, "
               f"{_count(total['pairs'], 'pair')}")


@main.command()
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--feedback/--no-feedback", default=True, show_default=True,
              help="write the engineers' feedback too (who gave each judgement, when, on which model and index)")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def export(out: str, feedback: bool, quiet: bool) -> None:
    """Write the knowledge base to OUT as JSONL: tickets with their metadata, queries, labelled pairs and feedback,
    from one snapshot; `ticketrec import OUT --html no` reads it back as it was stored (a backup, or a move to
    another machine). Accounts and API tokens are never written."""
    from ..data.exporters import EXPORTED, export_jsonl

    with open_store() as store:
        counts = export_jsonl(store, out, feedback=feedback, progress=not quiet)
    nouns = {"tickets": ("ticket", None), "queries": ("query", "queries"), "pairs": ("labelled pair", None),
             "feedback": ("feedback judgement", None)}
    click.echo(f"wrote {', '.join(_count(counts[kind], *nouns[kind]) for kind in EXPORTED.values())} to {out}; "
               f"`ticketrec import {out} --html no` reads it back as it was stored")


def _confirm(action: str, yes: bool) -> None:
    """Go on when `yes`, or when someone at a terminal says so; an InputError when no one can (no terminal)."""
    import sys

    from ..errors import InputError

    if yes:
        return
    if not sys.stdin.isatty():
        raise InputError(f"{action}, which cannot be undone, and no one can confirm it here; add --yes (nothing "
                         "was changed)")
    click.confirm(f"{action}?", abort=True)


@main.command()
@click.argument("ids", nargs=-1)
@click.option("--ids-file", type=click.Path(dir_okay=False), default=None,
              help="a file of ticket ids to remove, one per line (blank lines and lines starting with # skipped)")
@click.option("--yes", is_flag=True, help="remove without asking (needed when no one can answer: scripts, cron)")
def remove(ids, ids_file, yes: bool) -> None:
    """Remove tickets from the knowledge base, with the labelled pairs and feedback that name them (all or nothing).

    Results leave them out at once; the next reindex drops them from the served index."""
    from ..errors import InputError

    wanted = list(ids)
    if ids_file:
        try:
            lines = open(ids_file, encoding="utf-8").read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read {ids_file}: {getattr(exc, 'strerror', None) or exc}; give a UTF-8 text "
                             "file of ticket ids, one per line") from exc
        wanted += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    wanted = list(dict.fromkeys(wanted))
    if not wanted:
        raise InputError("name the tickets to remove: ticketrec remove ID... or --ids-file FILE")
    with open_store() as store:
        _confirm(f"removing {_count(len(wanted), 'ticket')} ({_first(wanted)}) and the pairs and feedback that name "
                 f"them from {store.path}", yes)
        counts = store.remove_tickets(wanted)
        left = store.stats()["tickets"]
    click.echo(f"removed {_count(counts['tickets'], 'ticket')}, {_count(counts['pairs'], 'labelled pair')}, "
               f"{_count(counts['feedback'], 'feedback judgement')}; the knowledge base now holds "
               f"{_count(left, 'ticket')}. Results leave them out from now on; `ticketrec reindex` (or the nightly "
               "reindex) drops them from the served index")


def _first(ids: list[str], n: int = 3) -> str:
    """The first `n` of `ids`, and ", ..." when there are more (a confirmation names what it is about)."""
    return ", ".join(ids[:n]) + (", ..." if len(ids) > n else "")


def _note_copies(tickets) -> None:
    """One line when some of `tickets` read the same as another of them under another id (`Ticket.text_key`): the
    results name the first of such copies instead of showing its text again."""
    from collections import Counter

    groups = Counter(hash(t.text_key()) for t in tickets)  # hashes: no second copy of a large export's texts
    sizes = [n for n in groups.values() if n > 1]
    if sizes:
        click.echo(f"note: {_count(sum(sizes), 'ticket')} read the same as another under another id "
                   f"({_count(len(sizes), 'group')} of the same subject, description and solution, white space and "
                   "case aside); results show such a copy as one line naming the first", err=True)


def _count(n: int, noun: str, plural: str | None = None) -> str:
    """"1 ticket", "2 tickets" (`plural`: a noun's irregular plural)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


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
    from ..data.store import Dataset
    from ..data.synthetic import generate, write_jsonl

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


@main.command()
@click.argument("text")
@click.option("-k", "k", default=10, show_default=True, type=click.IntRange(1, 100_000),
              help="How many tickets to show.")
@click.option("--json", "as_json", is_flag=True, help="Print the hits as JSON.")
def search(text: str, k: int, as_json: bool) -> None:
    """BM25 candidates for TEXT: rank, score, ticket id, subject and a solution snippet (no model needed)."""
    from ..data.records import NO_SOLUTION, check_text
    from ..errors import IndexStateError
    from ..lexical.searchers import Fts5Searcher
    from ..serving.searchers import make_searcher

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
        click.echo(f"{rank:>4}  {score:7.3f}  {one_line(ticket.id, 14):<14}  {one_line(ticket.subject, 70)}")
        click.echo(f"{'':>4}  {'':>7}  {'':<14}  → {one_line(ticket.solution, 90) or NO_SOLUTION}")


@main.command("prefilter-index")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def prefilter_index(quiet: bool) -> None:
    """Rebuild the BM25 pre-filter index from the store (Elasticsearch: fresh index, then atomic alias swap;
    FTS5: re-derive tickets_fts, which the store otherwise keeps in sync by itself)."""
    from ..serving.searchers import make_searcher

    with open_store() as store:
        prefilter = make_searcher(settings(), store)
        n = prefilter.rebuild(store.iter_tickets(), progress=not quiet)
    click.echo(f"{prefilter.name}: {n} tickets indexed")
