"""benchmarks/serving.py: its argument checks run before any work (the benchmark itself needs minutes; this checks
that `--kb real` gets past its data check, which once raised UnboundLocalError whenever the data was there)."""
from __future__ import annotations

import sys

import pytest
import real_kb
import serving


def test_kb_real_with_the_data_reaches_the_next_argument_check(monkeypatch):
    monkeypatch.setattr(real_kb, "available", lambda: True)
    monkeypatch.setattr(sys, "argv", ["serving.py", "--kb", "real", "--loading"])
    with pytest.raises(SystemExit, match="--loading queries the index of a previous run"):
        serving.main()


def test_kb_real_without_the_data_says_what_to_use_instead(monkeypatch):
    monkeypatch.setattr(real_kb, "available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["serving.py", "--kb", "real"])
    with pytest.raises(SystemExit, match="use --kb synthetic"):
        serving.main()
