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


def test_status_says_what_a_reindex_would_bring_in(kb_home, tiny_ticket_model, another_model, tmp_path):
    """`ticketrec status` compares the serving version with the store (tickets new or changed since its build) and
    with the model in TICKETREC_MODEL; after a reindex there is nothing left to say."""
    settings, store = kb_home
    reindex(settings, store, tiny_ticket_model)
    env = {"TICKETREC_HOME": str(settings.home), "TICKETREC_MODEL": str(settings.model), "TICKETREC_BROKER_URL": ""}

    def status() -> tuple[str, dict]:
        text = CliRunner().invoke(main, ["status"], env=env)
        assert text.exit_code == 0, text.output
        return text.output, json.loads(CliRunner().invoke(main, ["status", "--json"], env=env).stdout)["pending"]

    n = store.stats()["tickets"]
    output, pending = status()
    assert pending == {"store_tickets": n, "new": 0, "changed": 0, "other_model": None}
    assert f"tickets   {n:,}, as in the store" in output and "TICKETREC_MODEL holds another" not in output
    first = store.get_ticket(store.ticket_ids()[0])
    store.import_dataset(Dataset([Ticket("RX-1", "Hydraulic accumulator", "Loses precharge overnight.", "Recharge."),
                                  Ticket(first.id, first.subject + " (again)", first.description, first.solution)],
                                 source="new"))
    another_model.save(tmp_path / "another")
    env["TICKETREC_MODEL"] = str(tmp_path / "another")
    output, pending = status()
    assert pending == {"store_tickets": n + 1, "new": 1, "changed": 1, "other_model": another_model.version}
    assert "the store has 1 new, 1 changed since this version: `ticketrec reindex` (or the nightly reindex) brings " \
           "them in" in output
    assert f"model     {tiny_ticket_model.version[:12]} (TICKETREC_MODEL holds another, " \
           f"{another_model.version[:12]}: the next `ticketrec index` or reindex serves it)" in output
    built = CliRunner().invoke(main, ["index"], env=env)
    assert built.exit_code == 0, built.output
    output, pending = status()
    assert pending == {"store_tickets": n + 1, "new": 0, "changed": 0, "other_model": None}
    assert f"model     {another_model.version[:12]}\n" in output
