"""The char-level and variational Siamese encoders as extra channels (C, V) of the Replicated Siamese model: trained
from the CLI with --channel, saved and verified inside the model, served through the index exactly as evaluated."""
import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from recommender.cli import main
from recommender.config import Settings
from recommender.data.records import Query, Ticket
from recommender.data.store import Dataset, Store
from recommender.data.synthetic import generate, write_jsonl
from recommender.errors import ModelError
from recommender.lexical.bm25 import Bm25Scorer
from recommender.model.bundle import TicketModel
from recommender.model.char_siamese import CharSiamese, CharSiameseConfig
from recommender.model.var_siamese import VarSiamese, VarSiameseConfig
from recommender.serving.engine import Recommender
from recommender.serving.index_build import build_index

#: tests/test_unsupervised.py's tiny Replicated Siamese model, fixed weights so that C and V surely serve.
TINY = {"hidden": 8, "word_dim": 16, "char_dim": 4, "char_hidden": 4, "topics": 6, "topic_vocab": 80, "topic_epochs": 2,
        "epochs": 1, "w2v_epochs": 2, "min_count": 1, "channels": {"h": 0.7, "E": 0.1}, "bm25": 0.3,
        "weights": "fixed"}


def _env(home):
    return {"TICKETREC_HOME": str(home), "TICKETREC_MODEL": None, "TICKETREC_DB": None, "TICKETREC_BROKER_URL": None,
            "TICKETREC_PREFILTER": None, "TICKETREC_CANDIDATES": None}


@pytest.fixture(scope="module")
def with_channels(tmp_path_factory):
    """(home, model_dir, tickets, char_dir, var_dir): a tiny char-siamese and var-siamese model trained label-free on
    80 synthetic tickets, then `ticketrec train --channel` for each over the imported tickets."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("channels")
    data = generate(n_tickets=80, n_queries=0, seed=21)
    char_dir, var_dir = tmp / "char", tmp / "var"
    CharSiamese(CharSiameseConfig(char_dim=8, hidden=8, layers=2, output_dim=8, epochs=1, batch_size=16)).fit(
        data.tickets, seed=0, progress=False).save(char_dir)
    VarSiamese(VarSiameseConfig(word_dim=16, hidden=8, latent=4, mlp_hidden=8, decoder_hidden=8, min_count=1,
                                pretrain_epochs=1, epochs=1)).fit(
        data.tickets, seed=0, progress=False).save(var_dir)
    home, model_dir = tmp / "home", tmp / "M"
    kb = write_jsonl(Dataset(data.tickets, source="kb"), tmp / "kb.jsonl")
    (tmp / "tiny.json").write_text(json.dumps(TINY))
    runner = CliRunner()
    result = runner.invoke(main, ["import", str(kb), "--quiet"], env=_env(home))
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["train", "--out", str(model_dir), "--config", str(tmp / "tiny.json"),
                                  "--channel", str(char_dir), "--channel", str(var_dir)], env=_env(home))
    assert result.exit_code == 0, result.output
    return home, model_dir, data.tickets, char_dir, var_dir


def test_the_model_carries_both_encoders_verified(with_channels):
    _, model_dir, _, char_dir, var_dir = with_channels
    model = TicketModel.load(model_dir)
    assert model.metric_spec()["channels"].keys() >= {"C", "V"}
    assert model.meta["channel_encoders"] == {
        "C": {"arch": "char-siamese", "version": CharSiamese.load(char_dir).version},
        "V": {"arch": "var-siamese", "version": VarSiamese.load(var_dir).version}}
    vecs = model.encode_tickets([Ticket("x", "pump trips on start", "the pump trips", "")])
    assert vecs["SUB.C"].shape == (1, 8) and vecs["SUB.V"].shape == (1, 8)
    assert np.abs(vecs["SUB.C"]).sum() > 0 and np.abs(vecs["SUB.V"]).sum() > 0


def test_a_damaged_channel_encoder_is_refused_with_what_to_do(with_channels, tmp_path):
    _, model_dir, _, _, _ = with_channels
    copy = tmp_path / "M"
    shutil.copytree(model_dir, copy)
    weights = copy / "channels" / "C" / "weights.pt"
    weights.write_bytes(weights.read_bytes()[:-7] + b"garbage")
    with pytest.raises(ModelError, match="(SHA-256|retrain)"):
        TicketModel.load(copy)


def test_served_scores_equal_the_model_with_its_extra_channels(with_channels, tmp_path):
    """The index stores the C and V vectors and the engine's kernel scores them: its top results and raw scores are
    the model's own forward pass over every ticket (K = 0)."""
    _, model_dir, tickets, _, _ = with_channels
    model = TicketModel.load(model_dir)
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_MODEL": str(model_dir),
                                  "TICKETREC_CANDIDATES": "0"})
    store = Store(settings.db)
    try:
        store.import_dataset(Dataset(tickets, source="kb"))
        build_index(store, model, settings, progress=False)
        query = Query(tickets[3].subject + " urgently", tickets[3].description[:80])
        results = Recommender(settings, store=store, model=model).recommend(query, k=5)
        stored = store.get_tickets(store.ticket_ids())
        lexical = Bm25Scorer(stored).lexical(f"{query.subject}\n{query.description}")
        g = model.score_pairs([query] * len(stored), stored, lexical=lexical)
        order = np.argsort(-g, kind="stable")[:5]
        assert [r.ticket.id for r in results] == [stored[i].id for i in order]
        np.testing.assert_allclose([r.raw_score for r in results], g[order], atol=1e-5)
        assert {"C", "V"} <= set(results[0].channel_shares)  # "why" names them
    finally:
        store.close()


def test_channel_errors_are_clear(with_channels, tmp_path):
    home, model_dir, _, char_dir, _ = with_channels
    runner = CliRunner()
    result = runner.invoke(main, ["train", "--out", str(tmp_path / "x"), "--channel", str(model_dir)], env=_env(home))
    assert result.exit_code != 0 and "--arch char-siamese or --arch var-siamese" in result.output
    result = runner.invoke(main, ["train", "--out", str(tmp_path / "x"), "--channel", str(char_dir),
                                  "--channel", str(char_dir)], env=_env(home))
    assert result.exit_code != 0 and "one of each kind" in result.output
    result = runner.invoke(main, ["train", "--out", str(tmp_path / "x"), "--arch", "char-siamese",
                                  "--channel", str(char_dir)], env=_env(home))
    assert result.exit_code != 0 and "--channel adds a channel" in result.output
