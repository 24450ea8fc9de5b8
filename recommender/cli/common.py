"""What every command group of the CLI shares: the `ticketrec` group, settings, the store, output."""
from __future__ import annotations

import json
import sys

import click

from ..config import Settings
from ..data.markup import HTML_MODES, HTML_SHARE
from ..errors import TERMINAL_CONTROL, TicketrecError, printable


class _Group(click.Group):
    """Click group that prints project errors as one line (no traceback) and exits 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TicketrecError as exc:
            click.secho(f"error: {printable(str(exc))}", fg="red", err=True)  # it may quote stored text
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
    from ..data.store import Store

    return Store(settings().db)


def echo_json(data) -> None:
    """`data` as indented JSON on stdout (non-ASCII kept as it is). `json.dumps` escapes the C0 controls but writes
    DEL and the C1 ones as they are: those are escaped too (`errors.TERMINAL_CONTROL`), so that JSON printed to a
    terminal cannot drive it either."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    click.echo(TERMINAL_CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


def warn(message: str) -> None:
    """A one-line warning on stderr."""
    click.secho(f"warning: {printable(message)}", fg="yellow", err=True)


#: `--html` of the commands that read a help desk's export (`ticketrec import`, `evaluate --kb`).
html_option = click.option(
    "--html", type=click.Choice(HTML_MODES), default="auto", show_default=True,
    help="read descriptions, solutions and subjects as HTML (the text a browser shows): auto = a field when at least "
         f"{HTML_SHARE:.0%} of its values hold markup (a rich-text export), yes = every value with markup, "
         "no = as written")


def warn_if_not_english(tickets) -> None:
    """One warning when `tickets` (a sample of up to 2,000 is read) do not read as English: BM25's stop words and
    stems and the packaged sentence encoder are English (README, "Languages")."""
    from itertools import islice

    from ..data.records import ticket_text
    from ..lexical.analyzer import ENGLISH_STOP_SHARE, stop_word_share

    sample = list(islice(tickets, 2000))  # not a copy of a million tickets to read two thousand
    share = stop_word_share(ticket_text(t) for t in sample)
    if len(sample) >= 20 and share < ENGLISH_STOP_SHARE:
        warn(f"these tickets do not read as English ({share:.0%} of their words are English stop words; English "
             "tickets have 30-48 %): BM25's stop words and stems and the packaged sentence encoder are English, the "
             "rest learns from the tickets. See README, \"Languages\" (e.g. a multilingual encoder: ticketrec train "
             "--encoder DIR)")


def column_mapping(maps, mapping_file) -> dict | None:
    """The column mapping of `--mapping FILE` and `--map FIELD=COLUMN` (these win); None when neither is given."""
    from ..data.importers import parse_mapping, read_mapping

    if not maps and not mapping_file:
        return None
    mapping = read_mapping(mapping_file) if mapping_file else {}
    mapping.update(parse_mapping(maps))
    return mapping


def one_line(text: str, width: int | None = None) -> str:
    """`text` for a terminal: folded to one line, control characters as spaces (`errors.printable`), cut to `width`
    characters with an ellipsis (None: whole)."""
    flat = " ".join(printable(text).split())
    return flat if width is None or len(flat) <= width else flat[: width - 1].rstrip() + "…"


def when(seconds: float | None) -> str:
    """Seconds since the epoch as UTC time, '-' for none."""
    from datetime import datetime, timezone

    if seconds is None:
        return "-"
    return datetime.fromtimestamp(float(seconds), tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
