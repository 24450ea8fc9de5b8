"""The `ticketrec` command line: the one composition root (it alone may import web and workers, lazily).

One module per command group; importing them registers their commands on `main`."""
import os
import sys

#: Seconds between two redraws of a progress bar when stderr is not a terminal (a log file, CI, a nightly job):
#: a heartbeat per bar, not a line per batch. tqdm reads its TQDM_* defaults once, when it is first imported, so this
#: comes before the command groups import it; a TQDM_MININTERVAL the user set wins.
LOG_PROGRESS_INTERVAL = 30

if not sys.stderr.isatty():
    os.environ.setdefault("TQDM_MININTERVAL", str(LOG_PROGRESS_INTERVAL))

from . import accounts, evaluation, knowledge_base, serving, topics, training, ui  # noqa: F401  (registers commands)
from .common import main

__all__ = ["main"]
