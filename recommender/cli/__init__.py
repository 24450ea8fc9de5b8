"""The `ticketrec` command line: the one composition root (it alone may import web and workers, lazily).

One module per command group; importing them registers their commands on `main`."""
from . import accounts, evaluation, knowledge_base, serving, topics, training, ui  # noqa: F401  (registers commands)
from .common import main

__all__ = ["main"]
