"""docker-compose.yml cannot run here (no Docker engine): check that it names only real commands and settings."""
import importlib
import shlex
from pathlib import Path

import pytest
import yaml

from recommender.cli import main
from recommender.config import ENV_VARS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _command(service: dict) -> list[str]:
    cmd = service.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else list(cmd)


def test_every_service_is_there(compose):
    assert {"elasticsearch", "redis", "web", "worker", "beat"} <= set(compose["services"])
    es = compose["services"]["elasticsearch"]["environment"]
    assert es["discovery.type"] == "single-node" and "xpack.security.enabled" in es


def test_every_ticketrec_command_exists_in_the_cli_and_parses(compose):
    checked = 0
    for name, service in compose["services"].items():
        argv = _command(service)
        if not argv or argv[0] != "ticketrec":
            continue
        sub = main.commands.get(argv[1])
        assert sub is not None, f"service {name}: `ticketrec {argv[1]}` is not a CLI command"
        sub.make_context(argv[1], argv[2:])  # raises on an unknown option or a bad value
        checked += 1
    assert checked >= 2  # worker and beat


def test_gunicorn_serves_the_web_app_factory(compose):
    argv = _command(compose["services"]["web"])
    assert argv[0] == "gunicorn"
    module, call = argv[-1].split(":")
    assert call.endswith("()")
    factory = getattr(importlib.import_module(module), call[:-2])
    assert callable(factory)


def test_every_environment_variable_is_a_setting(compose):
    seen = set()
    for name, service in compose["services"].items():
        env = service.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        for var in env:
            if var.startswith("TICKETREC_"):
                assert var in ENV_VARS, f"service {name} sets {var}, which recommender.config does not read"
                seen.add(var)
    assert {"TICKETREC_HOME", "TICKETREC_BROKER_URL", "TICKETREC_ES_URL", "TICKETREC_PREFILTER"} <= seen


def test_ticketrec_services_share_the_home_volume(compose):
    mounts = {}
    for name in ("web", "worker", "beat"):
        service = compose["services"][name]
        home = service["environment"]["TICKETREC_HOME"]
        vols = [v for v in service["volumes"] if v.split(":")[1] == home]
        assert vols, f"{name} does not mount a volume at TICKETREC_HOME={home}"
        mounts[name] = vols[0].split(":")[0]
    assert len(set(mounts.values())) == 1 and next(iter(mounts.values())) in compose["volumes"]


def test_ticketrec_services_restart_when_they_die(compose):
    """web, worker and beat come back by themselves (Redis going away must not leave them down for good)."""
    for name in ("web", "worker", "beat"):
        policy = compose["services"][name].get("restart")
        assert policy in ("unless-stopped", "on-failure", "always"), f"{name} has restart: {policy!r}"
    assert compose["services"]["redis"].get("restart") in ("unless-stopped", "always")
