"""benchmarks/model_age.py: which tickets a model of the oldest share trains on, and its argument checks, which run
before any work (the benchmark itself trains for minutes on SeaMonkey)."""
from __future__ import annotations

import sys

import model_age
import pytest

from recommender.data.records import Ticket


def test_the_oldest_share_is_taken_by_creation_time_not_by_file_order():
    tickets = [Ticket(tid, "s", "", "") for tid in ("c", "a", "d", "b")]
    created = {"a": "2021-03-01 10:00:00+00:00", "b": "2020-01-05 09:00:00+00:00",
               "c": "2024-07-30 00:00:00+00:00", "d": "2020-01-05 09:00:00+00:00"}
    assert [t.id for t in model_age.oldest(tickets, created, 0.5)] == ["b", "d"]  # a tie in time goes by id
    assert [t.id for t in model_age.oldest(tickets, created, 1.0)] == ["b", "d", "a", "c"]
    assert [t.id for t in model_age.oldest(tickets, created, 0.01)] == ["b"]  # never nothing to train on


@pytest.mark.parametrize("argv", [["--fractions", "0"], ["--fractions", "1.5"], ["--fractions", "half"],
                                  ["--seeds", ""], ["--seeds", "one"]])
def test_bad_arguments_are_refused_before_any_work(monkeypatch, argv):
    monkeypatch.setattr(sys, "argv", ["model_age.py", *argv])
    with pytest.raises(SystemExit, match=r"--fractions takes shares in \(0, 1\]"):
        model_age.main()
