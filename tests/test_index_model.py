"""An index version is a deployable unit: it carries the model it was encoded with (model/, checksums in the
manifest), readers serve that model, a missing or corrupt copy is a one-line error naming the fix, and the CLI
works from a fresh home with `train --out M` then `index --model M` (no TICKETREC_MODEL anywhere)."""
import json
import logging

import numpy as np
import pytest
from click.testing import CliRunner

from recommender.cli import main
from recommender.config import Settings
from recommender.data.records import Query, Ticket
from recommender.data.store import Dataset, Store
from recommender.errors import IndexStateError
from recommender.model.bundle import TicketModel
from recommender.serving.engine import Recommender
from recommender.serving.index import MODEL_DIR, current_version, list_versions, open_current, open_version
from recommender.serving.index_build import build_index

#: The tiny model of tests/conftest.py's `tiny_model`, as a `ticketrec train --config` file.
TINY_CONFIG = {"hidden": 8, "word_dim": 16, "char_dim": 4, "char_hidden": 4, "topics": 6, "topic_vocab": 80,
               "topic_epochs": 2, "epochs": 1, "w2v_epochs": 1, "min_count": 1,
               "channels": {"h": 0.7, "E": 0.1, "T": 0.2}, "bm25": 0.3}


@pytest.fixture(scope="module")
def model(tiny_model):
    return TicketModel.load(tiny_model[0])


@pytest.fixture
def home(tmp_path, tiny_model):
    """(settings, store) of a fresh home holding the tiny knowledge base; TICKETREC_MODEL points nowhere, so
    anything that serves must use the model inside the index version."""
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"),
                                  "TICKETREC_MODEL": str(tmp_path / "no-model-here")})
    store = Store(settings.db)
    store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
    yield settings, store
    store.close()


def test_a_version_carries_its_model_with_checksums(home, model, tiny_model):
    settings, store = home
    version = build_index(store, model, settings, progress=False)
    idx = open_version(settings, version)
    entry = idx.manifest["model"]
    assert entry["version"] == idx.model_version == model.version and entry["dir"] == MODEL_DIR
    assert {"config.json", "weights.pt", "vocab.json", "word2vec.npy", "calibrator.json"} <= set(entry["files"])
    assert entry["bytes"] == sum(p.stat().st_size for p in idx.model_dir.rglob("*") if p.is_file())
    served = idx.model
    assert served is idx.model and served.version == model.version  # loaded once
    query = [Query(q.subject, q.description) for q in tiny_model[1].queries[:3]]
    for key, vec in model.encode_queries(query).items():
        np.testing.assert_array_equal(served.encode_queries(query)[key], vec)


def test_the_same_model_is_linked_into_the_next_version_and_another_is_copied(home, model, another_model):
    settings, store = home
    first = open_version(settings, build_index(store, model, settings, progress=False))
    store.import_dataset(Dataset([Ticket("NEW-1", "Valve leaks", "Steam leaks at the valve stem.", "Tighten it.")],
                                 source="update"))
    second = open_version(settings, build_index(store, model, settings, progress=False))
    assert second.manifest["reused"] == 80 and second.manifest["model"]["files"] == first.manifest["model"]["files"]
    weights = (first.model_dir / "weights.pt").stat(), (second.model_dir / "weights.pt").stat()
    assert weights[0].st_ino == weights[1].st_ino  # a hard link: the same model costs no second copy
    other = another_model
    third = open_version(settings, build_index(store, other, settings, progress=False))
    assert third.manifest["encoded"] == 81  # another fingerprint: nothing reused
    assert third.model.version == other.version != model.version == second.model.version
    assert (third.model_dir / "weights.pt").stat().st_ino != weights[1].st_ino


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_broken_model_copy_is_one_line_naming_index_full(home, model, tiny_model, damage, unseal):
    settings, store = home
    version = build_index(store, model, settings, progress=False)
    unseal(settings.indexes_dir / version)  # versions are sealed read-only; damage it as root could
    if damage == "corrupt":
        with open(settings.indexes_dir / version / MODEL_DIR / "vocab.json", "a") as fh:
            fh.write(" ")  # still valid JSON: only the checksum notices
    else:
        for path in sorted((settings.indexes_dir / version / MODEL_DIR).rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
    with pytest.raises(IndexStateError, match="ticketrec index --full") as err:
        open_current(settings).model  # noqa: B018
    assert "\n" not in str(err.value) and version in str(err.value)
    env = {"TICKETREC_HOME": str(settings.home), "TICKETREC_MODEL": str(tiny_model[0])}
    runner = CliRunner()
    out = runner.invoke(main, ["recommend", "--subject", "pump", "--description", "oil pump noise"], env=env)
    assert out.exit_code == 1 and "ticketrec index --full" in out.output and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1
    fixed = runner.invoke(main, ["index", "--full"], env=env)  # what the message says
    assert fixed.exit_code == 0, fixed.output
    again = runner.invoke(main, ["recommend", "--subject", "pump", "--description", "oil pump noise"], env=env)
    assert again.exit_code == 0 and "solution:" in again.output


def test_the_engine_skips_a_version_whose_model_is_broken(home, model, another_model, caplog, unseal):
    settings, store = home
    first = build_index(store, model, settings, progress=False)
    engine = Recommender(settings)
    query = Query("turbine vibration", "high vibration on the turbine bearing")
    assert engine.recommend(query, k=3).info.index_version == first
    second = build_index(store, another_model, settings, progress=False)
    unseal(settings.indexes_dir / second)
    (settings.indexes_dir / second / MODEL_DIR / "weights.pt").write_bytes(b"not a torch file")
    with caplog.at_level(logging.WARNING, logger="recommender.serving.engine"):
        answers = [engine.recommend(query, k=3) for _ in range(3)]
    assert {a.info.index_version for a in answers} == {first} and {a.info.model_version for a in answers} == {model.version}
    assert sum(second in rec.getMessage() for rec in caplog.records) == 1  # said once, not tried on every query


def test_the_web_app_serves_the_model_of_the_version_it_opened(home, model):
    from web import create_app

    settings, store = home
    version = build_index(store, model, settings, progress=False)
    assert not settings.model.exists()
    client = create_app({"TESTING": True, "TICKETREC_SETTINGS": settings}).test_client()
    body = client.post("/api/v1/recommendations", json={"subject": "turbine vibration", "k": 3}).get_json()
    assert body["index_version"] == version and body["model_version"] == model.version
    assert len(body["results"]) == 3
    health = client.get("/api/v1/healthz").get_json()
    assert health["index"]["ok"] and health["index"]["model_version"] == model.version


def _json(output: str) -> dict:
    return json.loads(output[output.index("{"):])


def test_train_index_recommend_from_a_fresh_home(tmp_path):
    """The acceptance path: synth, import, train --out M, index --model M, recommend; no model at TICKETREC_MODEL."""
    home = tmp_path / "home"
    env = {"TICKETREC_HOME": str(home), "TICKETREC_MODEL": None, "TICKETREC_DB": None, "TICKETREC_BROKER_URL": None,
           "TICKETREC_PREFILTER": None, "TICKETREC_CANDIDATES": None}
    runner = CliRunner()

    def run(*args: str):
        result = runner.invoke(main, list(args), env=env)
        assert result.exit_code == 0, result.output
        return result

    kb, config, model_dir = tmp_path / "kb.jsonl", tmp_path / "tiny.json", tmp_path / "M"
    config.write_text(json.dumps(TINY_CONFIG))
    run("synth", "--tickets", "80", "--queries", "12", "--seed", "5", "--out", str(kb))
    run("import", str(kb), "--quiet")
    run("train", "--train", str(kb), "--out", str(model_dir), "--config", str(config))
    trained = TicketModel.load(model_dir).version
    first = _json(run("index", "--model", str(model_dir)).output)
    assert not (home / "models" / "current").exists() and first["model_version"] == trained

    text = run("recommend", "Compressor trips on high vibration\nThe unit tripped twice at start-up.")
    assert text.output.count("solution:") == 10 and f"model {trained}" in text.output
    answer = _json(run("recommend", "--subject", "compressor vibration", "-k", "3", "--json").output)
    assert len(answer["results"]) == 3 and answer["info"]["index_version"] == first["version"]
    assert answer["info"]["model_version"] == trained and answer["info"]["prefilter"] == "index"

    second = _json(run("index", "--model", str(model_dir), "--full").output)
    assert second["version"] != first["version"] and current_version(Settings.from_env({"TICKETREC_HOME": str(home)})) \
        == second["version"]
    old = _json(run("recommend", "--subject", "compressor vibration", "-k", "3", "--json",
                    "--index", first["version"]).output)
    assert old["info"]["index_version"] == first["version"]
    assert [r["ticket"]["id"] for r in old["results"]] == [r["ticket"]["id"] for r in answer["results"]]

    missing = runner.invoke(main, ["recommend", "--subject", "pump", "--index", "19990101T000000000000-000000"], env=env)
    assert missing.exit_code == 1 and "Traceback" not in missing.output
    assert first["version"] in missing.output and f"{second['version']} (current)" in missing.output
    assert list_versions(Settings.from_env({"TICKETREC_HOME": str(home)})) == [first["version"], second["version"]]

    # A nightly reindex with no model named and none at TICKETREC_MODEL keeps the model the serving version carries.
    nightly = _json(run("reindex", "--in-process", "--full").output)
    assert nightly["model_version"] == trained and nightly["version"] != second["version"]
    assert not (home / "models" / "current").exists()
