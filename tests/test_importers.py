"""Importers: JSONL, CSV and SemEval XML, good and malformed input, auto-detection, merging."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from recommender.errors import InputError
from recommender.data.importers import (detect_format, load, load_links, load_many, parse_mapping,
                                        read_mapping)


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
    (json.dumps({k: v for k, v in TICKET2.items() if k != "type"}), 'has no "type"; set "type"'),
    (json.dumps({**TICKET2, "id": ""}), "field 'id' is empty"),
    (json.dumps({k: v for k, v in TICKET2.items() if k != "subject"}), "missing field 'subject'"),
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
    # a quote never closed: read leniently, every later record became that one field (1 ticket of 4, silently)
    ('id,subject\nT1,a\nT2,"unterminated\nT3,c\nT4,d\n', "line 3", "opens in this record and is never closed"),
    ('id,subject,description\nT1,a,"two\nlines"\nT2,"b\nT3,c,d\n', "line 4", "never closed"),  # after a multi-line
    ('id,"subject\nT1,a\n', "line 1", "never closed"),
    ('id,subject,description\nT1,a,b\nT2,"x"y,"open\nT3,c,d\n', "line 3", "never closed"),  # after a quirk
    # an error in a record of two lines (past the 20 records read ahead) is its own, not a later quote's
    ("id,subject,description\n" + "".join(f"R{i},s,d\n" for i in range(25)) + 'T1,"two\nlines",x,extra\n'
     + 'R99,s,d\nT2,"open\nT3,c,d\n', "line 27", "has 4 fields"),
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


# -- a help desk's own export: column mapping (issue 12) ----------------------------------------------------------
EXPORT = ('Summary,Issue id,Status,Description,Secret notes\n'
          'Pump rattles at start,101,OPEN,"Noise at the pump, ""rattling"".",SECRET-CELL-1\n'
          'Valve leak,102,CLOSED,,\n'
          'Valve leak again,103,CLOSED,Leak at the flange.,\n')
MAPPING = {"id": "Issue id", "subject": "Summary", "description": "Description"}


def test_csv_with_a_column_mapping(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text(EXPORT, encoding="utf-8")
    data = load(path, mapping=MAPPING)
    assert [(t.id, t.subject, t.description, t.solution) for t in data.tickets] == [
        ("101", "Pump rattles at start", 'Noise at the pump, "rattling".', ""),
        ("102", "Valve leak", "", ""),  # subject only: valid
        ("103", "Valve leak again", "Leak at the flange.", "")]
    assert data.tickets[0].metadata == {"status": "OPEN", "secret notes": "SECRET-CELL-1"}  # other columns kept aside
    assert not data.queries and not data.pairs
    # names match ignoring case and surrounding white space; an unmapped field falls back to its own column name
    (tmp_path / "b.csv").write_text("ID,Title\nA1,Printer jams\n", encoding="utf-8")
    assert load(tmp_path / "b.csv", mapping={"subject": " title "}).tickets[0].subject == "Printer jams"


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
def test_an_export_separated_by_semicolons_tabs_or_bars_reads_as_the_comma_one(tmp_path, delimiter):
    """Spreadsheets in many locales save "CSV" with ";": the header row tells the delimiter when the comma leaves
    it one field. A comma file whose fields hold ";" stays a comma file."""
    import csv

    rows = list(csv.reader(io.StringIO(EXPORT)))
    path = tmp_path / "export.csv"
    with open(path, "w", encoding="utf-8-sig", newline="") as fh:  # with the BOM Excel writes
        csv.writer(fh, delimiter=delimiter).writerows(rows)
    assert load(path, mapping=MAPPING).tickets == load_text(tmp_path, EXPORT, MAPPING).tickets
    (tmp_path / "c.csv").write_text('id,subject\nA1,"Pump; valve"\n', encoding="utf-8")
    assert load(tmp_path / "c.csv").tickets[0].subject == "Pump; valve"
    (tmp_path / "t.csv").write_text("id\tSubject, short\tdescription\nA2\tPump\tNoise, then a trip.\n", encoding="utf-8")
    ticket = load(tmp_path / "t.csv", mapping={"subject": "Subject, short"}).tickets[0]  # more fields by tabs
    assert (ticket.id, ticket.subject, ticket.description) == ("A2", "Pump", "Noise, then a trip.")


def load_text(tmp_path, text: str, mapping: dict):
    path = tmp_path / "comma.csv"
    path.write_text(text, encoding="utf-8")
    return load(path, mapping=mapping)


def test_a_windows_export_not_in_utf8_is_refused_with_how_to_convert_it(tmp_path):
    path = tmp_path / "export.csv"
    path.write_bytes("Ticket-Nr,Betreff,Lösung\n1,Drucker,Treiber\n".encode("cp1252"))
    with pytest.raises(InputError, match=r"line 1, byte 20: not UTF-8 .*iconv -f cp1252 -t utf-8"):
        load(path, mapping={"id": "Ticket-Nr", "subject": "Betreff"})


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_a_unicode_export_in_utf16_reads_as_its_utf8_twin(tmp_path, encoding):
    """Excel's "Unicode text" (UTF-16 with its byte-order mark, tab-separated), and any CSV or links file that
    begins with a UTF-16 mark, reads as the same file in UTF-8 does; JSON Lines, UTF-8 by definition, say how."""
    text = "Ticket-Nr\tBetreff\tBeschreibung\r\n1\tDrucker klemmt\t\"Papier \u00fcberall,\r\nFach 2\"\r\n2\tVPN \u2013 trennt\tjede Stunde\r\n"
    mapping = {"id": "Ticket-Nr", "subject": "Betreff", "description": "Beschreibung"}
    utf16, utf8 = tmp_path / "unicode.txt", tmp_path / "utf8.txt"
    bom = b"\xfe\xff" if encoding.endswith("be") else b""  # Python's "utf-16" writes its own (little-endian) mark
    utf16.write_bytes(bom + text.encode(encoding))
    utf8.write_text(text, encoding="utf-8")
    got = load(utf16, fmt="csv", mapping=mapping)
    assert got.tickets == load(utf8, fmt="csv", mapping=mapping).tickets
    assert [t.subject for t in got.tickets] == ["Drucker klemmt", "VPN \u2013 trennt"]
    links = tmp_path / "links.csv"
    links.write_bytes(bom + "1,2\n2,3\n".encode(encoding))
    assert load_links(links, None) == [("1", "2"), ("2", "3")]
    jsonl = tmp_path / "kb.jsonl"
    jsonl.write_bytes(bom + (json.dumps(TICKET) + "\n").encode(encoding))
    with pytest.raises(InputError, match=r"line 1: UTF-16 .*iconv -f utf-16 -t utf-8"):
        load(jsonl)
    broken = tmp_path / "broken.csv"
    broken.write_bytes(b"\xff\xfe" + "id,subject\n1,x\n".encode("utf-16-le") + b"\x00")  # an odd byte at the end
    with pytest.raises(InputError, match="begins as UTF-16 but is not"):
        load(broken, fmt="csv")


def test_a_byte_that_is_not_utf8_deep_in_an_export_is_named_at_its_own_line(tmp_path):
    """The CSV reader decodes thousands of lines ahead of the row it returns; the error names the bad byte's line
    and byte as an editor shows them (a multi-line quoted field counts its lines), and so does a links file's."""
    path = tmp_path / "export.csv"
    rows = b"".join(b"K-%d,subject %d,description of ticket %d\n" % (i, i, i) for i in range(3000))
    path.write_bytes(b"Key,Summary,Description\nK-a,two,\"line one\nline two\"\n" + rows + b"K-x,Caf\xe9,bad\n")
    with pytest.raises(InputError, match=r"line 3004, byte 8: not UTF-8"):
        load(path, mapping={"id": "Key", "subject": "Summary"})
    links = tmp_path / "links.csv"
    links.write_bytes(b"a,b\n1,2\n3,\xe9\n")
    with pytest.raises(InputError, match=r"line 3, byte 3: not UTF-8"):
        load_links(links, None)


def test_a_missing_mapped_column_names_the_columns_found_and_nothing_else(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text(EXPORT, encoding="utf-8")
    with pytest.raises(InputError) as err:
        load(path, mapping={**MAPPING, "solution": "Resolution"})
    message = str(err.value)
    assert "'Resolution'" in message and "solution" in message and "line 1" in message
    assert "'Summary', 'Issue id', 'Status', 'Description', 'Secret notes'" in message
    assert "SECRET-CELL-1" not in message and "rattling" not in message and "\n" not in message
    with pytest.raises(InputError, match="no column for the ticket id"):
        load(path, mapping={"subject": "Summary"})  # no 'id' column and no mapping for it


def test_jsonl_with_a_column_mapping(tmp_path):
    path = write_jsonl(tmp_path / "export.jsonl", [
        {"key": 7, "title": "Pump noise", "body": "Rattling at start.", "owner": "ann"},
        {"key": "8", "title": "Valve leak"},
    ])
    data = load(path, mapping={"id": "key", "subject": "title", "description": "body"})
    assert [(t.id, t.subject, t.description) for t in data.tickets] == [("7", "Pump noise", "Rattling at start."),
                                                                      ("8", "Valve leak", "")]
    assert data.tickets[0].metadata == {"owner": "ann"}
    with pytest.raises(InputError, match="no record has the field 'text'.*'body', 'key', 'owner', 'title'"):
        load(path, mapping={"id": "key", "subject": "title", "description": "text"})
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"title": "no id here"}])
    with pytest.raises(InputError, match="line 1.*no field 'key'"):
        load(bad, mapping={"id": "key", "subject": "title"})


def test_jsonl_mapping_reads_nested_fields_by_dotted_names(tmp_path):
    """A Jira export (`jq -c '.issues[]'` of its JSON) nests the fields: `--map subject=fields.summary`."""
    path = write_jsonl(tmp_path / "jira.jsonl", [
        {"key": "OPS-1", "fields": {"summary": "Pump noise", "description": "Rattling.", "status": {"name": "Done"}}},
        {"key": "OPS-2", "fields": {"summary": "Valve leak", "description": None}},
        {"key": "OPS-3", "fields.summary": "Flat wins", "fields": {"summary": "nested loses"}},
    ])
    data = load(path, mapping={"id": "key", "subject": "fields.summary", "description": "fields.description"})
    assert [(t.id, t.subject, t.description) for t in data.tickets] == [
        ("OPS-1", "Pump noise", "Rattling."), ("OPS-2", "Valve leak", ""), ("OPS-3", "Flat wins", "")]
    assert data.tickets[0].metadata["fields"]["status"] == {"name": "Done"}  # the rest stays as metadata
    with pytest.raises(InputError, match=r"no record has the field 'fields.body'.*a dotted name"):
        load(path, mapping={"id": "key", "subject": "fields.summary", "description": "fields.body"})


def test_mapping_from_arguments_and_files(tmp_path):
    assert parse_mapping(["id=Issue id", "Subject = Summary"]) == {"id": "Issue id", "subject": "Summary"}
    with pytest.raises(InputError, match="FIELD=COLUMN"):
        parse_mapping(["subject"])
    with pytest.raises(InputError, match="cannot map 'title'"):
        parse_mapping(["title=Summary"])
    with pytest.raises(InputError, match="empty"):
        parse_mapping(["subject="])
    (tmp_path / "m.json").write_text('{"id": "Issue id", "subject": "Summary"}', encoding="utf-8")
    (tmp_path / "m.txt").write_text('# SeaMonkey export\nid="Issue id"\n\nsubject=Summary\n', encoding="utf-8")
    assert read_mapping(tmp_path / "m.json") == read_mapping(tmp_path / "m.txt") == {"id": "Issue id", "subject": "Summary"}
    (tmp_path / "bad.json").write_text('{"id": ', encoding="utf-8")
    with pytest.raises(InputError, match="bad JSON"):
        read_mapping(tmp_path / "bad.json")
    with pytest.raises(InputError, match="SemEval XML, whose fields are fixed"):
        (tmp_path / "x.xml").write_text(SEMEVAL, encoding="utf-8")
        load(tmp_path / "x.xml", mapping={"id": "x"})


def test_subject_only_tickets_and_queries_are_valid(tmp_path):
    path = write_jsonl(tmp_path / "kb.jsonl", [
        {"type": "ticket", "id": "T1", "subject": "Pump noise"},
        {"type": "query", "id": "Q1", "subject": "noisy pump"},
        {"type": "pair", "query_id": "Q1", "ticket_id": "T1", "label": "YES"},
    ])
    data = load(path)
    assert (data.tickets[0].description, data.tickets[0].solution, data.queries[0].description) == ("", "", "")
    (tmp_path / "t.csv").write_text("id,subject\nT1,Pump noise\n", encoding="utf-8")
    (tmp_path / "p.csv").write_text("query_id,query_subject,ticket_id,score\nQ1,noisy pump,T1,5\n", encoding="utf-8")
    data = load_many([tmp_path / "t.csv", tmp_path / "p.csv"])
    assert data.tickets[0].subject == "Pump noise" and data.queries[0].description == ""


def test_a_tickets_file_without_descriptions_warns_and_names_the_column_that_may_hold_them(tmp_path):
    """No ticket with a description is a valid knowledge base, but most often a description column the import did not
    read (misspelt, or under a tool's own name): one warning line names the file's other columns, the nearest one,
    and how to import it; nothing when a ticket has a description."""
    def warnings_of(name: str, text: str, **kw) -> list[str]:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        said: list[str] = []
        load(path, warn=said.append, **kw)
        return said

    [said] = warnings_of("typo.csv", "id,subject,Descripton,Status\nA,Pump noise,Rattling at start,NEW\n")
    assert "its one ticket has no description" in said and "'Descripton', 'Status'" in said
    assert "--map description='Descripton'" in said and "matched by their subjects alone" in said
    [said] = warnings_of("body.csv", "id,subject,Body\nA,Pump noise,Rattling\nB,Valve leak,Flange\n")
    assert "none of its 2 tickets has a description" in said and "--map description=COLUMN" in said
    [said] = warnings_of("own.jsonl", json.dumps({"type": "ticket", "id": "A", "subject": "Pump noise",
                                                  "descriptoin": "Rattling", "solution": "Bearing"}) + "\n")
    assert "rename the field 'descriptoin' to \"description\"" in said and "subjects and solutions" in said
    [said] = warnings_of("mapped.csv", "key,Summary,Body\nA,Pump noise,\n", mapping={"id": "key", "subject": "Summary",
                                                                                      "description": "Body"})
    assert "the column 'Body' (mapped to description) is empty in every record" in said
    assert warnings_of("some.csv", "id,subject,description\nA,Pump noise,\nB,Valve leak,Flange\n") == []


def test_repeated_records_with_trivial_differences_warn_and_keep_the_first(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text('id,subject,description\n'
                    'A,Pump noise,"Rattling  at start."\n'
                    'B,Valve leak,Flange\n'
                    'A,"""Pump noise""",Rattling at start. \n'  # a stray quote and white space
                    "A,Pump noise,Rattling at\tstart.\n", encoding="utf-8")
    warnings: list[str] = []
    data = load(path, warn=warnings.append)
    assert [t.id for t in data.tickets] == ["A", "B"] and data.tickets[0].subject == "Pump noise"
    assert len(warnings) == 1 and "2 records repeat" in warnings[0] and "(ids A)" in warnings[0]
    path.write_text("id,subject,description\nA,Pump noise,Rattling\nA,Pump noise,Grinding\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 3: ticket id 'A' appears twice with different content"):
        load(path, warn=warnings.append)


# -- duplicate links -------------------------------------------------------------------------------------------------
def test_links_with_a_header_are_validated(tmp_path):
    path = tmp_path / "links.csv"
    path.write_text("Issue id,Duplicate id\n1,2\n2,1\n1,2\n3,3\n1,9\n4,1\n", encoding="utf-8")
    warnings: list[str] = []
    links = load_links(path, known_ids=["1", "2", "3", "4"], warn=warnings.append)
    assert links == [("1", "2"), ("4", "1")]  # symmetric and exact repeats, the self-link and the unknown id dropped
    assert len(warnings) == 1
    assert "1 naming a ticket that is not in the knowledge base" in warnings[0]
    assert "1 self-links" in warnings[0] and "2 repeats" in warnings[0]
    assert load_links(path, ["duplicate ID", "issue id"], warn=warnings.append)[:2] == [("2", "1"), ("9", "1")]
    with pytest.raises(InputError, match="no column 'Dup'.*'Issue id', 'Duplicate id'"):
        load_links(path, ["Issue id", "Dup"])


def test_links_without_a_header(tmp_path):
    path = tmp_path / "links.csv"
    path.write_text("T-1,T-2\nT-3,T-1\n", encoding="utf-8")
    assert load_links(path) == [("T-1", "T-2"), ("T-3", "T-1")]  # ids hold digits: no header
    assert load_links(path, known_ids=["T-1", "T-2", "T-3"]) == [("T-1", "T-2"), ("T-3", "T-1")]
    (tmp_path / "tabs.tsv").write_text("a\tb\nT-1\tT-2\n", encoding="utf-8")
    assert load_links(tmp_path / "tabs.tsv") == [("T-1", "T-2")]  # "a", "b" hold no digit: a header
    with pytest.raises(InputError, match="no usable link"):
        load_links(path, known_ids=["X"])
    (tmp_path / "one.csv").write_text("T-1\n", encoding="utf-8")
    with pytest.raises(InputError, match="two ticket ids"):
        load_links(tmp_path / "one.csv")
    with pytest.raises(InputError, match="does not exist"):
        load_links(tmp_path / "nope.csv")


# -- HTML exports ---------------------------------------------------------------------------------------------------
HTML_EXPORT = [
    {"Ticket": "Z1", "Subject": "Printer jams on floor 3",
     "Description": '<div style="font-family:Arial"><p>Hi team,</p><p>The printer jams <b>every</b>&nbsp;morning. '
                    "We tried:</p><ul><li>new toner</li><li>a reboot</li></ul><p>Thanks,<br>Ann</p></div>",
     "Solution": "<p>Replace the pick-up roller.</p><script>track()</script><style>p{color:red}</style>"},
    {"Ticket": "Z2", "Subject": "VPN drops at 5pm",
     "Description": "<p>Log:</p><pre>12:00 connect\n  17:00 timeout (code 809)</pre><p>AT&amp;T line</p>",
     "Solution": "Raise the idle timeout."},
    {"Ticket": "Z3", "Subject": "Outlook asks for the password", "Description": "<p>Since the update.</p>",
     "Solution": ""},
]
HTML_MAPPING = {"id": "Ticket", "subject": "Subject", "description": "Description", "solution": "Solution"}


def write_csv(path: Path, rows: list[dict]) -> Path:
    import csv

    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_columns_a_spreadsheet_leaves_unnamed_at_the_end_are_ignored_where_empty(tmp_path):
    """A spreadsheet's "Save as CSV" keeps columns past the last named one (",," on every line), as its workbook
    does: read as the plain file, a workbook's way; a value in such a column is still an error."""
    plain, saved = tmp_path / "plain.csv", tmp_path / "saved.csv"
    plain.write_text("id,subject,description\nT1,Valve leak,Seal worn\nT2,Pump noise,\n", encoding="utf-8")
    saved.write_text("id,subject,description,,\r\nT1,Valve leak,Seal worn,,\r\nT2,Pump noise,,,\r\n", encoding="utf-8")
    assert load(saved).tickets == load(plain).tickets
    stray = tmp_path / "stray.csv"
    stray.write_text("id,subject,description,,\nT1,Valve leak,Seal,worn,\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"stray\.csv, line 2: the row has 5 fields but the header has 3"):
        load(stray)
    inner = tmp_path / "inner.csv"
    inner.write_text("id,,subject\nT1,,Valve leak\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"line 1, column 2: the header has an empty column name"):
        load(inner)


def test_a_quote_inside_a_field_of_a_tool_export_is_read_as_text(tmp_path):
    """A tool's TSV (or a naive CSV) quotes nothing, and a subject may begin with a quote: read leniently, as
    before, not refused; only a quote that is never closed (which would swallow every later record) is."""
    path = tmp_path / "export.tsv"
    path.write_text('id\tsubject\tdescription\nT1\t"Send" button greyed out\tafter "update" it fails\nT2\tok\tfine\n',
                    encoding="utf-8")
    assert [(t.subject, t.description) for t in load(path, fmt="csv").tickets] == [
        ("Send button greyed out", 'after "update" it fails'), ("ok", "fine")]
    path.write_text('id\tsubject\tdescription\nT1\t"Send button greyed out\tfails\nT2\tok\tfine\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"export\.tsv, line 2: a quoted field opens in this record and is never "
                                         r"closed"):
        load(path, fmt="csv")


def test_a_links_file_with_a_quote_never_closed_is_refused_at_its_line(tmp_path):
    path = tmp_path / "links.csv"
    path.write_text('a,b\n1,2\n3,"4\n5,6\n7,8\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"links.csv, line 3: a quoted field opens in this record and is never "
                                         r"closed.*written twice"):
        load_links(path, None)


def test_a_rich_text_export_is_read_as_the_text_a_browser_shows(tmp_path):
    """Help desks that store HTML export it: with --html auto a field most of whose values hold markup is read as
    HTML, so no tag or style word reaches BM25 or a result card; a value without markup stays as written."""
    warnings: list[str] = []
    data = load(write_csv(tmp_path / "zendesk.csv", HTML_EXPORT), mapping=HTML_MAPPING, warn=warnings.append)
    z1, z2, z3 = data.tickets
    assert z1.description == ("Hi team,\n\nThe printer jams every morning. We tried:\n\n  * new toner\n  * a reboot\n\n"
                              "Thanks,\nAnn")
    assert z1.solution == "Replace the pick-up roller."  # script and style dropped
    assert z2.description == "Log:\n\n12:00 connect\n  17:00 timeout (code 809)\n\nAT&T line"  # <pre> kept as laid out
    assert z2.solution == "Raise the idle timeout." and z3.description == "Since the update."
    assert z1.subject == "Printer jams on floor 3"
    assert warnings == [f"{tmp_path / 'zendesk.csv'}: read 3 of 3 descriptions as HTML (the text a browser shows: "
                        "tags, styles and scripts dropped, paragraphs and list items as lines); --html no keeps them "
                        "as written",
                        f"{tmp_path / 'zendesk.csv'}: read 1 of 2 solutions as HTML (the text a browser shows: "
                        "tags, styles and scripts dropped, paragraphs and list items as lines); --html no keeps them "
                        "as written"]
    raw = load(tmp_path / "zendesk.csv", mapping=HTML_MAPPING, html="no", warn=warnings.append)
    assert raw.tickets[0].description == HTML_EXPORT[0]["Description"] and len(warnings) == 2


def test_plain_text_that_quotes_a_tag_now_and_then_is_kept_as_written(tmp_path):
    """A bug tracker's plain text quotes markup in a few tickets: under auto it stays as written (line breaks,
    "<HTML Source>", "x < 5 and y > 3"), with one line saying how many values hold markup; --html yes reads them."""
    rows = [{"Ticket": f"B{i}", "Subject": f"Crash number {i}", "Description": f"Steps:\n1. open\n2. crash {i}"}
            for i in range(5)]
    rows[0]["Description"] = "Switch to <HTML Source>, then <br> is lost\nwhen x < 5 and y > 3"
    rows[1]["Description"] = "Mail me at <ann@example.com> or see <https://example.com/b/1>"
    path = write_csv(tmp_path / "bugs.csv", rows)
    warnings: list[str] = []
    mapping = {"id": "Ticket", "subject": "Subject", "description": "Description"}
    data = load(path, mapping=mapping, warn=warnings.append)
    assert [t.description for t in data.tickets] == [r["Description"] for r in rows]
    assert warnings == [f"{path}: 1 of 5 descriptions hold HTML markup, too few to read the field as HTML; kept as "
                        "written (--html yes reads them as HTML)"]
    forced = load(path, mapping=mapping, html="yes", warn=warnings.append).tickets
    assert forced[0].description == "Switch to , then\nis lost when x < 5 and y > 3"  # what a browser shows
    assert forced[1:] == data.tickets[1:]  # no markup: as written, even with --html yes


def test_a_ticket_that_holds_only_markup_is_refused_by_id(tmp_path):
    rows = [dict(HTML_EXPORT[0], Ticket="Z9", Subject="", Description='<p><img src="x.png"></p>')] + HTML_EXPORT
    with pytest.raises(InputError, match=r"ticket 'Z9': its subject and description hold no text once read as HTML; "
                                         r"fill in one of them, or import with --html no \(nothing was imported\)"):
        load(write_csv(tmp_path / "z.csv", rows), mapping=HTML_MAPPING)
    assert load(tmp_path / "z.csv", mapping=HTML_MAPPING, html="no").tickets[0].id == "Z9"


def test_html_in_jsonl_exports_and_pair_files_reads_the_same(tmp_path):
    records = [{"id": r["Ticket"], "subject": r["Subject"], "description": r["Description"],
                "solution": r["Solution"]} for r in HTML_EXPORT]
    jsonl = load(write_jsonl(tmp_path / "kb.jsonl", [dict(r, type="ticket") for r in records]))
    csv_data = load(write_csv(tmp_path / "z.csv", HTML_EXPORT), mapping=HTML_MAPPING)
    assert [(t.id, t.description, t.solution) for t in jsonl.tickets] == \
        [(t.id, t.description, t.solution) for t in csv_data.tickets]
    pairs = load(write_jsonl(tmp_path / "q.jsonl", [
        {"type": "query", "id": "Q1", "subject": "jams", "description": "<p>Paper&nbsp;jam</p>"},
        {"type": "query", "id": "Q2", "subject": "vpn", "description": "<p>drops</p>"}]))
    assert [q.description for q in pairs.queries] == ["Paper jam", "drops"]


def test_semeval_text_is_never_read_as_html(tmp_path):
    """SemEval's forum text is plain, however many of its questions quote markup."""
    path = tmp_path / "mini.xml"
    path.write_text(SEMEVAL.replace("Which bank is good?", "Which bank is &lt;b&gt;good&lt;/b&gt;?"), encoding="utf-8")
    warnings: list[str] = []
    assert load(path, warn=warnings.append).queries[0].description == "Which bank is <b>good</b>?"
    assert warnings == []


def test_html_is_decoded_once_and_what_cannot_be_laid_out_keeps_its_words():
    from recommender.data.markup import holds_markup, html_to_text

    # an escaped entity name or a URL's "&timestamp=" shows as written (inscriptis alone would decode it twice)
    assert html_to_text("<p>Write &amp;auml; or &amp;lt;b&amp;gt;: see /v?a=1&amp;timestamp=2&amp;reg=eu</p>") == \
        "Write &auml; or &lt;b&gt;: see /v?a=1&timestamp=2&reg=eu"
    deep = "<p>start</p>" + "<div>" * 3000 + "deep &amp; nested" + "</div>" * 3000
    assert html_to_text(deep) == "start deep & nested"  # past the recursion limit: the words between the tags
    assert html_to_text("<!-- a comment only -->") == ""
    assert [holds_markup(t) for t in ("<p>x</p>", "a<br/>b", "AT&amp;T", "x < 5 and y > 3", "<stdin>",
                                      "<https://example.com>", "<ann@example.com>", "a & b", "")] == \
        [True, True, True, False, False, False, False, False, False]


# -- fields spread over repeated columns (Jira's comments) ------------------------------------------------------------
JIRA_EXPORT = """Summary,Issue key,Description,Comment,Labels,Comment,Comment
Printer jams,HD-1,Tray 2 jams every morning.,29/Nov/26 7:00 AM;ann;Replaced the roller.,it,,29/Nov/26 9:00 AM;bob;Fixed.
VPN drops,HD-2,Drops at 5pm.,,net,,
"""


def test_a_field_spread_over_repeated_columns_joins_them(tmp_path):
    """Jira's CSV export writes one "Comment" column per comment: mapped to the solution, all of them are read
    (empty cells skipped, a blank line between); the id or subject column may not repeat."""
    path = tmp_path / "jira.csv"
    path.write_text(JIRA_EXPORT, encoding="utf-8")
    hd1, hd2 = load(path, mapping={"id": "Issue key", "subject": "Summary", "solution": "Comment"}).tickets
    assert hd1.solution == "29/Nov/26 7:00 AM;ann;Replaced the roller.\n\n29/Nov/26 9:00 AM;bob;Fixed."
    assert hd2.solution == "" and hd1.description == "Tray 2 jams every morning." and hd1.metadata == {"labels": "it"}
    path.write_text(JIRA_EXPORT.replace("Labels", "Summary"), encoding="utf-8")
    with pytest.raises(InputError, match=r"line 1, column 1: the column 'Summary' \(for subject\) appears more than "
                                         r"once; rename one of them"):
        load(path, mapping={"id": "Issue key", "subject": "Summary", "solution": "Comment"})


def test_a_json_list_of_strings_is_one_text(tmp_path):
    path = write_jsonl(tmp_path / "export.jsonl", [
        {"key": "HD-1", "title": "Printer jams", "comments": ["Replaced the roller.", "", None, " Fixed. "]},
        {"key": "HD-2", "title": "VPN drops", "comments": []},
    ])
    mapping = {"id": "key", "subject": "title", "solution": "comments"}
    assert [t.solution for t in load(path, mapping=mapping).tickets] == ["Replaced the roller.\n\nFixed.", ""]
    with pytest.raises(InputError, match=r"field 'subject' must be a string, not list"):
        load(path, mapping={"id": "key", "subject": "comments"})
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"key": "HD-3", "title": "x", "comments": [{"body": "nested"}]}])
    with pytest.raises(InputError, match=r"field 'solution' must be a string or a list of strings, not list"):
        load(bad, mapping=mapping)


def test_a_dotted_name_reads_through_lists_as_jiras_comments(tmp_path):
    """Jira's REST export nests comments as fields.comment.comments[].body: the dotted name reads every body."""
    issue = {"key": "HD-1", "fields": {"summary": "Printer jams", "description": "Tray 2 jams.",
                                       "comment": {"comments": [{"body": "Replaced the roller."}, {"author": "x"},
                                                                {"body": "Fixed."}]}}}
    path = write_jsonl(tmp_path / "issues.jsonl", [issue, {"key": "HD-2", "fields": {"summary": "VPN drops"}}])
    mapping = {"id": "key", "subject": "fields.summary", "description": "fields.description",
               "solution": "fields.comment.comments.body"}
    hd1, hd2 = load(path, mapping=mapping).tickets
    assert hd1.solution == "Replaced the roller.\n\nFixed." and hd2.solution == ""


# -- Excel workbooks ------------------------------------------------------------------------------------------------
def write_xlsx(path: Path, rows: list[list], extra_sheet: bool = False) -> Path:
    from openpyxl import Workbook

    workbook = Workbook()
    sheet = workbook.active
    sheet.title = "Export"
    for row in rows:
        sheet.append(row)
    if extra_sheet:
        workbook.create_sheet("Notes").append(["not", "tickets"])
    workbook.save(path)
    return path


def test_an_excel_export_reads_as_its_csv_would(tmp_path):
    """ServiceNow and Freshdesk export .xlsx: the first sheet is read as the same export saved as CSV (numeric ids
    without ".0", dates in ISO 8601, empty cells empty), with the same mapping, HTML reading and errors by row."""
    import datetime as dt

    rows = [["Number", "Short description", "Description", "Opened", "Priority", None],
            [1606681.0, "Printer jams", "Tray 2 jams every morning.", dt.datetime(2020, 4, 10, 13, 25, 9), 2, None],
            ["INC0010002", "VPN drops", None, dt.date(2021, 1, 5), None, None],
            [None, None, None, None, None, None]]
    path = write_xlsx(tmp_path / "incidents.xlsx", rows, extra_sheet=True)
    data = load(path, mapping={"id": "Number", "subject": "Short description"})
    assert [(t.id, t.subject, t.description) for t in data.tickets] == [
        ("1606681", "Printer jams", "Tray 2 jams every morning."), ("INC0010002", "VPN drops", "")]
    assert data.tickets[0].metadata == {"opened": "2020-04-10 13:25:09", "priority": "2"}
    assert data.tickets[1].metadata == {"opened": "2021-01-05"}
    csv_path = tmp_path / "incidents.csv"
    csv_path.write_text("Number,Short description,Description,Opened,Priority\n"
                        "1606681,Printer jams,Tray 2 jams every morning.,2020-04-10 13:25:09,2\n"
                        "INC0010002,VPN drops,,2021-01-05,\n", encoding="utf-8")
    assert load(csv_path, mapping={"id": "Number", "subject": "Short description"}).tickets == data.tickets
    with pytest.raises(InputError, match=r"row 1: no column 'Title' \(mapped to subject\); the columns found are "
                                         r"'Number', 'Short description'"):
        load(path, mapping={"id": "Number", "subject": "Title"})
    bad = write_xlsx(tmp_path / "bad.xlsx", [["id", "subject"], ["T1", "ok"], ["T1", "different"]])
    with pytest.raises(InputError, match=r"bad\.xlsx, row 3: ticket id 'T1' appears twice with different content"):
        load(bad)


def test_a_formula_the_workbook_holds_no_value_for_is_refused_and_a_computed_one_read(tmp_path):
    """A workbook written by a program holds its formulas uncomputed; openpyxl computes nothing, so such a cell
    read as an empty description, silently. It is refused at its cell; a formula with its value (as a spreadsheet
    saves it) is read as that value."""
    import zipfile

    path = write_xlsx(tmp_path / "generated.xlsx", [["id", "subject", "description"], ["T1", "Valve leak", "Seal"],
                                                    ["T2", "Pump noise", '="Bearing "&"worn"']])
    with pytest.raises(InputError, match=r"generated\.xlsx, row 3, column C: a formula whose value the workbook "
                                         r"does not hold.*open and save the workbook in a spreadsheet"):
        load(path)
    computed = tmp_path / "saved.xlsx"  # the same, with the value a spreadsheet stores beside the formula
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(computed, "w") as out:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.startswith("xl/worksheets/"):
                data, n = re.subn(rb'<c r="C3"([^>]*)><f>(.*?)</f>(<v\s*/>|<v></v>)?</c>',
                                  rb'<c r="C3" t="str"><f>\2</f><v>Bearing worn</v></c>', data)
                assert n == 1, data
            out.writestr(item, data)
    assert [t.description for t in load(computed).tickets] == ["Seal", "Bearing worn"]


def test_a_file_that_is_not_a_workbook_is_refused_with_what_to_do(tmp_path):
    fake = tmp_path / "export.xlsx"
    fake.write_text("id,subject\nT1,Pump\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"export\.xlsx, the workbook: not an Excel workbook that can be read .*save "
                                         r"it again .* as \.xlsx, or export it as CSV \(UTF-8\) \(nothing was imported\)"):
        load(fake)
    empty = write_xlsx(tmp_path / "empty.xlsx", [])
    with pytest.raises(InputError, match=r"row 1: the first sheet \('Export'\) is empty"):
        load(empty)
    with pytest.raises(InputError, match=r"a spreadsheet of a format ticketrec does not read; save it as an Excel "
                                         r"workbook \(\.xlsx\) or as CSV"):
        load(tmp_path / "old.xls")


def test_a_workbook_that_would_unpack_to_far_more_than_an_export_is_refused_unread(tmp_path, monkeypatch):
    """A zip bomb named .xlsx: a part a thousand times its packed size is refused before openpyxl reads it."""
    import zipfile

    from recommender.data.importers import xlsx

    monkeypatch.setattr(xlsx, "_XLSX_PART_BYTES", 8 << 20)  # the limit scaled down, not the check
    path = write_xlsx(tmp_path / "ok.xlsx", [["id", "subject"], ["T1", "Pump"]])
    assert [t.id for t in load(path).tickets] == ["T1"]
    bomb = tmp_path / "bomb.xlsx"
    with zipfile.ZipFile(path) as good, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as bad:
        for part in good.infolist():
            bad.writestr(part, good.read(part.filename))
        bad.writestr("xl/media/padding.bin", b"\0" * (16 << 20))
    with pytest.raises(InputError, match=r"bomb\.xlsx, the workbook: its part 'xl/media/padding\.bin' unpacks to 16 "
                                         r"MiB, [\d,]+ times its packed size, which no export does .*export the "
                                         r"tickets as CSV"):
        load(bomb)
