"""benchmarks/feedback_links.py and the feedback split it shares with feedback_seamonkey.py."""
from __future__ import annotations

from feedback_links import K, follow, groups_of
from shared_data import feedback_split


def test_the_feedback_split_is_seeded_and_its_halves_swap():
    links = [(str(i), str(i + 100)) for i in range(11)]
    given, held_out = feedback_split(links, seed=3, half=0)
    assert feedback_split(links, seed=3, half=0) == (given, held_out)
    assert feedback_split(links, seed=3, half=1) == (held_out, given)
    assert sorted(given + held_out) == sorted(links) and len(given) == 5
    assert feedback_split(links, seed=4, half=0) != (given, held_out)


def test_linked_groups_chain_the_judged_pairs():
    groups = groups_of([("a", "b"), ("b", "c"), ("x", "y")])
    assert groups["a"] == {"b", "c"} and groups["c"] == {"a", "b"}
    assert groups["x"] == {"y"} and "z" not in groups


def test_a_results_linked_tickets_follow_it_by_their_own_score_and_the_query_ticket_never_shows():
    ranked = [(f"t{i}", 1.0 - i / 100) for i in range(30)]  # t0 best … t29 worst; the query q is not ranked
    groups = groups_of([("t1", "t25"), ("t1", "t20"), ("t1", "q"), ("t2", "t3")])
    top = follow(ranked, groups)
    assert top[:5] == ["t0", "t1", "t20", "t25", "t2"]  # t20 scores above t25
    assert top[5] == "t3" and "q" not in top  # t3 moved up to follow t2, not shown twice
    assert len(top) == K and len(set(top)) == K
    assert follow(ranked, {}) == [t for t, _ in ranked[:K]]
