"""benchmarks/train_scaling.py: it reads the stage lines label-free training prints, and samples a process tree's
memory (the benchmark itself needs ../shared/data and minutes; this checks its parts)."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from train_scaling import STAGE_LINE, STAGES, TreeMemory, _stage

from recommender.model.unsupervised import _Stages

ROOT = Path(__file__).resolve().parents[1]


def test_every_stage_of_label_free_training_has_a_column():
    source = (ROOT / "recommender" / "model" / "unsupervised.py").read_text(encoding="utf-8")
    names = re.findall(r'with stages\(f?"([^"]+)"\)', source)
    assert len(names) >= 7
    for name in names:
        assert _stage(name) in STAGES.values(), name


def test_a_stage_line_as_training_prints_it_is_read_back():
    lines = []
    stages = _Stages(lines.append)
    with stages("mining pairs"):
        pass
    match = STAGE_LINE.match(lines[0])
    assert match and float(match.group(1)) == stages.seconds["mining pairs"]
    assert _stage(match.group(2)) == "mining"


def test_the_memory_of_a_child_process_is_sampled():
    child = subprocess.Popen([sys.executable, "-c",
                              "import time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
                              "time.sleep(2)"])
    memory = TreeMemory(child.pid, interval=0.1)
    child.wait()
    time.sleep(0.2)
    memory.stop()
    assert memory.peak() >= 300 * 2**20
    assert memory.peak(end=memory.samples[0][0] - 1) == 0
