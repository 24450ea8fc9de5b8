"""benchmarks/score_promises.py: which knowledge bases it reads, what counts as a tie and as coming first."""
from __future__ import annotations

import json
from types import SimpleNamespace

from score_promises import OFF_TOPIC, Pasted, knowledge_base_tickets, off_topic_queries, shows_a_tie


def test_a_tie_is_two_results_showing_the_same_score_at_two_decimals():
    shown = [SimpleNamespace(score=s) for s in (4.8123, 4.8149, 3.1)]
    assert shows_a_tie(shown)
    assert not shows_a_tie([SimpleNamespace(score=s) for s in (4.8123, 4.7949, 3.1)])
    assert not shows_a_tie([])


def test_a_json_lines_knowledge_base_is_read_as_ticketrec_imports_it(tmp_path):
    path = tmp_path / "kb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        {"type": "ticket", "id": "T1", "subject": "Pump seal leak", "description": "Oil under the pump.",
         "solution": "Replaced the seal."},
        {"type": "ticket", "id": "T2", "subject": "VPN drops", "description": "Tunnel resets hourly."})),
        encoding="utf-8")
    tickets = knowledge_base_tickets(str(path))
    assert [(t.id, t.subject) for t in tickets] == [("T1", "Pump seal leak"), ("T2", "VPN drops")]


def test_a_csv_knowledge_base_is_read_with_seamonkeys_columns(tmp_path):
    path = tmp_path / "bugs.csv"
    path.write_text("Summary,Issue id,Description\nCrash on start,101,It crashes.\n", encoding="utf-8")
    assert [(t.id, t.subject, t.description) for t in knowledge_base_tickets(str(path))] == [
        ("101", "Crash on start", "It crashes.")]


def test_each_off_topic_query_is_asked_with_its_description_and_as_its_subject_alone():
    queries = off_topic_queries()
    assert [(q.subject, q.description) for q in queries] == (
        [(s, d) for s, d in OFF_TOPIC] + [(s, "") for s, _ in OFF_TOPIC])


def test_a_pasted_ticket_after_its_copies_is_first_of_its_text_only():
    def result(tid, same_text_as=None):
        return SimpleNamespace(ticket=SimpleNamespace(id=tid), same_text_as=same_text_as)

    after_copy = Pasted("B", [result("A"), result("B", same_text_as="A"), result("C")])
    assert not after_copy.first and after_copy.first_of_its_text
    after_other = Pasted("B", [result("C"), result("A"), result("B", same_text_as="A")])  # its copy is not first
    assert not after_other.first_of_its_text
    assert Pasted("A", [result("A"), result("B", same_text_as="A")]).first_of_its_text
    assert not Pasted("Z", [result("A")]).first_of_its_text  # not in its top 10
