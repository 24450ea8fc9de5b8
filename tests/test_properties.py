"""Property tests (hypothesis): any text survives an import round trip or is a clear InputError; any query text is
a valid query or an InputError; any JSON body is a JSON 4xx/503, never a 500. Modest example counts: seconds."""
from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from recommender.config import Settings
from recommender.data.importers import load
from recommender.data.records import MAX_ID_CHARS, Query, parse_json
from recommender.data.store import Store, query_key
from recommender.errors import InputError
from recommender.lexical.analyzer import tokenize
from recommender.serving.engine import validate_query

#: Any character, the awkward ones more often: lone surrogates, NUL, line breaks, quotes, separators, markup.
CHARS = st.one_of(st.characters(), st.characters(categories=["Cs"]), st.sampled_from(
    list("\x00\r\n\t\"',;=+-@<>&\\ \u2028\u202e\u200b\ufeff\u0301")))
TEXT = st.text(CHARS, max_size=80)
LIMITS = {"TICKETREC_MAX_SUBJECT_CHARS": "40", "TICKETREC_MAX_FIELD_CHARS": "60"}
TICKETS = st.lists(st.tuples(st.text(CHARS, min_size=1, max_size=12), TEXT, TEXT, TEXT), min_size=1, max_size=4)
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _expected(rows) -> dict[str, tuple[str, str, str]] | None:
    """What the import must store (stripped, cut to LIMITS), or None when some record must be refused."""
    out: dict[str, tuple[str, str, str]] = {}
    for ticket_id, subject, description, solution in rows:
        tid = ticket_id.strip()
        fields = (subject.strip()[:40], description.strip()[:60], solution.strip()[:60])
        if (not tid or len(tid) > MAX_ID_CHARS or any(map(_has_surrogate, (ticket_id, subject, description, solution)))
                or not (fields[0] or fields[1]) or out.get(tid, fields) != fields):
            return None
        out[tid] = fields
    return out


def _round_trip(path: Path, rows) -> None:
    """Import `path` (written from `rows`) into a real store: what was written is what is stored, or InputError."""
    expected = _expected(rows)
    config = Settings.from_env({"TICKETREC_HOME": str(path.parent), **LIMITS})
    try:
        data = load(path, warn=lambda _: None, settings=config)
    except InputError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
        event("refused")
        return
    event("stored" if expected is not None else "repeats kept once")
    with Store(path.parent / "kb.sqlite3") as store:
        store.import_dataset(data)
        stored = {t.id: (t.subject, t.description, t.solution) for t in store.get_tickets(store.ticket_ids())}
    if expected is not None:
        assert stored == expected
    else:  # only repeats that differ by white space or quotes may be kept (the first one)
        assert len(stored) < len(rows)


@PROPERTY
@given(TICKETS)
def test_jsonl_round_trip_or_input_error(rows):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kb.jsonl"
        path.write_text("".join(json.dumps({"type": "ticket", "id": i, "subject": s, "description": d, "solution": o})
                                + "\n" for i, s, d, o in rows), encoding="ascii")  # surrogates JSON-escaped
        _round_trip(path, rows)


@PROPERTY
@given(TICKETS)
def test_csv_round_trip_or_input_error(rows):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kb.csv"
        with open(path, "w", encoding="utf-8", errors="surrogatepass", newline="") as fh:  # a surrogate: bad UTF-8
            writer = csv.writer(fh)
            writer.writerow(["id", "subject", "description", "solution"])
            writer.writerows(rows)
        _round_trip(path, rows)


@PROPERTY
@given(TEXT, TEXT)
def test_any_query_text_is_a_valid_query_or_an_input_error(subject, description):
    config = Settings.from_env({"TICKETREC_HOME": "/nonexistent", "TICKETREC_MAX_DESCRIPTION": "50"})
    try:
        query = Query(subject, description)
        validate_query(query, config)
    except InputError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert not _has_surrogate(subject + description) and len(description) <= 50
    assert tokenize(subject + "\n" + description)  # it has words to search with
    assert len(query_key(subject, description)) == 40  # and can be keyed, stored and shown (UTF-8)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=12)


@settings(max_examples=60, deadline=None,  # make_web_app builds a fresh app per example; its store is only read
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.one_of(JSON_VALUES, st.fixed_dictionaries({"subject": JSON_VALUES, "description": JSON_VALUES,
                                                     "k": JSON_VALUES})))
def test_any_json_body_is_answered_without_a_500(make_web_app, value):
    body = json.dumps(value)  # lone surrogates escaped, as an attacker's client sends them
    response = make_web_app().test_client().post("/api/v1/recommendations", data=body, content_type="application/json")
    assert response.status_code in (400, 413, 503) and response.is_json  # 503: every valid query (no model here)
    assert response.get_json()["error"]["status"] == response.status_code


@PROPERTY
@given(st.text(st.one_of(st.characters(), st.sampled_from(list('{}[]",:0123456789.eE-+ntrufalse\\u'))), max_size=60))
def test_parse_json_gives_a_value_or_an_input_error(text):
    try:
        parse_json(text)
    except InputError as exc:
        assert str(exc) and "\n" not in str(exc)


@PROPERTY
@given(st.lists(st.tuples(st.sampled_from(["Pump leak", "pump  LEAK", "Valve"]), st.sampled_from(["", "Oil.", "oil."]),
                          st.sampled_from(["", "Reseal"])), max_size=10))
def test_each_copy_names_the_first_result_of_its_text(texts):
    """`mark_copies`: a result names the first higher result whose subject, description and solution read the same
    (white space and case aside), and only such a one; the first of each text names none."""
    from recommender.data.records import Recommendation, Ticket
    from recommender.serving.engine import mark_copies

    results = [Recommendation(Ticket(f"T{i}", *text), i + 1, 0.5, 3.0) for i, text in enumerate(texts)]
    mark_copies(results)
    folded = [tuple(" ".join(part.split()).lower() for part in text) for text in texts]
    for i, rec in enumerate(results):
        first = folded.index(folded[i])
        assert rec.same_text_as == (None if first == i else f"T{first}")
