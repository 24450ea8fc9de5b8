"""serving.reindex: the one reindex body of `ticketrec index`/`reindex` and the Celery task."""
import ast
import json
from pathlib import Path

from click.testing import CliRunner

from recommender.cli import main
from recommender.cli.common import when
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

    def status(part: str = "pending") -> tuple[str, dict]:
        text = CliRunner().invoke(main, ["status"], env=env)
        assert text.exit_code == 0, text.output
        return text.output, json.loads(CliRunner().invoke(main, ["status", "--json"], env=env).stdout)[part]

    n = store.stats()["tickets"]
    output, pending = status()
    assert pending == {"store_tickets": n, "new": 0, "changed": 0, "removed": 0, "other_model": None}
    assert f"tickets   {n:,}, as in the store" in output and "TICKETREC_MODEL holds another" not in output
    # the served model: when it was trained, on how many tickets, and the store's changes since (this store was
    # filled after the model was trained, so every ticket counts)
    trained = tiny_ticket_model.meta["training"]["trained_at"]
    assert status("model_trained")[1] == {"trained_at": trained, "tickets": n, "changed_since": n}
    assert f"trained   {when(trained)} on {n:,} tickets; {n:,} tickets added or changed since (when to retrain" \
        in output
    first = store.get_ticket(store.ticket_ids()[0])
    store.import_dataset(Dataset([Ticket("RX-1", "Hydraulic accumulator", "Loses precharge overnight.", "Recharge."),
                                  Ticket(first.id, first.subject + " (again)", first.description, first.solution)],
                                 source="new"))
    assert status("model_trained")[1]["changed_since"] == n + 1  # one new ticket, one changed
    another_model.save(tmp_path / "another")
    env["TICKETREC_MODEL"] = str(tmp_path / "another")
    output, pending = status()
    assert pending == {"store_tickets": n + 1, "new": 1, "changed": 1, "removed": 0,
                       "other_model": another_model.version}
    assert "the store has 1 new, 1 changed since this version: `ticketrec reindex` (or the nightly reindex) brings " \
           "them in" in output
    assert f"model     {tiny_ticket_model.version[:12]} (TICKETREC_MODEL holds another, " \
           f"{another_model.version[:12]}: the next `ticketrec index` or reindex serves it)" in output
    built = CliRunner().invoke(main, ["index"], env=env)
    assert built.exit_code == 0, built.output
    output, pending = status()
    assert pending == {"store_tickets": n + 1, "new": 0, "changed": 0, "removed": 0, "other_model": None}
    assert f"model     {another_model.version[:12]}\n" in output


def test_removed_tickets_leave_results_at_once_and_the_index_at_the_next_reindex(kb_home, tiny_ticket_model):
    """`ticketrec remove`: the ticket, its labelled pairs and its feedback go in one transaction; results leave it out
    at once and still hold k tickets; status counts it until the reindex drops it from the index."""
    from recommender.data.store import Feedback
    from recommender.serving.engine import Recommender
    from recommender.data.records import LabeledPair, Query

    settings, store = kb_home
    reindex(settings, store, tiny_ticket_model)
    env = {"TICKETREC_HOME": str(settings.home), "TICKETREC_MODEL": str(settings.model), "TICKETREC_BROKER_URL": "",
           "TICKETREC_CANDIDATES": "0"}
    query = Query("valve seal leak", "Actuator pressure drops, gasket leaking.")
    before = [r.ticket.id for r in Recommender(settings, store=store, model=tiny_ticket_model).recommend(query, 5)]
    gone = before[:2]
    store.import_dataset(Dataset([], [Query(query.subject, query.description, "Q-RM")],
                                 [LabeledPair("Q-RM", gone[0], 5.0), LabeledPair("Q-RM", before[2], 3.0)],
                                 source="judged"))
    store.add_feedback(Feedback(query.subject, query.description, gone[1], "YES"))
    n, pairs, feedback = store.stats()["tickets"], store.stats()["pairs"], store.stats()["feedback"]

    refused = CliRunner().invoke(main, ["remove", *gone], env=env)  # no one to confirm: nothing removed
    assert refused.exit_code == 1 and "add --yes" in refused.output and store.stats()["tickets"] == n
    unknown = CliRunner().invoke(main, ["remove", gone[0], "NO-SUCH-ID", "--yes"], env=env)
    assert unknown.exit_code == 1 and "'NO-SUCH-ID'" in unknown.output and "nothing was removed" in unknown.output
    assert store.stats()["tickets"] == n
    removed = CliRunner().invoke(main, ["remove", gone[0], gone[1], "--yes"], env=env)
    assert removed.exit_code == 0, removed.output
    assert f"removed 2 tickets, 1 labelled pair, 1 feedback judgement; the knowledge base now holds {n - 2:,}" \
        in removed.output
    assert store.stats() | {"queries": 0} == {"tickets": n - 2, "queries": 0, "pairs": pairs - 1,
                                             "feedback": feedback - 1}
    assert [(p.query_id, p.ticket_id) for p in store.pairs()] == [("Q-RM", before[2])]
    assert store.get_tickets(gone) == [] and not {tid for tid, _ in _fts(store, query)} & set(gone)

    after = [r.ticket.id for r in Recommender(settings, store=store, model=tiny_ticket_model).recommend(query, 5)]
    assert after[:3] == before[2:] and len(after) == 5 and not set(gone) & set(after)  # the next ones move up
    status = CliRunner().invoke(main, ["status"], env=env)
    assert "the store has 2 removed since this version" in status.output, status.output
    assert "(removed ones are already left out of results)" in status.output
    assert CliRunner().invoke(main, ["reindex"], env=env).exit_code == 0
    pending = json.loads(CliRunner().invoke(main, ["status", "--json"], env=env).stdout)["pending"]
    assert pending["removed"] == 0 and pending["store_tickets"] == n - 2


def _fts(store, query):
    from recommender.lexical.searchers import Fts5Searcher

    return Fts5Searcher(store).search(f"{query.subject} {query.description}", 50)


def test_a_build_drops_removed_tickets_from_a_fed_prefilter(kb_home, tiny_ticket_model):
    """The Elasticsearch pre-filter is fed by the build; removed tickets leave it there too (here the in-memory
    backend, which keeps the same `index` / `remove` contract)."""
    from recommender.lexical.searchers import MemorySearcher
    from recommender.serving.index_build import build_index

    settings, store = kb_home
    tickets = list(store.iter_tickets())
    fed = MemorySearcher(tickets)
    build_index(store, tiny_ticket_model, settings, progress=False, prefilter=fed)
    assert fed.count() == len(tickets)
    gone = tickets[0]
    assert fed.search(gone.subject, 1)[0][0] == gone.id
    store.remove_tickets([gone.id])
    build_index(store, tiny_ticket_model, settings, progress=False, prefilter=fed)
    assert fed.count() == len(tickets) - 1 and gone.id not in {tid for tid, _ in fed.search(gone.subject, 50)}
    assert fed.remove(["not-there"]) == 0


def test_a_prefilter_that_cannot_drop_removed_tickets_does_not_fail_the_build(kb_home, tiny_ticket_model, caplog):
    """Elasticsearch down when a build would drop removed tickets from it: the new version serves anyway (a candidate
    the index lacks is skipped) and the log says how to mend the pre-filter."""
    from recommender.lexical.searchers import ElasticsearchSearcher
    from recommender.serving.index import open_current
    from recommender.serving.index_build import build_index

    settings, store = kb_home
    build_index(store, tiny_ticket_model, settings, progress=False)
    store.remove_tickets([store.ticket_ids()[0]])
    dead = ElasticsearchSearcher("http://127.0.0.1:9", "tickets-test", request_timeout=2.0)  # nothing listens
    build_index(store, tiny_ticket_model, settings, progress=False, prefilter=dead)
    assert len(open_current(settings)) == store.stats()["tickets"]
    assert "`ticketrec prefilter-index` rebuilds it" in caplog.text
