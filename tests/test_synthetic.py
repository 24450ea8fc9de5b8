"""The synthetic knowledge base: determinism, graded labels, lengths, term mismatch, JSONL round trip."""
from __future__ import annotations

import os
import statistics
from dataclasses import asdict

import pytest

from recommender.errors import InputError
from recommender.data.importers import load
from recommender.data.synthetic import SUBSYSTEMS, generate, problem_classes, write_jsonl


def as_plain(data):
    return ([asdict(t) for t in data.tickets], [asdict(q) for q in data.queries], [asdict(p) for p in data.pairs])


@pytest.fixture(scope="module")
def kb():
    return generate(600, 60, seed=3)


def test_same_seed_same_output_and_other_seed_differs():
    a, b, c = generate(150, 15, seed=7), generate(150, 15, seed=7), generate(150, 15, seed=8)
    assert as_plain(a) == as_plain(b)
    assert as_plain(a) != as_plain(c)
    assert [t.description for t in a.tickets] != [t.description for t in c.tickets]


def test_tickets_do_not_depend_on_the_number_of_queries():
    assert as_plain(generate(100, 0, seed=1))[0] == as_plain(generate(100, 20, seed=1))[0]


def test_counts_and_unique_ids(kb):
    assert len(kb.tickets) == 600 and len(kb.queries) == 60
    assert len({t.id for t in kb.tickets}) == 600 and len({q.id for q in kb.queries}) == 60
    assert len({(p.query_id, p.ticket_id) for p in kb.pairs}) == len(kb.pairs)


def test_many_archetypes_across_subsystems():
    classes = problem_classes()
    assert len({c.archetype for c in classes}) >= 150 and len(classes) >= 450
    assert len(SUBSYSTEMS) >= 10


def test_graded_labels_follow_archetype_cause_and_subsystem(kb):
    tickets = kb.ticket_map()
    qclass = {}
    for p in kb.pairs:
        if p.score == 5.0:
            m = tickets[p.ticket_id].metadata
            qclass.setdefault(p.query_id, set()).add((m["archetype"], m["cause"]))
    assert all(len(v) == 1 for v in qclass.values()) and set(qclass) == {q.id for q in kb.queries}
    seen = set()
    for p in kb.pairs:
        m = tickets[p.ticket_id].metadata
        archetype, cause = next(iter(qclass[p.query_id]))
        same_class = (m["archetype"], m["cause"]) == (archetype, cause)
        same_subsystem = m["subsystem"] == archetype.split("/")[0]
        expected = 5.0 if same_class else 3.0 if same_subsystem else 1.0
        assert p.score == expected
        seen.add(p.score)
    assert seen == {1.0, 3.0, 5.0}
    per_query = [sum(p.query_id == q.id for p in kb.pairs) for q in kb.queries]
    assert 7 <= statistics.mean(per_query) <= 11


def test_lengths_are_asymmetric_like_the_paper(kb):
    def mean_words(items, field):
        return statistics.mean(len(getattr(x, field).split()) for x in items)

    assert 3.5 <= mean_words(kb.tickets, "subject") <= 6.5
    assert 55 <= mean_words(kb.tickets, "description") <= 80
    assert 60 <= mean_words(kb.tickets, "solution") <= 90
    assert all(t.description.count(". ") >= 3 and t.solution.count(". ") >= 3 for t in kb.tickets)
    assert 3 <= mean_words(kb.queries, "subject") <= 7


def test_queries_use_other_words_masks_and_abbreviations(kb):
    queries = " ".join(q.subject + " " + q.description for q in kb.queries)
    tickets = " ".join(t.subject + " " + t.description for t in kb.tickets)
    assert "##" in queries and "XXXX" in queries and "##" in tickets
    abbreviations = {"GT", "ST", "HRSG", "IGV", "IGVs", "LO", "DGS", "MOP"}
    assert abbreviations & set(queries.split())

    def vocab(text):
        return {w.strip(".,?!").lower() for w in text.split()}

    q_vocab, t_vocab = vocab(queries), vocab(tickets)
    assert len(q_vocab - t_vocab) / len(q_vocab) > 0.3  # term mismatch: many query words never occur in tickets


def test_jsonl_round_trip_through_the_importer(tmp_path, kb):
    path = write_jsonl(kb, tmp_path / "sub" / "kb.jsonl")
    back = load(path)
    assert as_plain(back) == as_plain(kb)
    assert not list(tmp_path.glob("sub/.*tmp"))  # the temp file was renamed away
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # an ordinary file, not mkstemp's private one


def test_small_and_bad_sizes():
    tiny = generate(1, 1, seed=0)
    assert len(tiny.tickets) == 1 and [p.score for p in tiny.pairs] == [5.0]
    with pytest.raises(InputError):
        generate(0, 1)
    with pytest.raises(InputError):
        generate(10, 1, overlap=2.0)


def test_few_classes_make_large_clusters_and_the_default_is_a_third_of_the_tickets():
    clustered = generate(300, 5, seed=1, classes=6)
    sizes = {}
    for t in clustered.tickets:
        key = (t.metadata["archetype"], t.metadata["cause"])
        sizes[key] = sizes.get(key, 0) + 1
    assert len(sizes) == 6 and min(sizes.values()) >= 30  # every class recurs
    assert as_plain(generate(60, 3, seed=2, classes=20)) == as_plain(generate(60, 3, seed=2))  # 60 // 3 = 20
    with pytest.raises(InputError):
        generate(10, 1, classes=0)
