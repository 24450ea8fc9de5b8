"""One ticket sent over the API (PUT /tickets/ID) read by the rules of an import."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ...config import Settings
from ...errors import InputError
from ..markup import holds_markup, html_to_text
from ..records import Ticket
from .parsed import Parsed, import_limits, shown, ticket_field


#: The fields of a ticket sent as a JSON object (`ticket_from_json`).
JSON_TICKET_FIELDS = ("subject", "description", "solution", "metadata")
#: Most metadata fields one ticket sent over the API may carry, and the longest name of one.
MAX_METADATA_FIELDS, MAX_METADATA_NAME = 100, 100
_METADATA_SCALARS = (str, int, float, bool)


@dataclass
class _Request(Parsed):
    """One ticket sent over the API: its errors say what to fix in the request, not in a file, and it remembers
    which fields it cut."""

    cut_fields: list[str] = field(default_factory=list)

    def fail(self, where: str, reason: str, todo: str = "fix the ticket and send it again") -> InputError:
        return InputError(f"{reason}; {todo}")

    def clip(self, kind: str, record_id: str, name: str, value: str) -> str:
        kept = super().clip(kind, record_id, name, value)
        if len(kept) < len(value):
            self.cut_fields.append(name)
        return kept


def _metadata(parsed: Parsed, value: Any) -> dict:
    """A ticket's metadata sent as JSON: an object whose values filters and cards can read (text, numbers,
    true/false, or lists of them); null and empty values are left out, as a mapped import leaves them out."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise parsed.fail("", f"'metadata' must be a JSON object, not {type(value).__name__}")
    if len(value) > MAX_METADATA_FIELDS:
        raise parsed.fail("", f"'metadata' has {len(value):,} fields; a ticket may have at most {MAX_METADATA_FIELDS}")
    kept = {}
    for name, item in value.items():
        if not name.strip() or len(name) > MAX_METADATA_NAME:
            raise parsed.fail("", f"metadata field {shown(name, 40)}: a name has 1 to {MAX_METADATA_NAME} characters")
        items = item if isinstance(item, list) else [item]
        if not all(v is None or isinstance(v, _METADATA_SCALARS) for v in items):
            raise parsed.fail("", f"metadata field {shown(name, 40)} must be text, a number, true/false or a list of "
                                  "them")
        if isinstance(item, list):
            item = [v for v in item if v not in (None, "")]
        if item not in (None, "", []):
            kept[name] = item
    return kept


def ticket_from_json(ticket_id: str, record: Mapping[str, Any], *, html: bool = False,
                     settings: Settings | None = None) -> tuple[Ticket, list[str]]:
    """The ticket `ticket_id` sent as a JSON object of `JSON_TICKET_FIELDS` (the API's PUT /tickets/ID), read by the
    rules of an import: subject required (it may be empty when the description is not), description and solution
    optional (a list of strings joined, as an import joins comments), text beyond the import limits cut.
    `html`: fields that hold markup are read as the text a browser shows. Returns the ticket and the names of the
    fields that were cut; InputError (one line, what to fix) otherwise."""
    parsed = _Request(Path("request"), limits=import_limits(settings))
    unknown = [name for name in record if name not in JSON_TICKET_FIELDS]
    if unknown:
        raise parsed.fail("", f"unknown field {shown(unknown[0], 40)}; a ticket's fields are "
                              f"{', '.join(JSON_TICKET_FIELDS)}")
    fields = {"id": ticket_id, **{name: record.get(name) for name in ("subject", "description", "solution")}}
    if html:
        fields = {name: html_to_text(value) if name != "id" and isinstance(value, str) and holds_markup(value) else value
                  for name, value in fields.items()}
    ticket = ticket_field(parsed, "", fields, _metadata(parsed, record.get("metadata")))
    if ticket.id != ticket_id:
        raise parsed.fail("", f"the ticket id {shown(ticket_id, 40)} begins or ends with white space",
                          "send the id without it")
    return ticket, parsed.cut_fields
