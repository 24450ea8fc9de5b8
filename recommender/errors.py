"""Project exceptions: each carries a message that tells the user what to do; and `printable`, for what a message
or a progress line quotes."""
import re

#: Characters a terminal may take for commands: the C0 controls but tab and line breaks, DEL, the C1 controls. An
#: imported export or a file name can carry them (an escape sequence that retitles or clears the terminal, a bell,
#: a NUL); the CLI prints stored text, file names and messages that quote them only through `printable`.
TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with each control character a terminal may act on made a space."""
    return TERMINAL_CONTROL.sub(" ", text or "")


class TicketrecError(Exception):
    """Base class of every error a user can meet; the CLI prints it without a traceback."""


class InputError(TicketrecError):
    """A file, record or query the user gave is malformed."""


class ModelError(TicketrecError):
    """A model artifact is missing, corrupt or of another format version."""


class IndexStateError(TicketrecError):
    """An index version is missing, incomplete or does not match the model."""


class IndexBusyError(IndexStateError):
    """Another index build holds the home's build lock; the same build may be tried again when it has finished."""


class ServiceUnavailable(TicketrecError):
    """A server we depend on (Elasticsearch, Redis/Celery) cannot be reached."""
