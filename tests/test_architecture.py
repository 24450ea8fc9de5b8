"""The import contracts of .importlinter hold: `lint-imports` (import-linter) from the repository root keeps them all.

Arrows point one way: web, workers -> recommender -> topic_models; inside recommender
cli -> evaluation -> serving -> model -> lexical -> data -> config -> files -> errors; no cycles.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("recommender", "topic_models", "web", "workers")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` run in `root`, which is first on the path, so the packages there are the ones analysed."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_every_import_contract_is_kept():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_backward_import_breaks_the_layers(tmp_path):
    """The check can fail: a copy of the code where the lexical layer imports serving is reported."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    analyzer = tmp_path / "recommender" / "lexical" / "analyzer.py"
    analyzer.write_text(analyzer.read_text() + "\n\ndef _backward():\n    from ..serving import index  # noqa: F401\n")
    result = _lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "recommender.lexical.analyzer -> recommender.serving.index" in result.stdout
    assert re.search(r"Contracts: \d+ kept, [1-9]\d* broken", result.stdout), result.stdout
