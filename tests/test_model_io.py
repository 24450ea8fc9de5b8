"""The model artifact: save/load gives identical scores; missing, corrupt or foreign files give a ModelError naming them."""
import json
import shutil
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from recommender.errors import ModelError
from recommender.model.bundle import TicketModel
from recommender.data.records import Query
from recommender.model.char_siamese import CharSiameseConfig
from recommender.model.mining import MiningConfig
from recommender.model.saved_config import SavedConfig
from recommender.model.siamese import SiameseConfig
from recommender.model.var_siamese import VarSiameseConfig
from recommender.model.training import train_model

TINY = dict(word_dim=16, hidden=8, char_dim=4, char_hidden=5, epochs=1, batch_size=8, min_count=1, w2v_epochs=2,
            channels={"h": 0.7, "E": 0.3}, bm25=0.2, weights="fixed")


@pytest.fixture(scope="module")
def trained(tiny_tickets, tmp_path_factory):
    """(model, its saved directory, dev data) of one tiny model trained once for this module."""
    train, dev = tiny_tickets(0), tiny_tickets(1)
    out = tmp_path_factory.mktemp("models") / "tiny"
    model = train_model(train, dev, SiameseConfig(**TINY), out, seed=0, progress=False)
    return model, out, dev


def _pairs(data):
    qmap, tmap = data.query_map(), data.ticket_map()
    return [qmap[p.query_id] for p in data.pairs], [tmap[p.ticket_id] for p in data.pairs]


def copy_of(src, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def test_saved_model_reloads_with_identical_scores_and_vectors(trained):
    model, out, dev = trained
    assert sorted(p.name for p in out.iterdir()) == ["calibrator.json", "config.json", "punkt.json", "vocab.json",
                                                     "weights.pt", "word2vec.npy"]
    loaded = TicketModel.load(out)
    qs, ts = _pairs(dev)
    lexical = np.linspace(0.0, 1.0, len(qs))
    assert np.array_equal(loaded.score_pairs(qs, ts, lexical), model.score_pairs(qs, ts, lexical))
    a, b = model.encode_tickets(ts[:5]), loaded.encode_tickets(ts[:5])
    assert a.keys() == b.keys() == {"SUB.h", "SUB.E", "DESC.h", "DESC.E", "SOL.h", "SOL.E"}
    assert all(np.array_equal(a[k], b[k]) and a[k].dtype == np.float32 for k in a)
    assert set(model.encode_queries(qs[:2])) == {"SUB.h", "SUB.E", "DESC.h", "DESC.E"}
    assert loaded.version == model.version
    assert loaded.metric_spec() == model.metric_spec()
    g = loaded.score_pairs(qs, ts)
    assert np.array_equal(loaded.calibrate(g), model.calibrate(g))
    config = json.loads((out / "config.json").read_text())
    assert config["format_version"] == 1 and config["version"] == model.version
    assert len(config["data_fingerprint"]) == 64 and "torch" in config["packages"]
    assert config["metric"] == model.metric_spec() and config["metric"]["bm25"] > 0
    # fixed weights keep Table-2-style proportions; only the common scale is set so mean d on training pairs is 1
    scale = model.meta["training"]["initial_scale"]
    assert config["metric"]["bm25"] == pytest.approx(0.2 * scale, rel=1e-5)
    assert config["metric"]["channels"] == {"h": pytest.approx(0.7), "E": pytest.approx(0.3)}


def test_score_pairs_is_the_formula_over_encoded_vectors(trained):
    model, _, dev = trained
    qs, ts = _pairs(dev)
    lexical = np.linspace(0, 1, len(qs))
    q, t = model.encode_queries(qs), model.encode_tickets(ts)
    spec = model.metric_spec()
    d = sum(v * sum(w * np.abs(q[f"{a}.{c}"] - t[f"{b}.{c}"]).sum(1) for c, w in spec["channels"].items())
            for a, b, v in spec["pairs"]) + spec["bm25"] * (1 - lexical)
    assert np.allclose(model.score_pairs(qs, ts, lexical), np.exp(-d), rtol=1e-5, atol=1e-7)


def test_oov_words_in_a_query_still_encode(trained):
    model, _, _ = trained
    vecs = model.encode_queries([Query("zyxqv wobble", "Completely unseen wordzz here.")])
    assert np.isfinite(vecs["SUB.E"]).all() and np.abs(vecs["SUB.E"]).sum() > 0


@pytest.mark.parametrize("name", ["config.json", "weights.pt", "vocab.json", "word2vec.npy", "punkt.json",
                                  "calibrator.json"])
def test_a_corrupt_file_gives_a_model_error_naming_it(trained, tmp_path, name):
    _, out, _ = trained
    path = copy_of(out, tmp_path)
    (path / name).write_bytes(b"\x00garbage{")
    with pytest.raises(ModelError, match=name.replace(".", r"\.")) as err:
        TicketModel.load(path)
    assert "retrain" in str(err.value)


@pytest.mark.parametrize("name", ["config.json", "weights.pt", "vocab.json", "word2vec.npy", "punkt.json"])
def test_a_missing_file_gives_a_model_error_naming_it(trained, tmp_path, name):
    _, out, _ = trained
    path = copy_of(out, tmp_path)
    (path / name).unlink()
    with pytest.raises(ModelError, match=name.replace(".", r"\.")):
        TicketModel.load(path)


def test_missing_directory_and_foreign_format_version(trained, tmp_path):
    _, out, _ = trained
    with pytest.raises(ModelError, match="ticketrec train"):
        TicketModel.load(tmp_path / "nothing")
    path = copy_of(out, tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["format_version"] = 99
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="format version 99"):
        TicketModel.load(path)


def test_changed_weights_do_not_pass_as_the_same_version(trained, tmp_path):
    _, out, _ = trained
    path = copy_of(out, tmp_path)
    vectors = np.load(path / "word2vec.npy")
    vectors[5] += 1.0
    np.save(path / "word2vec.npy", vectors)
    with pytest.raises(ModelError, match="corrupt"):
        TicketModel.load(path)


def test_a_model_saved_before_a_config_field_existed_loads_with_its_version(trained, tmp_path):
    """A hyperparameter added later (`ADDED_FIELDS`) must not turn every saved model into a "corrupt" one: a config
    that does not name it loads with the old behaviour and the same version; another value is another version."""
    model, out, dev = trained
    path = copy_of(out, tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert config["hyperparameters"]["e_unknown"] == "chars"
    del config["hyperparameters"]["e_unknown"]  # as written before the field existed
    (path / "config.json").write_text(json.dumps(config))
    old = TicketModel.load(path)
    assert old.siamese_config.e_unknown == "chars" and old.version == model.version == config["version"]
    queries, tickets = _pairs(dev)
    np.testing.assert_array_equal(old.score_pairs(queries, tickets), model.score_pairs(queries, tickets))
    config["hyperparameters"]["e_unknown"] = "skip"  # a real change of the model is a change of its version
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="corrupt"):
        TicketModel.load(path)


def test_a_saved_config_fills_an_added_field_with_the_old_behaviour_and_leaves_it_out_of_the_fingerprint():
    """`SavedConfig`, which the hyperparameters saved with a model use (Siamese, char-siamese, var-siamese,
    mining): a saved config gets `ADDED_FIELDS`' value, a user's options the field's default, and only a value other
    than the added one counts in the fingerprint."""

    @dataclass
    class Knobs(SavedConfig):
        ADDED_FIELDS: ClassVar[dict] = {"new": "as before"}
        size: int = 3
        new: str = "better"

        @classmethod
        def from_dict(cls, data):
            return cls(**data)

    saved = Knobs.from_saved({"size": 5})  # written before `new` existed
    assert saved.new == "as before" and saved.fingerprint_dict() == {"size": 5}
    assert Knobs.from_dict({"size": 5}).new == "better"
    assert Knobs.from_saved({"size": 5, "new": "better"}).fingerprint_dict() == {"size": 5, "new": "better"}
    for config in (SiameseConfig, CharSiameseConfig, VarSiameseConfig, MiningConfig):
        assert issubclass(config, SavedConfig)


def test_save_is_atomic_and_replaces_an_existing_model(trained, tmp_path):
    model, _, _ = trained
    target = tmp_path / "m"
    model.save(target)
    model.save(target)  # over an existing directory
    assert TicketModel.load(target).version == model.version
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary or old directories left

    class Boom(Exception):
        pass

    def failing_save(path):
        raise Boom()

    original = model.splitter.save
    model.splitter.save = failing_save
    try:
        with pytest.raises(Boom):
            model.save(target)
    finally:
        model.splitter.save = original
    assert TicketModel.load(target).version == model.version  # the previous model is intact
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_presets_without_training_still_save_and_load(tiny_tickets, tmp_path):
    config = SiameseConfig.preset("e_ml", word_dim=16, min_count=1, w2v_epochs=2)
    model = train_model(tiny_tickets(0), tiny_tickets(1), config, tmp_path / "e", seed=0, progress=False)
    assert model.meta["training"]["history"] == []
    loaded = TicketModel.load(tmp_path / "e")
    qs, ts = _pairs(tiny_tickets(1))
    assert np.array_equal(loaded.score_pairs(qs, ts), model.score_pairs(qs, ts))
    assert set(loaded.encode_tickets(ts[:1])) == {"SUB.E", "DESC.E"}


def test_topic_channel_model_saves_loads_and_explains_topics(tiny_tickets, tmp_path):
    config = SiameseConfig(**{**TINY, "channels": {"h": 0.5, "E": 0.3, "T": 0.2}, "topics": 4, "topic_epochs": 2})
    model = train_model(tiny_tickets(0), tiny_tickets(1), config, tmp_path / "t", seed=0, progress=False)
    assert (tmp_path / "t" / "docnade" / "config.json").exists() and (tmp_path / "t" / "topic_vocab.json").exists()
    loaded = TicketModel.load(tmp_path / "t")
    qs, ts = _pairs(tiny_tickets(1))
    assert np.array_equal(loaded.score_pairs(qs, ts), model.score_pairs(qs, ts))
    vecs = loaded.encode_tickets(ts[:2])
    assert vecs["SOL.T"].shape == (2, 4)
    words = loaded.topic_words(3)
    assert len(words) == 4 and all(len(w) == 3 and all(isinstance(x, str) for x in w) for w in words)
    top = loaded.top_topics(vecs, 1, n=2)
    assert [t["id"] for t in top] == list(np.argsort(-np.mean([vecs[k][1] for k in vecs if k.endswith(".T")], 0))[:2])
    assert top[0]["weight"] >= top[1]["weight"] and top[0]["words"][:3] == words[top[0]["id"]]
    (tmp_path / "t" / "docnade" / "weights.pt").write_bytes(b"junk")
    with pytest.raises(ModelError, match="weights.pt"):
        TicketModel.load(tmp_path / "t")
