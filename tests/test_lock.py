"""requirements.lock agrees with setup.cfg: every requirement is pinned to a version its range allows, torch is the
CPU build, and no CUDA package is pinned (regenerate with `make lock` when this fails)."""
import configparser
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line):
            pins[canonicalize_name(m[1])] = Version(m[2])
    return pins


def _requirements() -> list[Requirement]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in ("dev", "pretrained"):
        lines += cfg["options.extras_require"][extra].splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.strip().startswith("#")]


def test_every_requirement_is_pinned_within_its_range():
    pins = _pins()
    requirements = _requirements()
    assert len(requirements) > 20
    for req in requirements:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements.lock: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"requirements.lock pins {req.name}=={pins[name]}, outside {req.specifier}: run `make lock`"


def test_torch_is_the_cpu_build_and_nothing_pulls_cuda():
    pins = _pins()
    assert str(pins["torch"]) == "2.13.0+cpu"
    assert not [name for name in pins if name.startswith(("nvidia-", "cuda-")) or name == "triton"]
