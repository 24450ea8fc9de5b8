"""The `ticketrec` command line: the one composition root (it alone may import web and workers, lazily)."""
from __future__ import annotations

import json
import sys

import click

from .config import Settings
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
    from .store import Store

    return Store(settings().db)


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


# ---------------------------------------------------------------------------------------------
# Knowledge base: import, synth, stats                                         (recommender.importers, .synthetic)
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# BM25 pre-filter: search                                                      (recommender.prefilter)
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Model: train, topics                                                         (recommender.training, topic_models)
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Evaluation: evaluate                                                         (recommender.evaluation)
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Serving: index, reindex, recommend, worker, beat                             (recommender.index, .engine; workers)
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Web: serve, demo                                                             (web)
# ---------------------------------------------------------------------------------------------


if __name__ == "__main__":
    main()
