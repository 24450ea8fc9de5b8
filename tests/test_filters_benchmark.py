"""benchmarks/filters.py runs end to end (on one copy of SeaMonkey, with the tiny model) and prints its table."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEAMONKEY = ROOT.parent / "shared" / "data" / "seamonkey" / "SeaMonkey_bugs.csv"


def test_the_filter_benchmark_prints_a_row_per_filter(tiny_model):
    if not SEAMONKEY.exists():
        pytest.skip(f"SeaMonkey data not found at {SEAMONKEY} (shared benchmark data is not part of the repo)")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "filters.py"), "--model", str(tiny_model[0]),
                          "--kb", str(SEAMONKEY), "--copies", "1", "--queries", "2"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["(none)", "resolution=FIXED", "status!=RESOLVED,VERIFIED",
                                                   "created>=2024-01", "status=RESOLVED and resolution=FIXED,WORKSFORME"]
    assert rows[0].split("|")[2].strip() == "100.0%"  # no filter: every ticket
    assert "1,076 tickets" in out.stdout and "metadata table holds" in out.stdout
