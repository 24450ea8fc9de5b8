"""The JSON API under /api/v1: recommendations, tickets (list, read; add, replace, remove), reindex, feedback, health.
JSON in, JSON out, JSON errors.

CSRF tokens are not used here: every write with a body requires `Content-Type: application/json`, which a
cross-site form cannot send without a CORS preflight this app never grants; the one without (POST /reindex) takes
only an API token, which no browser sends by itself. Who may call what (`Authorization: Bearer` API
tokens or the page's session; 401/403): web/auth.py.
"""
from __future__ import annotations

import uuid
from typing import Any, Sequence

from flask import Blueprint, current_app, jsonify, request, url_for
from werkzeug.exceptions import HTTPException

from recommender.errors import IndexBusyError, InputError, TicketrecError
from recommender.data.filters import parse_filter
from recommender.data.importers import ticket_from_json
from recommender.data.markup import holds_markup, html_to_text
from recommender.data.records import MAX_ID_CHARS
from recommender.data.store import Feedback, query_key

from . import auth
from .forms import DEFAULT_PAGE, LABELS, MAX_PAGE, MAX_SUBJECT
from .services import TicketrecServices

bp = Blueprint("api", __name__, url_prefix="/api/v1")

#: Most results one request may ask for.
MAX_K = 100


class ApiError(Exception):
    """An error answered as `{"error": {"status", "message"}}` with its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def services() -> TicketrecServices:
    return current_app.extensions["ticketrec"]


def json_error(status: int, message: str):
    """The one shape of every API error."""
    return jsonify({"error": {"status": status, "message": message}}), status


@bp.errorhandler(ApiError)
def _api_error(exc: ApiError):
    return json_error(exc.status, exc.message)


#: The fields of a recommendation request and of a judgement (`POST /recommendations`, `POST /feedback`).
RECOMMENDATION_FIELDS = ("subject", "description", "k", "html", "where")
FEEDBACK_FIELDS = ("subject", "description", "html", "ticket_id", "label")
#: The query parameters of `GET /tickets`.
TICKET_PAGE_PARAMETERS = ("after", "limit")


def _body(fields: Sequence[str] | None = None) -> dict[str, Any]:
    """The request's JSON object; with `fields`, a field not among them is a 400 that names it (a misspelt
    "descripton" would otherwise be a query without its description, answered as if nothing were wrong)."""
    if not request.is_json:
        raise ApiError(400, "send a JSON object with the header Content-Type: application/json")
    data = request.get_json()  # unreadable JSON: a 400 that says why (web.StrictRequest)
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object, e.g. {\"subject\": \"...\", \"description\": \"...\"}")
    unknown = [name for name in data if name not in fields] if fields is not None else []
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0][:64]!r}; the fields are {', '.join(fields)}")
    return data


def _text(data: dict[str, Any], name: str, limit: int, too_long_status: int = 400, required: bool = True) -> str:
    value = data.get(name)
    if value is None and not required:
        return ""
    if value is None:
        raise ApiError(400, f"'{name}' is required (a non-empty string)")
    if not isinstance(value, str):
        raise ApiError(400, f"'{name}' must be a string, not {type(value).__name__}")
    if len(value) > limit:  # as sent, like the forms and the OpenAPI document's maxLength
        raise ApiError(too_long_status, f"'{name}' has {len(value):,} characters; the limit is {limit:,}; shorten it")
    value = value.strip()
    if not value and required:
        raise ApiError(400, f"'{name}' must not be empty")
    return value


def _query(data: dict[str, Any]) -> tuple[str, str]:
    subject = _text(data, "subject", MAX_SUBJECT)
    description = _text(data, "description", int(current_app.config["MAX_DESCRIPTION"]), too_long_status=413,
                        required=False)  # a subject alone is a valid query
    as_html = data.get("html", False)
    if not isinstance(as_html, bool):
        raise ApiError(400, f"'html' must be true or false, not {type(as_html).__name__}")
    if as_html:  # a rich-text help desk's ticket: its text, as `ticketrec import --html` reads the knowledge base
        subject, description = (html_to_text(v) if holds_markup(v) else v for v in (subject, description))
        if not subject:
            raise ApiError(400, "'subject' holds no text once read as HTML")
    return subject, description


@bp.post("/recommendations")
@auth.require("read")
def recommendations():
    """`{"subject", "description", "k", "html", "where"}` → the top k tickets with calibrated scores and
    explanations."""
    data = _body(RECOMMENDATION_FIELDS)
    subject, description = _query(data)
    k = data.get("k", 10)
    if isinstance(k, bool) or not isinstance(k, int):
        raise ApiError(400, f"'k' must be an integer from 1 to {MAX_K}")
    if not 1 <= k <= MAX_K:
        raise ApiError(400, f"'k' must be from 1 to {MAX_K}, not {k}")
    where = data.get("where", [])
    if not isinstance(where, list) or not all(isinstance(c, str) for c in where):
        raise ApiError(400, "'where' must be a list of conditions such as [\"status=RESOLVED\"]")
    try:
        answer = services().recommend(subject, description, k=k, where=parse_filter(where))
    except InputError as exc:
        raise ApiError(400, str(exc)) from exc
    except TicketrecError as exc:
        raise ApiError(503, f"no recommendations can be served: {exc}") from exc
    services().remember(answer.query, auth.recent_owner())  # the caller's own recent queries, nobody else's
    info = answer.info
    return jsonify({
        "query_key": answer.key,
        "model_version": answer.model_version,
        "index_version": answer.index_version,
        "took_ms": round(answer.took_ms, 2),
        "where": [] if info is None else info.where,  # the filter as the engine read it
        "served": None if info is None else {  # how: pre-filter, scoring (celery | in-process) and why, candidates
            "prefilter": info.prefilter, "mode": info.mode, "fallback_reason": info.fallback_reason,
            "candidates": info.candidates, "timings_ms": {k: round(v * 1000.0, 2) for k, v in info.timings.items()},
        },
        "results": [rec.to_dict() for rec in answer.results],
    })


def _check_ticket_id(ticket_id: str) -> None:
    if len(ticket_id) > MAX_ID_CHARS:
        raise ApiError(400, f"a ticket id has at most {MAX_ID_CHARS} characters, not {len(ticket_id):,}")


@bp.get("/tickets")
@auth.require("read")
def tickets():
    """`?after=ID&limit=N` → the ids of the knowledge base's tickets with their update times, in id order, N per page
    (default 100); `next` is the `after` of the next page, null after the last one. Another parameter is a 400 that
    names it (a misspelt `?limt=500` would otherwise be answered with the default page, as if nothing were wrong)."""
    unknown = [name for name in request.args if name not in TICKET_PAGE_PARAMETERS]
    if unknown:
        raise ApiError(400, f"unknown query parameter {unknown[0][:64]!r}; the parameters are "
                            f"{', '.join(TICKET_PAGE_PARAMETERS)}")
    after = request.args.get("after", "")
    _check_ticket_id(after)
    raw = request.args.get("limit", str(DEFAULT_PAGE))
    # not int() alone: it reads " 5", "+5" and "1_0" too, and refuses more than 4,300 digits with another error
    limit = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 9 else 0
    if not 1 <= limit <= MAX_PAGE:
        raise ApiError(400, f"'limit' must be a whole number from 1 to {MAX_PAGE:,}")
    rows = services().store().ticket_page(after, limit + 1)
    page = rows[:limit]
    return jsonify({"tickets": [{"id": tid, "updated_at": updated} for tid, updated in page],
                    "next": page[-1][0] if len(rows) > limit else None})


@bp.get("/tickets/<path:ticket_id>")
@auth.require("read")
def ticket(ticket_id: str):
    """One ticket of the knowledge base."""
    _check_ticket_id(ticket_id)
    found = services().store().get_ticket(ticket_id)
    if found is None:
        raise ApiError(404, f"there is no ticket {ticket_id!r}")
    return jsonify(found.to_dict())


@bp.put("/tickets/<path:ticket_id>")
@auth.require("tickets")
def put_ticket(ticket_id: str):
    """`{"subject", "description", "solution", "metadata", "html"}` → the ticket `ticket_id` added (201) or replaced
    (200), as an import would write it; served by the next reindex (`"indexed"` says whether it is already)."""
    _check_ticket_id(ticket_id)
    data = _body()
    as_html = data.pop("html", False)
    if not isinstance(as_html, bool):
        raise ApiError(400, f"'html' must be true or false, not {type(as_html).__name__}")
    if data.get("id", ticket_id) != ticket_id:  # a ticket as GET gives it may be sent back whole
        raise ApiError(400, f"the body's 'id' is not the ticket id of the URL ({ticket_id!r}); leave it out")
    data.pop("id", None)
    try:
        new, cut = ticket_from_json(ticket_id, data, html=as_html, settings=services().settings)
        result = services().store().put_ticket(new, source=f"api:{auth.user_name()}")
    except InputError as exc:
        raise ApiError(400, str(exc)) from exc
    body = {"id": new.id, "result": result, "cut": cut, "indexed": services().indexed(new.id),
            "ticket": new.to_dict()}
    if result != "created":
        return jsonify(body)
    return jsonify(body), 201, {"Location": url_for("api.ticket", ticket_id=new.id)}


@bp.delete("/tickets/<path:ticket_id>")
@auth.require("tickets")
def delete_ticket(ticket_id: str):
    """Remove the ticket `ticket_id` with the labelled pairs and feedback that name it; no answer shows it from now."""
    _check_ticket_id(ticket_id)
    try:
        removed = services().store().remove_tickets([ticket_id])
    except InputError as exc:  # the store holds no such ticket: nothing was removed
        raise ApiError(404, f"there is no ticket {ticket_id!r}") from exc
    return jsonify({"id": ticket_id, "removed": removed})


@bp.post("/reindex")
@auth.require("tickets")
def reindex():
    """Bring new and changed tickets into the served index (incremental, as `ticketrec reindex`): built in this
    process when no broker is set (200, the new version), else queued for a worker (202, the task to poll)."""
    try:
        built, body = services().reindex()
    except IndexBusyError as exc:
        raise ApiError(409, "another index build is running; try again when it has finished") from exc
    except TicketrecError as exc:  # no model to build with, an index that does not verify, the broker down
        raise ApiError(503, str(exc)) from exc
    if built:
        return jsonify({"state": "done", "result": body})
    location = url_for("api.reindex_task", task_id=body["task_id"])
    return jsonify({"task_id": body["task_id"], "state": "pending"}), 202, {"Location": location}


@bp.get("/reindex/<task_id>")
@auth.require("tickets")
def reindex_task(task_id: str):
    """The state of a reindex that POST /reindex queued: pending, running, done (with the new version) or failed."""
    try:
        canonical = str(uuid.UUID(task_id)) == task_id.lower()
    except ValueError:
        canonical = False
    if not canonical:
        raise ApiError(404, f"there is no reindex task {task_id[:64]!r}: a task id is the UUID that POST "
                            "/api/v1/reindex answered")
    try:
        body = services().reindex_task(task_id)
    except TicketrecError as exc:
        raise ApiError(503, str(exc)) from exc
    if body is None:
        raise ApiError(404, "no reindex is ever queued here: without TICKETREC_BROKER_URL, POST /api/v1/reindex "
                            "builds in this process and answers when it is done")
    return jsonify(body)


@bp.post("/feedback")
@auth.require("write")
def feedback():
    """`{"subject", "description", "ticket_id", "label"}` → stores the judgement (201)."""
    data = _body(FEEDBACK_FIELDS)
    subject, description = _query(data)
    ticket_id = data.get("ticket_id")
    if not isinstance(ticket_id, str) or not ticket_id:
        raise ApiError(400, "'ticket_id' must be a non-empty string")
    _check_ticket_id(ticket_id)
    label = data.get("label")
    if label not in LABELS:
        raise ApiError(400, f"'label' must be one of {', '.join(LABELS)}")
    store = services().store()
    if store.get_ticket(ticket_id) is None:
        raise ApiError(404, f"there is no ticket {ticket_id!r}")
    model_version, index_version = services().versions()
    try:
        feedback_id = store.add_feedback(Feedback(subject, description, ticket_id, label, model_version, index_version,
                                                  user_name=auth.user_name()))
    except InputError as exc:
        raise ApiError(400, str(exc)) from exc
    return jsonify({"id": feedback_id, "query_key": query_key(subject, description), "ticket_id": ticket_id,
                    "label": label, "model_version": model_version, "index_version": index_version}), 201


@bp.get("/healthz")
def healthz():
    """Store, index and broker state; 200 when queries can be answered, else 503."""
    svc = services()
    try:
        store_state: dict[str, Any] = {"ok": True, **svc.store().stats()}
    except Exception as exc:  # report, do not crash: this is what monitoring reads
        store_state = {"ok": False, "error": str(exc)}
    engine, engine_error = svc.engine_or_error()
    index = svc.index_info() if engine is not None else None
    index_state = {"ok": True, **index} if index is not None else {"ok": False, "error": engine_error or "no index loaded"}
    broker = svc.broker_state()
    ok = store_state["ok"] and index_state["ok"]
    body = {"status": "ok" if ok and broker.get("ok") is not False else ("degraded" if ok else "unavailable"),
            "store": store_state, "index": index_state, "broker": broker}
    return jsonify(body), 200 if ok else 503


@bp.get("/openapi.json")
def openapi():
    """The OpenAPI 3.1 document of this API (web/openapi.py), with this app's description limit."""
    from .openapi import openapi_document

    return jsonify(openapi_document(int(current_app.config["MAX_DESCRIPTION"]), MAX_K))


def handle_http_error(exc: HTTPException):
    """JSON for HTTP errors raised under /api/ (404 of an unknown route, 405, 413 of a huge body, 401...), with the
    error's own headers (Allow of a 405, WWW-Authenticate of a 401)."""
    response, status = json_error(exc.code or 500, exc.description or exc.name)
    for name, value in exc.get_headers():
        if name.lower() != "content-type":
            response.headers[name] = value
    return response, status

