"""The static S backend fitted to the knowledge base (`static_fit.py`): training with S on the static backend fits
the word-piece vectors to the tickets' texts, and the saved model serves exactly those vectors."""
import shutil

import numpy as np
import pytest

from recommender.errors import ModelError
from recommender.model import feedback_encoder, static_fit
from recommender.model.bundle import TicketModel
from recommender.model.pretrained import file_checksums, load_encoder, select
from recommender.model.siamese import SiameseConfig
from recommender.model.training import train_model


@pytest.fixture(scope="module")
def own_encoder(encoder_dir, tmp_path_factory):
    """A copy of the tiny encoder: encoders load once per process and directory, and other modules test theirs."""
    out = tmp_path_factory.mktemp("static-fit") / "tiny-bert"
    shutil.copytree(encoder_dir, out)
    return out


@pytest.fixture(scope="module")
def static_model(own_encoder, tiny_tickets, tmp_path_factory):
    """(model directory, its tickets, its encoder): a model whose S runs on the static backend of the tiny encoder."""
    tmp = tmp_path_factory.mktemp("static-model")
    config = SiameseConfig(word_dim=16, hidden=8, char_dim=4, char_hidden=5, epochs=1, batch_size=8, min_count=1,
                           w2v_epochs=2, channels={"h": 0.1, "S": 1.0}, bm25=0.0, weights="fixed")
    data = tiny_tickets(1, n_tickets=30)
    out = tmp / "M"
    select(own_encoder, "static")
    try:
        train_model(data, None, config, out, progress=False)
    finally:
        select()
    return out, data.tickets, own_encoder


def test_the_fit_brings_held_out_texts_closer_to_the_teacher(own_encoder, tiny_tickets):
    """The fitted vectors put texts the fit never trained on nearer the transformer's vectors than the mapped
    distillation it starts from; the same seed gives the same vectors."""
    static, teacher = load_encoder(own_encoder, None, "static"), load_encoder(own_encoder, None, "torch")
    texts = static_fit.fit_texts(tiny_tickets(2, n_tickets=60).tickets)
    vectors, report = static_fit.fit_vectors(static, teacher, texts, seed=0)
    assert vectors.shape == (static.static_model.embedding.shape[0], teacher.dim)
    assert report["texts"] == len(texts) and 0 < report["held_out_texts"] < len(texts)
    assert report["held_out_distance"] < report["held_out_distance_mapped"] and report["epochs"] >= 1
    again, _ = static_fit.fit_vectors(static, teacher, texts, seed=0)
    np.testing.assert_array_equal(vectors, again)


def test_a_static_model_serves_the_vectors_fitted_to_its_knowledge_base(static_model):
    """The saved model's S is its own encoder directory with `static_fit/`, recorded in its config; loaded, it gives
    the training process's vectors, not the plain distillation's, and a damaged vector file is refused."""
    out, tickets, own_encoder = static_model
    model = TicketModel.load(out)
    report = model.meta["training"]["static_fit"]
    assert report["texts"] > 0 and report["held_out_distance"] <= report["held_out_distance_mapped"]
    assert (out / "sentence_encoder" / static_fit.STATIC_FIT_DIR / "manifest.json").is_file()
    encoder = model.sentence_encoder()
    assert encoder.backend == "static" and encoder.static_dir == out / "sentence_encoder" / static_fit.STATIC_FIT_DIR
    assert model.s_channel["backend"] == "static" and model.s_channel["dim"] == encoder.dim

    texts = [t.subject for t in tickets[:10]]
    served = encoder.encode(texts)
    plain = load_encoder(own_encoder, None, "static").encode(texts)
    assert served.shape[1] == plain.shape[1] and not np.allclose(served, plain, atol=1e-3)
    np.testing.assert_allclose(model.encode_tickets(tickets[:10])["SUB.S"], served, atol=1e-6)

    damaged = out.parent / "damaged"
    shutil.copytree(out, damaged)
    vectors = next((damaged / "sentence_encoder" / static_fit.STATIC_FIT_DIR).glob("*.safetensors"))
    vectors.write_bytes(vectors.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ModelError, match="sentence encoder"):
        TicketModel.load(damaged).sentence_encoder()


def test_a_model_on_another_backend_fits_nothing(own_encoder, tiny_tickets):
    """Only the static backend is fitted: a model whose S runs on the transformer keeps its encoder as it is."""
    config = SiameseConfig(word_dim=16, hidden=8, char_dim=4, char_hidden=5, epochs=1, batch_size=8, min_count=1,
                           w2v_epochs=2, channels={"h": 0.1, "S": 1.0}, bm25=0.0, weights="fixed")
    select(own_encoder, "torch")
    try:
        model = train_model(tiny_tickets(1, n_tickets=12), None, config, None, progress=False)
    finally:
        select()
    assert model.meta["training"]["static_fit"] is None
    assert "static_fit" not in model.meta.get("sentence_encoder", {})


def test_feedback_fits_the_static_vectors_again_from_the_adapted_encoder(static_model, tmp_path):
    """`--with-feedback` adapts the transformer under a static model; the candidate's static vectors are fitted
    again from the adapted encoder (its own `static_fit/`), not the plain distillation nor the model's old fit."""
    out, tickets, _ = static_model
    model = TicketModel.load(out)
    adapted = tmp_path / "adapted"  # stands for an adapted encoder: the transformer without static vectors
    shutil.copytree(model.sentence_encoder_dir, adapted, ignore=shutil.ignore_patterns(static_fit.STATIC_FIT_DIR))
    tuned = feedback_encoder._with_encoder(model, adapted, file_checksums(adapted), {}, tickets, seed=1)
    encoder = tuned.sentence_encoder()
    assert encoder.static_dir == tuned.sentence_encoder_dir / static_fit.STATIC_FIT_DIR
    assert tuned.sentence_encoder_dir not in (adapted, model.sentence_encoder_dir)
    assert tuned.meta["sentence_encoder"]["loss"] and tuned.meta["sentence_encoder"]["static_fit"]["texts"] > 0
    assert model.sentence_encoder().static_dir == out / "sentence_encoder" / static_fit.STATIC_FIT_DIR  # untouched
