"""SemEval-2016/2017 Task 3 (English, subtask B) XML: original questions as queries, related questions as
tickets (their good comments as the solution), relevance labels as pairs; parsed without entity expansion."""
from __future__ import annotations

from ...errors import InputError
from ..records import LabeledPair, Query, Ticket, check_id
from .parsed import Parsed, progress_bar, shown


#: SemEval-2016/2017 Task 3 subtask B relevance of a related question to the original one → the 1–5 scale.
SEMEVAL_LABELS = {"PerfectMatch": 5.0, "Relevant": 3.0, "Irrelevant": 1.0}


def _iterparse(source, events):
    """`iterparse` that refuses entity declarations and external references (billion laughs, XXE).

    defusedxml is a dependency of nltk (pinned in setup.cfg), so it is always installed with ticketrec.
    """
    from defusedxml.ElementTree import iterparse

    return iterparse(source, events, forbid_dtd=False, forbid_entities=True, forbid_external=True)


def _semeval_where(element) -> str:
    for attr in ("RELQ_ID", "ORGQ_ID", "THREAD_SEQUENCE"):
        if element.get(attr):
            value = element.get(attr)
            return f"element <{element.tag} {attr}=\"{value if len(value) <= 60 else value[:59] + '…'}\">"
    return f"element <{element.tag}>"


def _parse_orgquestion(parsed: Parsed, org) -> None:
    where = _semeval_where(org)
    orgq_id = (org.get("ORGQ_ID") or "").strip()
    if not orgq_id:
        raise parsed.fail(where, "OrgQuestion without ORGQ_ID", "every OrgQuestion needs an ORGQ_ID attribute")
    try:
        check_id(orgq_id, "ORGQ_ID")
    except InputError as exc:
        raise parsed.fail(where, str(exc)) from None
    query = Query(parsed.clip("query", orgq_id, "subject", (org.findtext("OrgQSubject") or "").strip()),
                  parsed.clip("query", orgq_id, "description", (org.findtext("OrgQBody") or "").strip()), orgq_id)
    if not query.subject and not query.description:
        raise parsed.fail(where, "OrgQuestion has neither OrgQSubject nor OrgQBody text")
    parsed.add_query(query, where)
    for thread in org.iter("Thread"):
        rel = thread.find("RelQuestion")
        if rel is None:
            raise parsed.fail(_semeval_where(thread), "Thread without RelQuestion")
        rwhere = _semeval_where(rel)
        relq_id = (rel.get("RELQ_ID") or "").strip()
        if not relq_id:
            raise parsed.fail(rwhere + f" under ORGQ_ID {orgq_id!r}", "RelQuestion without RELQ_ID")
        try:
            check_id(relq_id, "RELQ_ID")
        except InputError as exc:
            raise parsed.fail(rwhere, str(exc)) from None
        rank_text = rel.get("RELQ_RANKING_ORDER")
        try:
            ir_rank = int(rank_text) if rank_text not in (None, "") else None
        except ValueError:
            raise parsed.fail(rwhere, f"RELQ_RANKING_ORDER {shown(rank_text)} is not an integer") from None
        comments = thread.findall("RelComment")
        good = [c for c in comments if c.get("RELC_RELEVANCE2RELQ") == "Good"] or comments
        solution = "\n".join(t for t in ((c.findtext("RelCText") or "").strip() for c in good) if t)
        metadata = {"format": "semeval", "orgq_id": orgq_id, "ir_rank": ir_rank,
                    "category": rel.get("RELQ_CATEGORY", ""), "date": rel.get("RELQ_DATE", "")}
        texts = {"subject": (rel.findtext("RelQSubject") or "").strip(),
                 "description": (rel.findtext("RelQBody") or "").strip(), "solution": solution}
        ticket = Ticket(relq_id, *(parsed.clip("ticket", relq_id, k, v) for k, v in texts.items()), metadata)
        if relq_id in parsed.tickets:  # one related question under several originals: one ticket (the first)
            first = parsed.tickets[relq_id]
            if (first.subject, first.description, first.solution) != (ticket.subject, ticket.description,
                                                                      ticket.solution):
                raise parsed.fail(rwhere, f"RELQ_ID {relq_id!r} appears twice with different text",
                                  "related questions with one id must be identical")
        else:
            parsed.tickets[relq_id] = ticket
        label = rel.get("RELQ_RELEVANCE2ORGQ")
        if label in (None, "", "?"):  # an unlabelled (test) file: tickets and queries, no pair
            continue
        if label not in SEMEVAL_LABELS:
            raise parsed.fail(rwhere, f"unknown RELQ_RELEVANCE2ORGQ {shown(label)}",
                              "use PerfectMatch, Relevant or Irrelevant")
        parsed.add_pair(LabeledPair(orgq_id, relq_id, SEMEVAL_LABELS[label]), rwhere,
                        {"ir_rank": ir_rank, "semeval_label": label})


def parse_semeval(parsed: Parsed, progress: bool) -> None:
    """Read a SemEval-2016/2017 Task 3 XML file into `parsed`, one OrgQuestion at a time."""
    import xml.etree.ElementTree as ET

    from defusedxml import DefusedXmlException

    seen_root = False
    with open(parsed.path, "rb") as raw, progress_bar(parsed.path, progress) as bar:
        try:
            for event, element in _iterparse(raw, ("start", "end")):
                if event == "start":
                    seen_root = True
                    continue
                if element.tag == "OrgQuestion":
                    _parse_orgquestion(parsed, element)
                    element.clear()
                    bar.update(raw.tell() - bar.n)
        except ET.ParseError as exc:
            line, column = getattr(exc, "position", (0, 0))
            raise parsed.fail(f"line {line}, column {column}", f"bad XML ({exc})",
                              "fix the file or give --format for what it really is") from None
        except DefusedXmlException as exc:
            raise parsed.fail("the DTD", f"unsafe XML refused ({type(exc).__name__})",
                              "remove entity declarations and external references from the file") from None
    if not seen_root or not (parsed.queries or parsed.tickets):
        raise parsed.fail("the root element", "no OrgQuestion element found",
                          "give a SemEval-2016/2017 Task 3 English (subtask B) file")
