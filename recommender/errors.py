"""Project exceptions: each carries a message that tells the user what to do."""


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
