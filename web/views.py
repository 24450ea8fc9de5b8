"""The support engineer's pages: search and results, feedback, ticket, status, topics, sign in and out."""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Sequence

from flask import Blueprint, abort, current_app, flash, redirect, render_template, request, send_from_directory, url_for
from markupsafe import Markup

from recommender.errors import InputError, TicketrecError
from recommender.data.filters import TicketFilter
from recommender.data.records import NO_SOLUTION, SAME_TEXT, Recommendation
from recommender.data.store import Feedback
from recommender.serving.engine import CHANNEL_LABELS, NO_CHANNEL_SETS_IT_APART, share_percentages

from . import auth
from .forms import FeedbackForm, LoginForm, SearchForm
from .highlight import highlight
from .services import RecommendResult, TicketrecServices

bp = Blueprint("views", __name__)
log = logging.getLogger(__name__)


def services() -> TicketrecServices:
    return current_app.extensions["ticketrec"]


@dataclass
class ResultCard:
    """One recommendation prepared for the results template (highlighted markup is escaped already)."""

    rank: int
    ticket_id: str
    score: float
    score_text: str
    solution: Markup
    subject: Markup
    description: Markup
    topics: list[dict[str, Any]]
    shared: list[str]
    given: str | None
    #: Why it was chosen: [{"channel", "label", "title", "percent", "x"}] (x = where its segment of the bar
    #: starts), largest share first; empty when no channel sets it apart from the typical candidate.
    why: list[dict[str, Any]] = field(default_factory=list)
    #: (column, value) of the ticket's metadata that TICKETREC_CARD_FIELDS names (status, resolution, dates, ...).
    facts: list[tuple[str, str]] = field(default_factory=list)
    #: (rank, ticket id) of the higher result this one copies (`Recommendation.same_text_as`; rank None: the ticket
    #: whose page this is): the card then shows that line instead of the text and why it would repeat.
    same_as: tuple[int | None, str] | None = None


#: At most this many metadata facts on a card, each value cut to this many characters.
MAX_FACTS, FACT_CHARS = 4, 40
_TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T]\d{2}:\d{2}")


def card_facts(metadata: dict[str, Any], names: Sequence[str]) -> list[tuple[str, str]]:
    """The (name, value) of each of `names` that `metadata` holds with a value, in that order, at most `MAX_FACTS`:
    a timestamp shown as its date, a long value cut."""
    facts = []
    for name in names:
        value = metadata.get(name)
        if value is None or isinstance(value, (dict, list)) or str(value).strip() == "":
            continue
        text = " ".join(str(value).split())
        stamp = _TIMESTAMP.match(text)
        text = stamp.group(1) if stamp else text
        facts.append((name, text if len(text) <= FACT_CHARS else text[: FACT_CHARS - 1] + "…"))
        if len(facts) == MAX_FACTS:
            break
    return facts


#: The one-sentence definition of a share (the "why" line's tooltip; docs/internals.md says the same).
WHY_DEFINITION = ("Each channel's share of how much closer this ticket is to your query than the typical candidate "
                  "(the median of the tickets scored for it, or of every ticket when only a few share a word with "
                  "it), channel by channel; a channel where it is no closer gets 0 %.")


def _why(shares: dict[str, float]) -> list[dict[str, Any]]:
    """Shares as whole percentages that add up to 100 (`share_percentages`), largest first, each with its label,
    title and where its segment of the bar starts."""
    out, x = [], 0
    for c, p in share_percentages(shares):
        label, title = CHANNEL_LABELS.get(c, (c, c))
        out.append({"channel": c, "label": label, "title": title, "percent": p, "x": x})
        x += p
    return out


@bp.context_processor
def _card_texts() -> dict[str, str]:
    return {"why_definition": WHY_DEFINITION, "no_channel_sets_it_apart": NO_CHANNEL_SETS_IT_APART,
            "no_solution": NO_SOLUTION, "same_text": SAME_TEXT}


def _cards(answer: RecommendResult, given: dict[str, str]) -> list[ResultCard]:
    cards = []
    names = services().settings.card_fields
    rank_of = {rec.ticket.id: rec.rank for rec in answer.results}
    for rec in answer.results:
        ticket = rec.ticket
        terms = list(rec.shared_terms)
        cards.append(ResultCard(
            rank=rec.rank, ticket_id=ticket.id, score=float(rec.score), score_text=f"{float(rec.score):.1f}",
            solution=highlight(ticket.solution, terms), subject=highlight(ticket.subject, terms),
            description=highlight(ticket.description, terms), topics=_topic_chips(rec), shared=terms,
            given=given.get(ticket.id), why=_why(rec.channel_shares), facts=card_facts(ticket.metadata, names),
            same_as=None if rec.same_text_as is None else (rank_of.get(rec.same_text_as), rec.same_text_as),
        ))
    return cards


def _topic_chips(rec: Recommendation) -> list[dict[str, Any]]:
    """DocNADE topic chips, only when the topic channel carries weight in the model that answered (its
    `channel_shares` name every channel with a weight > 0: metric_spec["channels"]["T"] > 0)."""
    if "T" not in rec.channel_shares:
        return []
    chips = []
    for topic in list(rec.topics)[:3]:
        words = [str(w) for w in topic.get("words", [])]
        chips.append({"id": topic.get("id"), "weight": topic.get("weight"), "label": " ".join(words[:2]),
                      "title": f"topic {topic.get('id')}: " + ", ".join(words)})
    return chips


def _render_search(form: SearchForm, answer: RecommendResult | None = None, error: str | None = None, status: int = 200,
                   chosen: dict[str, str] | None = None):
    given = services().feedback_given(answer.query.subject, answer.query.description) if answer else {}
    cards = _cards(answer, given) if answer else []
    return render_template(
        "search.html", form=form, answer=answer, cards=cards, error=error, recent=services().recent(auth.recent_owner()),
        feedback_form=_feedback_form(answer), max_description=current_app.config["MAX_DESCRIPTION"],
        filter_choices=services().filter_choices(), chosen=chosen or {},
    ), status


#: The search form's filter menus are named FILTER_PREFIX + field; their value is the chosen value ("" = any).
FILTER_PREFIX = "filter-"


def chosen_filters(form_data) -> dict[str, str]:
    """The filter menus' choices of a posted form (the search form, or the feedback form that repeats them):
    field → value, "any" left out."""
    return {name[len(FILTER_PREFIX):]: value for name, value in form_data.items()
            if name.startswith(FILTER_PREFIX) and value.strip()}


def _feedback_form(answer: RecommendResult | None) -> FeedbackForm | None:
    if answer is None:
        return None
    form = FeedbackForm(formdata=None)
    form.subject.data, form.description.data = answer.query.subject, answer.query.description
    return form


@bp.get("/")
@auth.require("read")
def search():
    """The empty search form (or one filled from a recent query, its filters chosen again: `?reuse=<query_key>`)."""
    form = SearchForm(formdata=None)
    reuse, chosen = request.args.get("reuse"), {}
    if reuse:
        recent = services().recent_query(reuse, auth.recent_owner())
        if recent is None:
            flash("That recent query is no longer remembered; type it again.", "warning")
        else:
            form.subject.data, form.description.data = recent.query.subject, recent.query.description
            chosen = recent.chosen
    return _render_search(form, chosen=chosen)


@bp.post("/")
@auth.require("read")
def results():
    """Validate the form and show the top 10 recommendations."""
    form = SearchForm()
    chosen = chosen_filters(request.form)
    if not form.validate():
        return _render_search(form, status=400, chosen=chosen)
    return _answer(form, form.subject.data.strip(), form.description.data.strip(), chosen)


def _answer(form: SearchForm, subject: str, description: str, chosen: dict[str, str]):
    try:
        answer = services().recommend(subject, description, k=10, where=TicketFilter.equal(chosen))
    except InputError as exc:
        return _render_search(form, error=str(exc), status=400, chosen=chosen)
    except TicketrecError as exc:
        return _render_search(form, error=f"No recommendations can be served: {hide_paths(str(exc))}", status=503,
                              chosen=chosen)
    services().remember(answer.query, auth.recent_owner(), chosen)
    return _render_search(form, answer=answer, chosen=chosen)


@bp.post("/feedback")
@auth.require("write")
def feedback():
    """Store a YES/REL/NO judgement (the form fallback of the page's JavaScript), then show the results again."""
    fb_form = FeedbackForm()
    if not fb_form.validate():
        problems = "; ".join(f"{name}: {', '.join(errs)}" for name, errs in fb_form.errors.items())
        abort(400, description=f"The feedback form was incomplete ({problems}). Go back and search again.")
    subject, description = fb_form.subject.data.strip(), fb_form.description.data.strip()
    ticket_id, label = fb_form.ticket_id, fb_form.label
    if services().store().get_ticket(ticket_id) is None:
        abort(404, description=f"There is no ticket {ticket_id!r}; search again.")
    model_version, index_version = services().versions()
    try:
        services().store().add_feedback(Feedback(subject, description, ticket_id, label, model_version, index_version,
                                                 user_name=auth.user_name()))
    except InputError as exc:
        abort(400, description=str(exc))
    flash(f"Saved: ticket {ticket_id} marked {label}.", "success")
    search_form = SearchForm(formdata=None)
    search_form.subject.data, search_form.description.data = subject, description
    return _answer(search_form, subject, description, chosen_filters(request.form))


@bp.get("/tickets/<path:ticket_id>")
@auth.require("read")
def ticket(ticket_id: str):
    """The whole ticket and its nearest neighbours in the knowledge base."""
    found = services().store().get_ticket(ticket_id)
    if found is None:
        abort(404, description=f"There is no ticket {ticket_id!r} in the knowledge base.")
    answer, error, cards = None, None, []
    try:
        answer = services().recommend(found.subject, found.description, k=10, exclude=found.id)
        cards = _cards(answer, {})
    except TicketrecError as exc:
        error = f"Neighbours cannot be computed: {hide_paths(str(exc))}"
    return render_template("ticket.html", ticket=found, answer=answer, cards=cards, error=error)


@bp.get("/status")
@auth.require("read")
def status():
    """Model, index, workers, knowledge base and the latest evaluation; server paths only to a signed-in user."""
    svc = services()
    engine, engine_error = svc.engine_or_error()
    return render_template(
        "status.html", engine_error=engine_error, model=svc.model_info(), index=svc.index_info(),
        pending=svc.pending_changes(),
        memory=_index_memory(engine), broker=svc.broker_state(), stats=svc.store().stats(),
        report=svc.latest_report(), settings=svc.settings, show_paths=auth.identity() is not None,
    )


def _index_memory(engine) -> dict[str, Any] | None:
    """How much of the served index is in memory (`TicketIndex.memory`: mincore), or None when it cannot be said."""
    memory = getattr(getattr(engine, "index", None), "memory", None) if engine is not None else None
    if memory is None:
        return None
    try:
        info = memory()
    except TicketrecError:
        return None
    if info["resident_bytes"] is not None and info["bytes"]:
        info["resident_share"] = info["resident_bytes"] / info["bytes"]
    return info


@bp.get("/status/reports/<name>/<filename>")
@auth.require("read")
def report_file(name: str, filename: str):
    """A plot of an evaluation report (only .png files of a known report folder)."""
    if not filename.lower().endswith(".png"):
        abort(404)
    for folder in services().report_dirs():
        if folder.name == name:
            return send_from_directory(folder, filename)
    abort(404)


@bp.get("/topics")
@auth.require("read")
def topics():
    """Every DocNADE topic with its top 10 words."""
    try:
        words = services().topic_words(10)
        weigh = services().topics_weigh()
    except TicketrecError as exc:
        return render_template("topics.html", topics=[], error=f"No topics to show: {hide_paths(str(exc))}"), 503
    return render_template("topics.html", topics=list(enumerate(words)), topics_weigh=weigh, error=None)


@bp.route("/login", methods=["GET", "POST"])
def login():
    """Sign in with a name and password (accounts: `ticketrec user add NAME`), then go where `next` says."""
    form = LoginForm()
    if request.method == "GET":
        form.next.data = request.args.get("next", "")
    error, status = None, 200
    if form.validate_on_submit():
        name = form.name.data.strip()
        if services().store().check_password(name, form.password.data):
            auth.login_user(name)
            flash(f"Signed in as {name}.", "success")
            return redirect(auth.safe_next(form.next.data))
        log.warning("failed sign-in as %r from %s", name, request.remote_addr)
        error, status = "Unknown user name or wrong password.", 401
    elif request.method == "POST":
        status = 400
    return render_template("login.html", form=form, error=error), status


@bp.post("/logout")
def logout():
    """End the session (a CSRF-protected form in the top bar)."""
    auth.logout_user()
    flash("Signed out.", "success")
    return redirect(url_for("views.login") if auth.read_required() else url_for("views.search"))


@bp.app_template_filter("hide_paths")
def hide_paths(text: Any) -> str:
    """`text` with the server's paths (database, model, indexes, home) written as the settings that name them,
    unless a user is signed in: a signed-out visitor learns nothing of the server's file system."""
    text = "" if text is None else str(text)
    if not text or auth.identity() is not None:
        return text
    settings = services().settings
    paths = {str(settings.db): "$TICKETREC_DB", str(settings.model): "$TICKETREC_MODEL",
             str(settings.indexes_dir): "$TICKETREC_HOME/indexes", str(settings.home): "$TICKETREC_HOME"}
    for path in sorted(paths, key=len, reverse=True):
        text = text.replace(path, paths[path])
    return text


@bp.app_template_filter("when")
def format_time(value: Any) -> str:
    """Seconds since the epoch (or an ISO string) as a readable UTC time."""
    if value in (None, ""):
        return "—"
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(float(value), tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return str(value)
