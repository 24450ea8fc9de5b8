"""How label-free training grows with the knowledge base: time per stage and peak memory of `ticketrec train`.

A help desk installs ticketrec with thousands of old tickets and no labelled pairs, and its first step is `ticketrec
train` (no --train). This runs that step as a user would, on real-vocabulary knowledge bases of several sizes
(`real_kb.py`: SeaMonkey and SemEval-2016 sentences recombined into n tickets with solutions), each in a fresh home:
`ticketrec import`, then `ticketrec train --out …` in a child process whose process tree's resident memory is sampled
twice a second. It prints one row per size: the mined pairs, each stage's seconds (the training's own stage lines),
the wall time, the peak RSS and the stage in which it was reached.

    .venv/bin/python benchmarks/train_scaling.py --tickets 1000,4000 [--no-pretrained] [--seed 0] [--threads 1]
        [--workdir DIR]

Without `--no-pretrained` it trains the default (with the sentence encoder S); with it, the paper's channels.
`--threads` is `ticketrec train --threads` (S's fine-tuning on that many torch threads; default 1). Each row ends
with the model's version, so that runs at two commits can be told to train the same model or not. Homes,
models and logs stay in `--workdir` (default: a new temporary directory, kept). Needs `../shared/data/` (exit 2 with
one line without it) and psutil (installed with the dev extra).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from real_kb import RealDataMissing, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
#: A stage line of label-free training (`unsupervised._Stages`): "[  306.8 s] adapting the sentence encoder S …".
STAGE_LINE = re.compile(r"^\[\s*([\d.]+) s\] (.+)$")
#: Short column names of the stages, in the order training runs them.
STAGES = {"word vectors": "word2vec, Punkt, DocNADE", "mining pairs": "mining", "adapting the sentence": "adapt S",
          "fitting the static": "fit static S", "preparing texts": "prepare texts", "training the Siamese": "train LSTM",
          "selecting channel": "select weights", "re-selecting the channel": "select on labels",
          "calibrating": "calibrate"}


def _stage(line: str) -> str:
    """The short name of a stage line's stage (its own text when unknown)."""
    return next((short for start, short in STAGES.items() if line.startswith(start)), line)


class TreeMemory:
    """Samples the resident memory of a process and its descendants every `interval` seconds, in a thread."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.process, self.interval, self.samples = psutil.Process(pid), interval, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss = sum(p.memory_info().rss for p in [self.process, *self.process.children(recursive=True)])
            except psutil.Error:  # a child ended between listing and reading: sample again
                rss = None
            if rss is not None:
                self.samples.append((time.monotonic(), rss))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, start: float = float("-inf"), end: float = float("inf")) -> int:
        """The largest sample taken between `start` and `end` (time.monotonic()), 0 when none."""
        return max((rss for t, rss in self.samples if start <= t <= end), default=0)


def run_cli(args: list[str], env: dict, log: Path) -> subprocess.CompletedProcess:
    """`python -m recommender.cli ARGS` from the repository root (this checkout's code), output kept in `log`."""
    done = subprocess.run([sys.executable, "-m", "recommender.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    log.write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode:
        raise SystemExit(f"`ticketrec {' '.join(args)}` failed (exit {done.returncode}); see {log}")
    return done


def train_measured(env: dict, out: Path, pretrained: bool, seed: int, log: Path, threads: int = 1) -> dict:
    """`ticketrec train` (label-free) with its memory sampled: stage seconds, wall, peak RSS and where it was."""
    command = [sys.executable, "-m", "recommender.cli", "train", "--out", str(out), "--seed", str(seed),
               "--pretrained" if pretrained else "--no-pretrained", "--threads", str(threads)]
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        memory = TreeMemory(proc.pid)
        stdout: list[str] = []
        reader = threading.Thread(target=lambda: stdout.extend(proc.stdout), daemon=True)
        reader.start()
        stages, line = [], ""  # (short name, seconds, end time)
        for char in iter(lambda: proc.stderr.read(1), ""):  # progress bars redraw with \r: split on both
            if char not in "\r\n":
                line += char
                continue
            err.write(line + char)
            match = STAGE_LINE.match(line.strip())
            if match:
                stages.append((_stage(match.group(2)), float(match.group(1)), time.monotonic()))
            line = ""
        proc.wait()
        reader.join()
        memory.stop()
    if proc.returncode:
        raise SystemExit(f"`ticketrec train` failed (exit {proc.returncode}); see {log}")
    printed = "".join(stdout)  # word2vec's progress lines, then the JSON summary
    report = json.loads(printed[printed.index("{"):])
    peak, where = memory.peak(), "?"
    for name, seconds, end in stages:
        if memory.peak(end - seconds - 1.0, end + 0.5) >= peak:
            where = name
            break
    return {"stages": {name: seconds for name, seconds, _ in stages}, "wall": time.monotonic() - started,
            "peak": peak, "peak_stage": where, "mined_pairs": report["mined_pairs"], "version": report["version"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tickets", default="1000,4000", help="knowledge-base sizes, comma-separated")
    ap.add_argument("--pretrained", action=argparse.BooleanOptionalAction, default=True,
                    help="the default with S (--pretrained) or the paper's channels (--no-pretrained)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="ticketrec train --threads: S's fine-tuning on N torch threads (default 1)")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    sizes = [int(n) for n in args.tickets.split(",")]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ticketrec-train-scaling-"))
    rows = []
    for n in sizes:
        home = work / f"home-{n}"
        home.mkdir(parents=True, exist_ok=True)
        store = home / "ticketrec.sqlite3"  # in the home even when the caller's environment sets another store
        env = {**os.environ, "TICKETREC_HOME": str(home), "TICKETREC_DB": str(store)}
        env.pop("TICKETREC_MODEL", None)
        try:
            kb = write_jsonl(work / f"real-{n}.jsonl", n)
        except RealDataMissing as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if not store.exists():  # a --workdir used before: its knowledge base is imported already
            run_cli(["import", str(kb), "--quiet"], env, work / f"import-{n}.log")
        print(f"training on {n:,} tickets (log: {work / f'train-{n}.log'}) ...", file=sys.stderr, flush=True)
        rows.append((n, train_measured(env, home / "models" / "label-free", args.pretrained, args.seed,
                                       work / f"train-{n}.log", args.threads)))
    names = list(dict.fromkeys(name for _, r in rows for name in r["stages"]))
    config = "default (S)" if args.pretrained else "paper's channels"
    print(f"\nlabel-free `ticketrec train`, {config}, seed {args.seed}, {os.cpu_count()} CPUs, S fine-tuned on "
          f"{args.threads} torch thread(s); seconds per stage\n")
    print("| tickets | mined pairs | " + " | ".join(names) + " | wall | peak RSS (stage) | model |")
    print("|---" * (len(names) + 5) + "|")
    for n, r in rows:
        cells = [f"{r['stages'][name]:.0f}" if name in r["stages"] else "–" for name in names]
        print(f"| {n:,} | {r['mined_pairs']:,} | " + " | ".join(cells)
              + f" | {r['wall'] / 60:.1f} min | {r['peak'] / 2**30:.2f} GiB ({r['peak_stage']}) | {r['version']} |")
    flag = ("" if args.pretrained else " --no-pretrained") + (f" --threads {args.threads}" if args.threads != 1 else "")
    print(f"\ncommand: .venv/bin/python benchmarks/train_scaling.py --tickets {args.tickets}{flag} --seed {args.seed}"
          f"\nworkdir: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
