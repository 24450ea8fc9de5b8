"""The settings object reads TICKETREC_* variables with documented defaults."""
from pathlib import Path

from recommender.config import ENV_VARS, Settings


def test_defaults_derive_from_home(tmp_path):
    s = Settings.from_env({"TICKETREC_HOME": str(tmp_path)})
    assert s.home == tmp_path
    assert s.db == tmp_path / "ticketrec.sqlite3"
    assert s.model == tmp_path / "models" / "current"
    assert s.indexes_dir == tmp_path / "indexes"
    assert (s.prefilter, s.candidates, s.max_description, s.broker_url) == ("index", 1000, 20000, "")


def test_every_variable_is_read(tmp_path):
    env = {
        "TICKETREC_HOME": str(tmp_path), "TICKETREC_DB": str(tmp_path / "x.db"), "TICKETREC_MODEL": str(tmp_path / "m"),
        "TICKETREC_PREFILTER": "Elasticsearch", "TICKETREC_ES_URL": "http://127.0.0.1:9200", "TICKETREC_ES_INDEX": "idx",
        "TICKETREC_BROKER_URL": "redis://127.0.0.1:6379/0", "TICKETREC_CANDIDATES": "0", "TICKETREC_SHARDS": "4",
        "TICKETREC_QUERY_DEADLINE": "0.5", "TICKETREC_KEEP_INDEXES": "2", "TICKETREC_REINDEX_AT": "03:15",
        "TICKETREC_MAX_DESCRIPTION": "100", "TICKETREC_SECRET_KEY": "k", "TICKETREC_INDEX_WORKERS": "3",
    }
    assert set(env) == set(ENV_VARS)
    s = Settings.from_env(env)
    assert s.db == Path(env["TICKETREC_DB"]) and s.model == Path(env["TICKETREC_MODEL"])
    assert (s.prefilter, s.es_url, s.es_index, s.broker_url) == ("elasticsearch", env["TICKETREC_ES_URL"], "idx", env["TICKETREC_BROKER_URL"])
    assert (s.candidates, s.shards, s.query_deadline, s.keep_indexes) == (0, 4, 0.5, 2)
    assert (s.reindex_at, s.max_description, s.secret_key) == ("03:15", 100, "k")
    assert s.index_workers == 3 and s.encoding_processes == 3
    assert 1 <= s.replace(index_workers=0).encoding_processes <= 4
    assert s.replace(candidates=5).candidates == 5 and s.candidates == 0


def test_a_malformed_number_names_the_variable(tmp_path):
    import pytest
    from recommender.errors import TicketrecError

    with pytest.raises(TicketrecError, match="TICKETREC_CANDIDATES"):
        Settings.from_env({"TICKETREC_HOME": str(tmp_path), "TICKETREC_CANDIDATES": "lots"})
