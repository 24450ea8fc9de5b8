"""The OpenAPI 3.1 document of the JSON API under /api/v1, served at `GET /api/v1/openapi.json`.

Built from the constants the API validates with (MAX_SUBJECT, LABELS, the page sizes, records.MAX_ID_CHARS;
api.MAX_K and the configured TICKETREC_MAX_DESCRIPTION are passed in by the route), so it states the limits the code
enforces.
tests/test_openapi.py checks that it describes every route of the blueprint and lets schemathesis test the API from it;
tests/test_auth.py that the 401/403 it states are the ones answered.
"""
from __future__ import annotations

import functools
import sys
from typing import Any

from recommender.data.filters import MAX_CONDITION_CHARS, MAX_CONDITIONS
from recommender.data.importers import MAX_METADATA_FIELDS, MAX_METADATA_NAME
from recommender.data.records import MAX_ID_CHARS
from recommender.model.siamese import CHANNELS

from .forms import DEFAULT_PAGE, LABELS, MAX_PAGE, MAX_SUBJECT

#: Version of this document (the API's path carries its major version: /api/v1).
API_VERSION = "1.0.0"


@functools.cache
def _not_blank_pattern() -> str:
    """A regex matching any character Python's `str.strip()` keeps: a text is blank to the API when it has none."""
    blank = [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    ranges: list[list[int]] = []
    for c in blank:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    parts = "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges)
    return f"[^{parts}]"


def _json(schema: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}


def _ok(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": _json(schema)}


def _error(description: str) -> dict[str, Any]:
    return _ok(description, "Error")


def _json_body(schema: str) -> dict[str, Any]:
    return {"required": True, "content": _json(schema)}


def _query_properties(max_description: int) -> dict[str, Any]:
    return {
        "subject": {"type": "string", "minLength": 1, "maxLength": MAX_SUBJECT, "pattern": _not_blank_pattern(),
                    "description": f"The new ticket's SUBJECT: a few words, at most {MAX_SUBJECT:,} characters; "
                                   "one of only whitespace is refused (400)."},
        "description": {"type": ["string", "null"], "maxLength": max_description, "default": "",
                        "description": f"Its DESCRIPTION (optional: a subject alone is a valid query); over "
                                       f"{max_description:,} characters (TICKETREC_MAX_DESCRIPTION) is refused "
                                       "with 413."},
        "html": {"type": "boolean", "default": False,
                 "description": "true: the subject and description are HTML (a rich-text help desk's ticket) and are "
                                "read as the text a browser shows, as `ticketrec import --html` reads the tickets; "
                                "a subject with no text once read is refused (400)."},
    }


_MALFORMED = _error("Bad input: not a JSON object, a missing or blank field, a wrong type or value.")
_TOO_LARGE = _error("The description, or the whole body, is over the configured limit.")
_UNEXPECTED = _error("An unexpected failure (logged on the server; the message holds no details).")
_UNAUTHORIZED = {**_error("No credentials where the app requires them (once an account exists; for reading as "
                          "TICKETREC_AUTH_READ says), or an unknown or revoked API token."),
                 "headers": {"WWW-Authenticate": {"description": "`Bearer realm=ticketrec`, with "
                                                                "`error=invalid_token` for a bad token.",
                                                 "schema": {"type": "string"}}}}
_FORBIDDEN = _error("The API token may only read (created with `ticketrec token create USER --read-only`).")
_TICKETS_UNAUTHORIZED = {**_UNAUTHORIZED, "description": "No API token, or an unknown or revoked one: changing the "
                                                         "knowledge base always needs one, accounts or not."}
_TICKETS_FORBIDDEN = _error("The API token is not of scope tickets (`ticketrec token create USER --tickets`), or the "
                            "request came from a signed-in session.")

#: How a request says who it is; none is needed while the store has no account (the empty requirement `{}`).
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer",
               "description": "An API token of an engineer's account: `ticketrec token create USER` prints it once."},
    "session": {"type": "apiKey", "in": "cookie", "name": "session",
                "description": "The web page's signed-in session (the page's own scripts use it)."},
}


def openapi_document(max_description: int, max_k: int) -> dict[str, Any]:
    """The OpenAPI 3.1 document of /api/v1 for an app whose descriptions may have `max_description` characters and
    whose requests may ask for `max_k` results (api.MAX_K; passed in, as api.py imports this module)."""
    nullable_string = {"type": ["string", "null"]}
    ticket_id = [{"name": "ticket_id", "in": "path", "required": True,
                  "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
                  "description": "The ticket's id (it may contain slashes)."}]
    schemas: dict[str, Any] = {
        "Error": {
            "type": "object", "required": ["error"], "additionalProperties": False,
            "description": "The one shape of every API error.",
            "properties": {"error": {
                "type": "object", "required": ["status", "message"], "additionalProperties": False,
                "properties": {"status": {"type": "integer", "minimum": 400, "maximum": 599},
                               "message": {"type": "string", "minLength": 1}},
            }},
        },
        "RecommendationRequest": {
            "type": "object", "required": ["subject"], "additionalProperties": False,
            "properties": {
                **_query_properties(max_description),
                "k": {"type": "integer", "minimum": 1, "maximum": max_k, "default": 10,
                      "description": f"How many tickets to return (1 to {max_k})."},
                "where": {"type": "array", "maxItems": MAX_CONDITIONS, "default": [],
                          "items": {"type": "string", "minLength": 1, "maxLength": MAX_CONDITION_CHARS},
                          "description": "Only tickets whose imported metadata passes every condition: `FIELD=V1,V2` "
                                         "(any of the values), `FIELD!=V1,V2` (none of them), `FIELD>=V`, "
                                         "`FIELD<=V` (numbers, ISO dates); names and = values ignore case, `\\,` "
                                         "is a comma in a value. Each result scores as it would without it. A "
                                         "malformed condition, a field no ticket has or an = value none holds is "
                                         "refused (400)."},
            },
        },
        "FeedbackRequest": {
            "type": "object", "required": ["subject", "ticket_id", "label"], "additionalProperties": False,
            "properties": {
                **_query_properties(max_description),
                "ticket_id": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS,
                              "description": "The judged result's ticket id."},
                "label": {"$ref": "#/components/schemas/Label"},
            },
        },
        "Label": {"type": "string", "enum": list(LABELS),
                  "description": "YES: it solves the query; REL: related; NO: not relevant."},
        "Ticket": {
            "type": "object", "required": ["id", "subject", "description", "solution", "metadata"],
            "additionalProperties": False,
            "properties": {**{name: {"type": "string"} for name in ("id", "subject", "description", "solution")},
                           "metadata": {"type": "object",
                                        "description": "Whatever the import carried besides the text (the "
                                                       "columns a filter reads: `where`)."}},
        },
        "TicketWrite": {
            "type": "object", "required": ["subject"], "additionalProperties": False,
            "description": "A ticket as `ticketrec import` reads a ticket record: text beyond the import limits "
                           "(TICKETREC_MAX_SUBJECT_CHARS, TICKETREC_MAX_FIELD_CHARS) is cut and the answer's `cut` "
                           "names the fields; a ticket with neither subject nor description text is refused (400).",
            "properties": {
                "id": {"type": "string", "description": "May be left out; when sent, the id of the URL."},
                "subject": {"type": "string"},
                **{name: {"type": ["string", "array", "null"], "items": nullable_string,
                          "description": f"The {name.upper()} (optional); a list of texts is joined, a blank line "
                                         "between them (e.g. comments)."} for name in ("description", "solution")},
                "metadata": {"type": ["object", "null"], "maxProperties": MAX_METADATA_FIELDS,
                             "propertyNames": {"minLength": 1, "maxLength": MAX_METADATA_NAME,
                                               "pattern": _not_blank_pattern()},
                             "additionalProperties": {"type": ["string", "number", "boolean", "null", "array"],
                                                      "items": {"type": ["string", "number", "boolean", "null"]}},
                             "description": "The ticket's other fields (status, resolution, dates): what cards show "
                                            "and `where` filters read; null and empty values are left out."},
                "html": {"type": "boolean", "default": False,
                         "description": "true: the texts that hold markup are read as the text a browser shows."},
            },
        },
        "TicketWritten": {
            "type": "object", "required": ["id", "result", "cut", "indexed", "ticket"], "additionalProperties": False,
            "properties": {
                "id": {"type": "string"},
                "result": {"type": "string", "enum": ["created", "replaced", "unchanged"],
                           "description": "unchanged: the store held exactly this ticket already (it stays as it was)."},
                "cut": {"type": "array", "items": {"type": "string", "enum": ["subject", "description", "solution"]},
                        "description": "The fields cut to the import limits."},
                "indexed": {"type": ["boolean", "null"],
                            "description": "Whether the served index holds the ticket as stored now; false until the "
                                           "next reindex (nightly, or `ticketrec reindex`) after a change; null when "
                                           "no index is served."},
                "ticket": {"$ref": "#/components/schemas/Ticket"},
            },
        },
        "TicketList": {
            "type": "object", "required": ["tickets", "next"], "additionalProperties": False,
            "properties": {
                "tickets": {"type": "array", "maxItems": MAX_PAGE, "items": {
                    "type": "object", "required": ["id", "updated_at"], "additionalProperties": False,
                    "properties": {"id": {"type": "string"},
                                   "updated_at": {"type": "number", "description": "When it was last added or "
                                                                                 "changed: seconds since 1970."}}}},
                "next": {"type": ["string", "null"],
                         "description": "The `after` of the next page; null when this page is the last."},
            },
        },
        "TicketRemoved": {
            "type": "object", "required": ["id", "removed"], "additionalProperties": False,
            "properties": {
                "id": {"type": "string"},
                "removed": {"type": "object", "required": ["tickets", "pairs", "feedback"], "additionalProperties": False,
                            "description": "What went with it: the ticket, the labelled pairs and the feedback that "
                                           "named it.",
                            "properties": {n: {"type": "integer", "minimum": 0} for n in ("tickets", "pairs", "feedback")}},
            },
        },
        "Reindexed": {
            "type": "object", "additionalProperties": False,
            "required": ["version", "n_tickets", "encoded", "reused", "dtype", "model_version", "seconds"],
            "description": "The index version that serves after the reindex (the one before when nothing changed).",
            "properties": {
                "version": {"type": "string"}, "n_tickets": {"type": "integer", "minimum": 0},
                "encoded": {"type": ["integer", "null"], "minimum": 0,
                            "description": "Tickets the version encoded when it was built: new or changed ones."},
                "reused": {"type": ["integer", "null"], "minimum": 0,
                           "description": "Tickets copied from the version before, unchanged."},
                "dtype": {"type": ["string", "null"]}, "model_version": nullable_string,
                "seconds": {"type": "number", "minimum": 0},
                "built": {"type": "boolean", "description": "Built in this process (no broker): whether a new "
                                                            "version was built (false: nothing had changed)."},
            },
        },
        "ReindexState": {
            "type": "object", "additionalProperties": False, "required": ["state"],
            "properties": {
                "task_id": {"type": "string", "format": "uuid",
                            "description": "The queued reindex (with a broker): GET /reindex/{task_id}."},
                "state": {"type": "string", "enum": ["pending", "running", "done", "failed"],
                          "description": "pending: queued, or an id the broker's result backend does not hold "
                                         "(results are kept an hour); done: `result` holds the new version; failed: "
                                         "`error` says why."},
                "result": {"$ref": "#/components/schemas/Reindexed"},
                "error": {"type": "string"},
            },
        },
        "Recommendation": {
            "type": "object", "additionalProperties": False,
            "required": ["rank", "score", "raw_score", "bm25", "shared_terms", "topics", "channel_shares",
                         "same_text_as", "ticket"],
            "properties": {
                "rank": {"type": "integer", "minimum": 1, "maximum": max_k},
                "score": {"type": "number", "minimum": 1, "maximum": 5, "description": "Calibrated score, 1 to 5."},
                "raw_score": {"type": "number", "minimum": 0, "maximum": 1,
                              "description": "The model's similarity g = exp(-d), in (0, 1]."},
                "bm25": {"type": ["number", "null"], "description": "BM25 of the ticket for the query, when weighed."},
                "shared_terms": {"type": "array", "items": {"type": "string"},
                                 "description": "Words of the query the ticket holds too, as BM25 matches them "
                                                "(by stem), that tell tickets apart (in fewer than half of them), "
                                                "rarest first; each stem once, in the query's form."},
                "topics": {"type": "array", "items": {
                    "type": "object", "required": ["id", "weight", "words"], "additionalProperties": False,
                    "properties": {"id": {"type": "integer", "minimum": 0}, "weight": {"type": "number"},
                                   "words": {"type": "array", "items": {"type": "string"}}},
                }},
                "channel_shares": {
                    "type": "object", "additionalProperties": False,
                    "description": "Each weighted channel's share of the score (sum 1, or all 0).",
                    "properties": {channel: {"type": "number", "minimum": 0, "maximum": 1}
                                   for channel in (*CHANNELS, "bm25")},
                },
                "same_text_as": {"type": ["string", "null"],
                                 "description": "The id of a higher result of this answer whose subject, description "
                                                "and solution read the same (white space and case aside): this "
                                                "ticket is a copy of it. null for the first of its text."},
                "ticket": {"$ref": "#/components/schemas/Ticket"},
            },
        },
        "Recommendations": {
            "type": "object", "additionalProperties": False,
            "required": ["query_key", "model_version", "index_version", "took_ms", "served", "where", "results"],
            "properties": {
                "query_key": {"type": "string"},
                "where": {"type": "array", "items": {"type": "string"},
                          "description": "The conditions the results passed, as read (names and = values folded)."},
                "model_version": {"type": "string"},
                "index_version": {"type": "string"},
                "took_ms": {"type": "number", "minimum": 0},
                "served": {
                    "type": ["object", "null"], "additionalProperties": False,
                    "required": ["prefilter", "mode", "fallback_reason", "candidates", "timings_ms"],
                    "description": "How the answer was made.",
                    "properties": {
                        "prefilter": {"type": "string", "enum": ["index", "topics", "fts5", "elasticsearch", "none"]},
                        "mode": {"type": "string", "enum": ["in-process", "celery"]},
                        "fallback_reason": nullable_string,
                        "candidates": {"type": ["integer", "null"], "minimum": 0,
                                       "description": "Candidates scored; null: every ticket of the index."},
                        "timings_ms": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}},
                    },
                },
                "results": {"type": "array", "maxItems": max_k,
                            "items": {"$ref": "#/components/schemas/Recommendation"}},
            },
        },
        "FeedbackStored": {
            "type": "object", "additionalProperties": False,
            "required": ["id", "query_key", "ticket_id", "label", "model_version", "index_version"],
            "properties": {"id": {"type": "integer"}, "query_key": {"type": "string"}, "ticket_id": {"type": "string"},
                           "label": {"$ref": "#/components/schemas/Label"},
                           "model_version": {"type": "string", "description": "Empty when no model is served."},
                           "index_version": {"type": "string", "description": "Empty when no index is served."}},
        },
        "Health": {
            "type": "object", "additionalProperties": False, "required": ["status", "store", "index", "broker"],
            "properties": {
                "status": {"type": "string", "enum": ["ok", "degraded", "unavailable"]},
                "store": {"oneOf": [
                    {"type": "object", "required": ["ok", "tickets", "queries", "pairs", "feedback"],
                     "additionalProperties": False,
                     "properties": {"ok": {"const": True}, **{n: {"type": "integer", "minimum": 0}
                                                              for n in ("tickets", "queries", "pairs", "feedback")}}},
                    {"$ref": "#/components/schemas/Failed"},
                ]},
                "index": {"oneOf": [
                    {"type": "object", "required": ["ok", "version", "size", "created", "model_version"],
                     "additionalProperties": False,
                     "properties": {"ok": {"const": True}, "version": {"type": "string"},
                                    "size": {"type": "integer", "minimum": 0}, "created": {"type": ["number", "null"]},
                                    "model_version": nullable_string,
                                    "warning": {"type": "string", "description": "A newer version failed its "
                                                "integrity checks and is skipped; this one serves."}}},
                    {"$ref": "#/components/schemas/Failed"},
                ]},
                "broker": {
                    "type": "object", "required": ["mode", "ok", "workers"], "additionalProperties": False,
                    "properties": {"mode": {"type": "string", "enum": ["in-process", "celery"]},
                                   "ok": {"type": ["boolean", "null"]},
                                   "workers": {"type": "array", "items": {"type": "string"}},
                                   "detail": {"type": "string"}},
                },
            },
        },
        "Failed": {
            "type": "object", "required": ["ok", "error"], "additionalProperties": False,
            "properties": {"ok": {"const": False}, "error": {"type": "string"}},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ticketrec JSON API", "version": API_VERSION,
            "description": "Similar historical support tickets for a new one, feedback on them, the knowledge base's "
                           "tickets and their reindex, and service health. "
                           "Every error is `{\"error\": {\"status\", \"message\"}}` with its HTTP status; "
                           "writes with a body require `Content-Type: application/json`. Once the store has an "
                           "account, feedback needs an API token (`Authorization: Bearer …`) or a signed-in session, "
                           "and so does reading unless TICKETREC_AUTH_READ=open; with no account everything is "
                           "open but adding, replacing and removing tickets and reindexing, which always need an "
                           "API token of scope tickets.",
        },
        "security": [{"bearer": []}, {"session": []}, {}],
        "servers": [{"url": "/api/v1"}],
        "paths": {
            "/recommendations": {"post": {
                "operationId": "recommend", "summary": "The top k historical tickets for a new one.",
                "requestBody": _json_body("RecommendationRequest"),
                "responses": {
                    "200": _ok("The results, best first, with calibrated scores and why each was chosen.",
                               "Recommendations"),
                    "400": _MALFORMED, "401": _UNAUTHORIZED, "413": _TOO_LARGE, "500": _UNEXPECTED,
                    "503": _error("No model or index can be loaded: nothing to recommend from yet."),
                },
            }},
            "/tickets": {"get": {
                "operationId": "listTickets",
                "summary": "The knowledge base's ticket ids with their update times, in id order, a page at a time: "
                           "what an integration compares with its own tickets.",
                "parameters": [
                    {"name": "after", "in": "query", "required": False,
                     "schema": {"type": "string", "maxLength": MAX_ID_CHARS, "default": ""},
                     "description": "List the ids that sort after this one (byte order): the `next` of the page "
                                    "before."},
                    {"name": "limit", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE},
                     "description": f"Ids on this page (1 to {MAX_PAGE:,})."},
                ],
                "responses": {"200": _ok("One page of ids.", "TicketList"),
                              "400": _error(f"A limit that is not 1 to {MAX_PAGE:,}, an `after` over "
                                            f"{MAX_ID_CHARS} characters, or another query parameter."),
                              "401": _UNAUTHORIZED, "500": _UNEXPECTED},
            }},
            "/tickets/{ticket_id}": {
                "get": {
                    "operationId": "getTicket", "summary": "One ticket of the knowledge base.",
                    "parameters": ticket_id,
                    "responses": {"200": _ok("The ticket.", "Ticket"),
                                  "400": _error(f"The id is over {MAX_ID_CHARS} characters."), "401": _UNAUTHORIZED,
                                  "404": _error("There is no such ticket."), "500": _UNEXPECTED},
                },
                "put": {
                    "operationId": "putTicket", "security": [{"bearer": []}], "parameters": ticket_id,
                    "summary": "Add the ticket, or replace the one of this id (a help desk's integration keeping the "
                               "knowledge base current). Served after the next reindex.",
                    "requestBody": _json_body("TicketWrite"),
                    "responses": {
                        "200": _ok("Replaced, or unchanged.", "TicketWritten"),
                        "201": {**_ok("Added.", "TicketWritten"),
                                "headers": {"Location": {"description": "The ticket's URL.",
                                                         "schema": {"type": "string"}}}},
                        "400": _MALFORMED, "401": _TICKETS_UNAUTHORIZED, "403": _TICKETS_FORBIDDEN,
                        "413": _TOO_LARGE, "500": _UNEXPECTED,
                    },
                },
                "delete": {
                    "operationId": "deleteTicket", "security": [{"bearer": []}], "parameters": ticket_id,
                    "summary": "Remove the ticket, with the labelled pairs and feedback that name it; no answer "
                               "shows it from then on.",
                    "responses": {
                        "200": _ok("Removed.", "TicketRemoved"),
                        "400": _error(f"The id is over {MAX_ID_CHARS} characters."), "401": _TICKETS_UNAUTHORIZED,
                        "403": _TICKETS_FORBIDDEN, "404": _error("There is no such ticket."), "500": _UNEXPECTED,
                    },
                },
            },
            "/reindex": {"post": {
                "operationId": "reindex", "security": [{"bearer": []}],
                "summary": "Bring new and changed tickets into the served index (incremental, as `ticketrec "
                           "reindex`): built in this process when no broker is set, else queued for a Celery worker.",
                "responses": {
                    "200": _ok("Built here: state done, with the version that serves now.", "ReindexState"),
                    "202": {**_ok("Queued for a worker: state pending, with the task's id.", "ReindexState"),
                            "headers": {"Location": {"description": "Where to follow it: /reindex/{task_id}.",
                                                     "schema": {"type": "string"}}}},
                    "401": _TICKETS_UNAUTHORIZED, "403": _TICKETS_FORBIDDEN,
                    "409": _error("Another index build is running (a nightly reindex, `ticketrec index`); try "
                                  "again when it has finished."),
                    "500": _UNEXPECTED,
                    "503": _error("Nothing to build with (no model), or the broker cannot be reached."),
                },
            }},
            "/reindex/{task_id}": {"get": {
                "operationId": "reindexState", "security": [{"bearer": []}],
                "summary": "The state of a reindex queued by POST /reindex.",
                "parameters": [{"name": "task_id", "in": "path", "required": True,
                                "schema": {"type": "string", "format": "uuid"},
                                "description": "The task's id, as POST /reindex answered it."}],
                "responses": {
                    "200": _ok("Its state; its result once done.", "ReindexState"),
                    "401": _TICKETS_UNAUTHORIZED, "403": _TICKETS_FORBIDDEN,
                    "404": _error("Not a task id, or no broker is set (then nothing is ever queued)."),
                    "500": _UNEXPECTED, "503": _error("The broker's result backend cannot be read."),
                },
            }},
            "/feedback": {"post": {
                "operationId": "addFeedback", "summary": "Store an engineer's judgement of one result of a query.",
                "requestBody": _json_body("FeedbackRequest"),
                "responses": {
                    "201": _ok("Stored, with the model and index versions being served.", "FeedbackStored"),
                    "400": _MALFORMED, "401": _UNAUTHORIZED, "403": _FORBIDDEN,
                    "404": _error("There is no ticket with this ticket_id."), "413": _TOO_LARGE, "500": _UNEXPECTED,
                },
            }},
            "/healthz": {"get": {
                "operationId": "health", "summary": "Store, index and broker state.", "security": [],
                "responses": {"200": _ok("Queries can be answered (status ok, or degraded when the broker is down).",
                                         "Health"),
                              "503": _ok("Queries cannot be answered: the store or the index is missing.", "Health"),
                              "500": _UNEXPECTED},
            }},
            "/openapi.json": {"get": {
                "operationId": "openapi", "summary": "This document.", "security": [],
                "responses": {"200": {"description": "The OpenAPI document.",
                                      "content": {"application/json": {"schema": {"type": "object",
                                                                                  "required": ["openapi", "paths"]}}}}},
            }},
        },
        "components": {"schemas": schemas, "securitySchemes": SECURITY_SCHEMES},
    }
