"""Importers: JSONL, CSV and SemEval XML, good and malformed input, auto-detection, merging."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from recommender.errors import InputError
from recommender.data.importers import detect_format, load, load_many


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


TICKET = {"type": "ticket", "id": "T1", "subject": "Oil pressure low", "description": "Alarm after filter change.",
          "solution": "Bleed the filter.", "metadata": {"site": "A"}}
TICKET2 = {"type": "ticket", "id": "T2", "subject": "Valve sticks", "description": "Valve stuck at 40%.",
           "solution": "Clean the stem."}
QUERY = {"type": "query", "id": "Q1", "subject": "oil press low", "description": "LO pressure falling."}


# -- JSONL ---------------------------------------------------------------------------------------------------------
def test_jsonl_good_file(tmp_path):
    path = write_jsonl(tmp_path / "kb.jsonl", [
        TICKET, TICKET2, "", QUERY,
        {"type": "pair", "query_id": "Q1", "ticket_id": "T1", "score": 5},
        {"type": "pair", "query_id": "Q1", "ticket_id": "T2", "label": "no"},
        TICKET,  # an identical repeat is harmless
    ])
    data = load(path)
    assert [t.id for t in data.tickets] == ["T1", "T2"]
    assert data.tickets[0].metadata == {"site": "A"}
    assert data.queries[0].subject == "oil press low" and data.queries[0].id == "Q1"
    assert [(p.query_id, p.ticket_id, p.score) for p in data.pairs] == [("Q1", "T1", 5.0), ("Q1", "T2", 1.0)]
    assert data.source == str(path)


@pytest.mark.parametrize("line, reason", [
    ("{not json", "bad JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"type": "gadget", "id": "x"}), "unknown record type"),
    (json.dumps({**TICKET2, "id": ""}), "field 'id' is empty"),
    (json.dumps({k: v for k, v in TICKET2.items() if k != "solution"}), "missing field 'solution'"),
    (json.dumps({**TICKET2, "subject": 7}), "must be a string"),
    (json.dumps({**TICKET2, "subject": "", "description": ""}), "neither subject nor description"),
    (json.dumps({**TICKET2, "metadata": [1]}), "'metadata' must be a JSON object"),
    (json.dumps({**TICKET, "solution": "something else"}), "appears twice with different content"),
    (json.dumps({"type": "pair", "query_id": "Q1", "ticket_id": "T1", "score": 7}), "outside 1-5"),
    (json.dumps({"type": "pair", "query_id": "Q1", "ticket_id": "T1", "score": "high"}), "not a number"),
    (json.dumps({"type": "pair", "query_id": "Q1", "ticket_id": "T1", "label": "MAYBE"}), "unknown label"),
    (json.dumps({"type": "pair", "query_id": "Q1", "ticket_id": "T1"}), "needs a 'score'"),
    (json.dumps({"type": "pair", "query_id": "Q1", "ticket_id": "T1", "score": 5, "label": "NO"}), "contradicts"),
    (json.dumps({"type": "pair", "query_id": "Q9", "ticket_id": "T1", "score": 5}), "query 'Q9'"),
    (json.dumps({"type": "pair", "query_id": "Q1", "ticket_id": "T9", "score": 5}), "ticket 'T9'"),
])
def test_jsonl_malformed_record_names_file_line_and_reason(tmp_path, line, reason):
    path = write_jsonl(tmp_path / "bad.jsonl", [TICKET, QUERY, line])
    with pytest.raises(InputError) as err:
        load(path)
    message = str(err.value)
    assert str(path) in message and "line 3" in message and reason in message


def test_jsonl_not_utf8(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(json.dumps(TICKET).encode() + b"\n" + '{"type": "query", "id": "Q\xe9"}'.encode("latin-1") + b"\n")
    with pytest.raises(InputError, match="line 2: not UTF-8"):
        load(path)


def test_pair_may_name_known_ids_from_the_store(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"type": "pair", "query_id": "Q1", "ticket_id": "T1", "label": "REL"}])
    with pytest.raises(InputError, match="query 'Q1'"):
        load(path)
    data = load(path, known_ticket_ids=["T1"], known_query_ids=["Q1"])
    assert data.pairs[0].score == 3.0


# -- CSV -------------------------------------------------------------------------------------------------------------
def test_csv_tickets_with_extra_columns_as_metadata(tmp_path):
    path = tmp_path / "tickets.csv"
    path.write_text('\ufeffID,Subject,Description,Solution,site\n'
                    'T1,Pump noise,"Noise at pump, ""rattling"".\nSecond line.",Replace bearing,Plant A\n'
                    'T2,Valve leak,Leak at flange,New gasket,\n', encoding="utf-8")
    data = load(path)
    assert [t.id for t in data.tickets] == ["T1", "T2"]
    assert data.tickets[0].description == 'Noise at pump, "rattling".\nSecond line.'
    assert data.tickets[0].metadata == {"site": "Plant A"} and data.tickets[1].metadata == {}


def test_csv_pairs_file_defines_queries_and_pairs(tmp_path):
    (tmp_path / "tickets.csv").write_text("id,subject,description,solution\nT1,a,b,c\nT2,d,e,f\n", encoding="utf-8")
    (tmp_path / "pairs.csv").write_text(
        "query_id,query_subject,query_description,ticket_id,score,label\n"
        "Q1,oil low,pressure falls,T1,5,\nQ1,oil low,pressure falls,T2,,NO\n", encoding="utf-8")
    data = load_many([tmp_path / "tickets.csv", tmp_path / "pairs.csv"])
    assert len(data.tickets) == 2 and [q.id for q in data.queries] == ["Q1"]
    assert [(p.ticket_id, p.score) for p in data.pairs] == [("T1", 5.0), ("T2", 1.0)]
    with pytest.raises(InputError, match="ticket 'T1'"):  # alone, the pairs file names unknown tickets
        load(tmp_path / "pairs.csv")


@pytest.mark.parametrize("content, where, reason", [
    ("a,b,c\n1,2,3\n", "line 1", "unrecognised header"),
    ("", "line 1", "empty"),
    ("id,subject,description,solution\nT1,a,b\n", "line 2", "has 3 fields"),
    ("id,subject,description,solution\nT1,a,b,c\n,a,b,c\n", "line 3", "'id' is empty"),
    ("id,subject,description,solution\nT1,a,b,c\nT1,a,b,other\n", "line 3", "appears twice"),
    ("query_id,query_subject,query_description,ticket_id,score\nQ1,a,b,T1,0\n", "line 2", "outside 1-5"),
    ("query_id,query_subject,query_description,ticket_id,label\nQ1,a,b,T1,GOOD\n", "line 2", "unknown label"),
    ("query_id,query_subject,query_description,ticket_id,score\nQ1,a,b,T1,5\nQ1,a,other,T1,5\n", "line 3",
     "query id 'Q1' appears twice"),
    ("query_id,query_subject,query_description,ticket_id,score\nQ1,a,b,T1,5\nQ1,a,b,T1,3\n", "line 3",
     "appears twice with scores"),
])
def test_csv_malformed(tmp_path, content, where, reason):
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as err:
        load(path, known_ticket_ids=["T1"])
    assert str(path) in str(err.value) and where in str(err.value) and reason in str(err.value)


# -- SemEval XML -----------------------------------------------------------------------------------------------------
SEMEVAL = """<?xml version="1.0" encoding="utf-8"?>
<xml version="1.0">
<OrgQuestion ORGQ_ID="Q1"><OrgQSubject>Good bank</OrgQSubject><OrgQBody>Which bank is good?</OrgQBody>
 <Thread THREAD_SEQUENCE="Q1_R1"><RelQuestion RELQ_ID="Q1_R1" RELQ_RANKING_ORDER="1" RELQ_CATEGORY="Finance"
   RELQ_DATE="2013-01-01" RELQ_RELEVANCE2ORGQ="PerfectMatch"><RelQSubject>Best bank</RelQSubject>
   <RelQBody>Which bank do you use?</RelQBody></RelQuestion>
  <RelComment RELC_ID="c1" RELC_RELEVANCE2RELQ="Good"><RelCText>HSBC is fine.</RelCText></RelComment>
  <RelComment RELC_ID="c2" RELC_RELEVANCE2RELQ="Bad"><RelCText>lol</RelCText></RelComment>
  <RelComment RELC_ID="c3" RELC_RELEVANCE2RELQ="Good"><RelCText>QNB is good.</RelCText></RelComment>
 </Thread></OrgQuestion>
<OrgQuestion ORGQ_ID="Q1"><OrgQSubject>Good bank</OrgQSubject><OrgQBody>Which bank is good?</OrgQBody>
 <Thread THREAD_SEQUENCE="Q1_R2"><RelQuestion RELQ_ID="Q1_R2" RELQ_RANKING_ORDER="2" RELQ_CATEGORY="Cars"
   RELQ_DATE="2013-01-02" RELQ_RELEVANCE2ORGQ="Irrelevant"><RelQSubject>Car rental</RelQSubject>
   <RelQBody>Cheap car?</RelQBody></RelQuestion>
  <RelComment RELC_ID="c4" RELC_RELEVANCE2RELQ="Bad"><RelCText>Try Oasis.</RelCText></RelComment>
  <RelComment RELC_ID="c5" RELC_RELEVANCE2RELQ="PotentiallyUseful"><RelCText>No idea.</RelCText></RelComment>
 </Thread></OrgQuestion>
<OrgQuestion ORGQ_ID="Q2"><OrgQSubject>Bank loan</OrgQSubject><OrgQBody>Loan?</OrgQBody>
 <Thread THREAD_SEQUENCE="Q1_R1"><RelQuestion RELQ_ID="Q1_R1" RELQ_RANKING_ORDER="5" RELQ_CATEGORY="Finance"
   RELQ_DATE="2013-01-01" RELQ_RELEVANCE2ORGQ="Relevant"><RelQSubject>Best bank</RelQSubject>
   <RelQBody>Which bank do you use?</RelQBody></RelQuestion>
  <RelComment RELC_ID="c1" RELC_RELEVANCE2RELQ="Good"><RelCText>HSBC is fine.</RelCText></RelComment>
  <RelComment RELC_ID="c2" RELC_RELEVANCE2RELQ="Bad"><RelCText>lol</RelCText></RelComment>
  <RelComment RELC_ID="c3" RELC_RELEVANCE2RELQ="Good"><RelCText>QNB is good.</RelCText></RelComment>
 </Thread></OrgQuestion>
</xml>
"""


def test_semeval_mapping(tmp_path):
    path = tmp_path / "mini.xml"
    path.write_text(SEMEVAL, encoding="utf-8")
    data = load(path)
    assert [q.id for q in data.queries] == ["Q1", "Q2"]  # Q1 repeated per thread: grouped
    assert data.queries[0].subject == "Good bank" and data.queries[0].description == "Which bank is good?"
    assert [t.id for t in data.tickets] == ["Q1_R1", "Q1_R2"]  # Q1_R1 under two originals: one ticket
    r1, r2 = data.tickets
    assert (r1.subject, r1.description) == ("Best bank", "Which bank do you use?")
    assert r1.solution == "HSBC is fine.\nQNB is good."  # only the Good comments
    assert r2.solution == "Try Oasis.\nNo idea."  # none Good: all comments
    assert r1.metadata["ir_rank"] == 1 and r1.metadata["category"] == "Finance"
    assert [(p.query_id, p.ticket_id, p.score) for p in data.pairs] == [
        ("Q1", "Q1_R1", 5.0), ("Q1", "Q1_R2", 1.0), ("Q2", "Q1_R1", 3.0)]
    assert data.pair_meta[("Q2", "Q1_R1")] == {"ir_rank": 5, "semeval_label": "Relevant"}


@pytest.mark.parametrize("edit, reason", [
    (lambda s: s.replace('RELQ_RELEVANCE2ORGQ="Irrelevant"', 'RELQ_RELEVANCE2ORGQ="Maybe"'), "unknown RELQ_RELEVANCE2ORGQ"),
    (lambda s: s.replace('RELQ_ID="Q1_R2"', 'RELQ_ID=""'), "RelQuestion without RELQ_ID"),
    (lambda s: s.replace('<OrgQuestion ORGQ_ID="Q2">', '<OrgQuestion>'), "without ORGQ_ID"),
    (lambda s: s.replace("</xml>", ""), "bad XML"),
    (lambda s: s.replace("Loan?</OrgQBody>", "Loan?</OrgQBody2>"), "bad XML"),
    (lambda s: s.replace("<RelQBody>Cheap car?", "<RelQBody>Cheap bus?"), None),  # legal: Q1_R2 appears once
    (lambda s: s.replace('RELQ_RANKING_ORDER="5"', 'RELQ_RANKING_ORDER="five"'), "not an integer"),
    (lambda s: s.replace("<RelCText>QNB is good.</RelCText></RelComment>\n </Thread></OrgQuestion>\n</xml>",
                         "<RelCText>QNB!</RelCText></RelComment>\n </Thread></OrgQuestion>\n</xml>"),
     "appears twice with different text"),
])
def test_semeval_malformed(tmp_path, edit, reason):
    path = tmp_path / "bad.xml"
    path.write_text(edit(SEMEVAL), encoding="utf-8")
    if reason is None:
        assert len(load(path).tickets) == 2
        return
    with pytest.raises(InputError) as err:
        load(path)
    assert str(path) in str(err.value) and reason in str(err.value)


def test_semeval_error_names_the_element(tmp_path):
    path = tmp_path / "bad.xml"
    path.write_text(SEMEVAL.replace('RELQ_RELEVANCE2ORGQ="Irrelevant"', 'RELQ_RELEVANCE2ORGQ="Maybe"'), encoding="utf-8")
    with pytest.raises(InputError, match='RELQ_ID="Q1_R2"'):
        load(path)


def test_semeval_refuses_entity_expansion(tmp_path):
    bomb = ('<?xml version="1.0"?>\n<!DOCTYPE xml [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]>\n'
            '<xml><OrgQuestion ORGQ_ID="Q1"><OrgQSubject>&b;</OrgQSubject><OrgQBody>x</OrgQBody></OrgQuestion></xml>\n')
    path = tmp_path / "bomb.xml"
    path.write_text(bomb, encoding="utf-8")
    with pytest.raises(InputError, match="unsafe XML refused"):
        load(path)


def test_semeval_file_without_orgquestions(tmp_path):
    path = tmp_path / "other.xml"
    path.write_text("<catalog><book/></catalog>", encoding="utf-8")
    with pytest.raises(InputError, match="no OrgQuestion"):
        load(path)


def test_semeval_dev_xml_gives_50_500_500(semeval_dir):
    data = load(semeval_dir / "dev.xml")
    assert (len(data.queries), len(data.tickets), len(data.pairs)) == (50, 500, 500)
    scores = [p.score for p in data.pairs]
    assert (scores.count(5.0), scores.count(3.0), scores.count(1.0)) == (59, 155, 286)
    assert all(1 <= data.pair_meta[(p.query_id, p.ticket_id)]["ir_rank"] for p in data.pairs)
    assert sum(1 for t in data.tickets if t.solution) == 500


def test_semeval_train_part2(semeval_dir):
    data = load(semeval_dir / "train-part2.xml")
    assert (len(data.queries), len(data.tickets), len(data.pairs)) == (67, 670, 670)
    scores = [p.score for p in data.pairs]
    assert (scores.count(5.0), scores.count(3.0), scores.count(1.0)) == (54, 242, 374)


# -- detection and merging ---------------------------------------------------------------------------------------------
def test_detect_format():
    assert detect_format("a.JSONL") == "jsonl" and detect_format("a.json") == "jsonl"
    assert detect_format("a.csv") == "csv" and detect_format("a.xml") == "semeval"
    assert detect_format("a.txt", "csv") == "csv"
    with pytest.raises(InputError, match="--format"):
        detect_format("a.txt")
    with pytest.raises(InputError, match="unknown format"):
        detect_format("a.csv", "excel")


def test_explicit_format_overrides_extension(tmp_path):
    path = write_jsonl(tmp_path / "kb.txt", [TICKET])
    assert load(path, "jsonl").tickets[0].id == "T1"


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load(tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match="no input file"):
        load_many([])


def test_load_many_later_file_wins(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [TICKET, QUERY, {"type": "pair", "query_id": "Q1", "ticket_id": "T1", "score": 1}])
    b = write_jsonl(tmp_path / "b.jsonl", [{**TICKET, "solution": "Newer fix."},
                                           {"type": "pair", "query_id": "Q1", "ticket_id": "T1", "score": 5}])
    data = load_many([a, b])
    assert len(data.tickets) == 1 and data.tickets[0].solution == "Newer fix."
    assert [p.score for p in data.pairs] == [5.0]
    assert str(a) in data.source and str(b) in data.source
