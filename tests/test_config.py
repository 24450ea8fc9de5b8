"""The settings object reads TICKETREC_* variables with documented defaults."""
from pathlib import Path

from dataclasses import MISSING, fields

from recommender.config import ENV_VARS, SETTINGS, Settings, default, markdown_table

ROOT = Path(__file__).resolve().parents[1]


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
        "TICKETREC_BROKER_RETRY_AFTER": "7.5", "TICKETREC_MAX_FIELD_CHARS": "300", "TICKETREC_MAX_SUBJECT_CHARS": "30",
        "TICKETREC_AUTH_READ": "Required", "TICKETREC_INDEX_PIN": "2G",
        "TICKETREC_INDEX_DTYPE": "Float16",
        "TICKETREC_ENCODER": str(tmp_path / "enc"), "TICKETREC_ENCODER_BACKEND": "Torch",
        "TICKETREC_CARD_FIELDS": " Status, Priority,,status ", "TICKETREC_FILTER_FIELDS": "Category, status",
    }
    assert set(env) == set(ENV_VARS)
    s = Settings.from_env(env)
    assert s.db == Path(env["TICKETREC_DB"]) and s.model == Path(env["TICKETREC_MODEL"])
    assert (s.prefilter, s.es_url, s.es_index, s.broker_url) == ("elasticsearch", env["TICKETREC_ES_URL"], "idx", env["TICKETREC_BROKER_URL"])
    assert (s.candidates, s.shards, s.query_deadline, s.keep_indexes) == (0, 4, 0.5, 2)
    assert (s.reindex_at, s.max_description, s.secret_key) == ("03:15", 100, "k")
    assert s.index_workers == 3 and s.encoding_processes == 3 and s.broker_retry_after == 7.5
    assert (s.max_field_chars, s.max_subject_chars) == (300, 30)
    assert s.auth_read == "required" and s.index_pin == 2 << 30 and s.index_dtype == "float16"
    assert s.card_fields == ("status", "priority") and s.filter_fields == ("category", "status")
    assert Settings.from_env({"TICKETREC_HOME": str(tmp_path)}).filter_fields == ("auto",)
    assert Settings.from_env({"TICKETREC_HOME": str(tmp_path), "TICKETREC_CARD_FIELDS": "None"}).card_fields == ()
    assert str(s.encoder) == env["TICKETREC_ENCODER"] and s.encoder_backend == "torch"
    assert 1 <= s.replace(index_workers=0).encoding_processes <= 4
    assert s.replace(candidates=5).candidates == 5 and s.candidates == 0


def test_a_malformed_number_names_the_variable(tmp_path):
    import pytest
    from recommender.errors import TicketrecError

    with pytest.raises(TicketrecError, match="TICKETREC_CANDIDATES"):
        Settings.from_env({"TICKETREC_HOME": str(tmp_path), "TICKETREC_CANDIDATES": "lots"})


def test_one_table_holds_every_field_and_its_default(tmp_path):
    """Each Settings field is one row of SETTINGS, and the dataclass default is the row's, parsed."""
    assert [s.field for s in SETTINGS] and sorted(s.field for s in SETTINGS) == sorted(f.name for f in fields(Settings))
    assert len({s.env for s in SETTINGS}) == len(SETTINGS) == len(ENV_VARS)
    for f in fields(Settings):
        if f.default is not MISSING:
            assert f.default == default(f.name) and type(f.default) is type(default(f.name)), f.name
    assert default("candidates") == 1000 and default("broker_retry_after") == 30.0
    home_only = Settings.from_env({"TICKETREC_HOME": str(tmp_path)})
    empty = Settings.from_env({s.env: "" for s in SETTINGS} | {"TICKETREC_HOME": str(tmp_path)})
    assert empty == home_only == Settings(home=tmp_path, db=tmp_path / "ticketrec.sqlite3",
                                          model=tmp_path / "models" / "current")


def test_the_readme_table_is_the_settings_table():
    table = markdown_table()
    assert table in (ROOT / "README.md").read_text(encoding="utf-8"), \
        "README's configuration table is stale: paste `python -m recommender.config` into it"
    assert all(f"`{s.env}`" in table and s.doc in table for s in SETTINGS)


def test_a_malformed_float_names_the_variable(tmp_path):
    import pytest
    from recommender.errors import TicketrecError

    with pytest.raises(TicketrecError, match="TICKETREC_BROKER_RETRY_AFTER must be a number"):
        Settings.from_env({"TICKETREC_HOME": str(tmp_path), "TICKETREC_BROKER_RETRY_AFTER": "soon"})


def test_a_wrong_auth_read_mode_says_which_ones_exist(tmp_path):
    import pytest
    from recommender.errors import TicketrecError

    assert Settings.from_env({"TICKETREC_HOME": str(tmp_path)}).auth_read == "auto"
    with pytest.raises(TicketrecError, match="TICKETREC_AUTH_READ must be auto, required or open, not 'closed'"):
        Settings.from_env({"TICKETREC_HOME": str(tmp_path), "TICKETREC_AUTH_READ": "closed"})
