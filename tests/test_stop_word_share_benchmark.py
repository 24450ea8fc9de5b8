"""benchmarks/stop_word_share.py: its hand-written non-English tickets fall below the warning's share."""
from __future__ import annotations

from stop_word_share import FRENCH, GERMAN

from recommender.lexical.analyzer import ENGLISH_STOP_SHARE, stop_word_share


def test_the_non_english_samples_read_as_not_english_and_english_text_does():
    for tickets in (GERMAN, FRENCH):
        assert stop_word_share(" ".join(t) for t in tickets) < ENGLISH_STOP_SHARE
    english = "The printer on the second floor stopped printing after the update; we reinstalled the driver."
    assert stop_word_share([english]) > 0.3 and stop_word_share([]) == 0.0
