"""serving.reindex: the one reindex body of `ticketrec index`/`reindex` and the Celery task."""
import ast
import json
from pathlib import Path

from click.testing import CliRunner

from recommender.cli import main
from recommender.data.records import Ticket
from recommender.data.store import Dataset
from recommender.serving.index import current_version, list_versions
from recommender.serving.reindex import reindex

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"version", "path", "n_tickets", "encoded", "reused", "dtype", "model_version", "seconds"}


def test_reindex_builds_switches_and_prunes(kb_home, tiny_ticket_model):
    settings, store = kb_home
    n = store.stats()["tickets"]
    first = reindex(settings, store, tiny_ticket_model)
    assert set(first) == KEYS and first["version"] == current_version(settings)
    assert first["n_tickets"] == n == first["encoded"] and first["model_version"] == tiny_ticket_model.version
    store.import_dataset(Dataset([Ticket("RX-1", "Hydraulic accumulator", "Loses precharge overnight.",
                                         "Recharge it.")], source="new"))
    second = reindex(settings, store)  # the model of the settings, loaded here
    assert second["version"] != first["version"] == list_versions(settings)[0]
    assert (second["n_tickets"], second["encoded"], second["reused"]) == (n + 1, 1, n)
    for _ in range(settings.keep_indexes + 1):
        last = reindex(settings, store, tiny_ticket_model, full=True)
        assert last["encoded"] == n + 1
    assert len(list_versions(settings)) == settings.keep_indexes and current_version(settings) == last["version"]


def test_reindex_without_a_store_opens_the_settings_database(kb_home):
    settings, _ = kb_home
    result = reindex(settings)
    assert current_version(settings) == result["version"] and result["encoded"] == result["n_tickets"] > 0


def test_cli_index_and_reindex_print_what_reindex_returns(kb_home):
    settings, _ = kb_home
    env = {"TICKETREC_HOME": str(settings.home), "TICKETREC_MODEL": str(settings.model), "TICKETREC_BROKER_URL": ""}
    built = CliRunner().invoke(main, ["index"], env=env)
    assert built.exit_code == 0, built.output
    info = json.loads(built.stdout[built.stdout.index("{"):])
    assert set(info) == KEYS and info["version"] == current_version(settings)
    again = CliRunner().invoke(main, ["reindex", "--full"], env=env)
    assert again.exit_code == 0, again.output
    info2 = json.loads(again.stdout[again.stdout.index("{"):])
    assert set(info2) == KEYS and info2["version"] != info["version"] and info2["encoded"] == info["n_tickets"]


def _calls(path: Path, function: str) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    return {c.func.id if isinstance(c.func, ast.Name) else c.func.attr for c in ast.walk(body)
            if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute))}


def test_the_cli_and_the_worker_share_the_one_body():
    for path, function in ((ROOT / "recommender" / "cli" / "serving.py", "_build_index_here"),
                           (ROOT / "workers" / "tasks.py", "reindex")):
        calls = _calls(path, function)
        assert "reindex_here" in calls and not {"build_index", "switch_current", "prune"} & calls, path
