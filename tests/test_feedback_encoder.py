"""Feedback moves a model that ranks with S: `train --with-feedback` adapts its sentence encoder on the judgements
(`feedback_encoder.py`), keeps it only when that pays in cross-validation over judged queries grouped by shared
tickets (`judged.py`), and the saved model serves the adapted encoder."""
import shutil

import numpy as np
import pytest

from recommender.data.records import LabeledPair, Query, Ticket
from recommender.data.store import Dataset
from recommender.model import feedback_encoder
from recommender.model.bundle import TicketModel
from recommender.model.feedback import fine_tune
from recommender.model.judged import judged_queries
from recommender.model.pretrained import file_checksums, select
from recommender.model.siamese import SiameseConfig
from recommender.model.training import train_model


#: The engineers' jargon of the judged queries: every topic word of `tiny_tickets` written as a code of their own.
JARGON = {w: f"zq{i}" for i, w in enumerate(
    "turbine blade vibration rotor bearing shaft valve leak seal pressure actuator gasket oil lubrication filter pump "
    "temperature viscosity combustion flame burner ignition fuel nozzle".split())}


def _in_jargon(text: str) -> str:
    return " ".join(JARGON.get(w.strip(".").lower(), w) for w in text.split())


@pytest.fixture(scope="module")
def s_model(encoder_dir, tiny_tickets, tmp_path_factory):
    """(model_dir, knowledge base, feedback): a model that ranks with S (and a little h) on the tiny random-weight
    encoder of `encoder_dir`, a knowledge base of 40 tickets, and YES judgements of 24 of them asked in the
    engineers' jargon (`JARGON`), which the encoder cannot know: each query must find its own ticket."""
    kb = tiny_tickets(0, n_tickets=40, n_queries=0).tickets
    queries = [Query(_in_jargon(t.subject), _in_jargon(t.description), id=f"jargon-{t.id}") for t in kb[:24]]
    yes = [LabeledPair(q.id, t.id, 5.0) for q, t in zip(queries, kb)]
    feedback = Dataset(kb[:24], queries, yes, "feedback")
    config = SiameseConfig(word_dim=16, hidden=8, char_dim=4, char_hidden=5, epochs=1, batch_size=8, min_count=1,
                           w2v_epochs=2, channels={"h": 0.1, "S": 1.0}, bm25=0.0, weights="fixed")
    tmp = tmp_path_factory.mktemp("s-model")
    own_encoder = tmp / "tiny-bert"  # a copy: encoders load once per process and directory, the exports test its own
    shutil.copytree(encoder_dir, own_encoder)
    out = tmp / "M"
    select(own_encoder)
    try:
        train_model(tiny_tickets(1, n_tickets=24), None, config, out, progress=False)
    finally:
        select()
    return out, kb, feedback


def _s_vectors(model: TicketModel, tickets) -> np.ndarray:
    return model.encode_tickets(tickets)["SUB.S"]


def test_judged_queries_that_share_a_ticket_or_a_query_fall_in_one_fold():
    """Two duplicates judged both ways are one group (each query is the other's judged ticket's text); so are two
    queries judged on the same ticket, and one query judged relevant to two tickets that nothing else joins; groups
    never straddle folds."""
    kb = [Ticket(f"t{i}", f"subject {i}", f"description {i}") for i in range(8)]
    queries = [Query("subject 0", "description 0", "qa"), Query("subject 1", "description 1", "qb"),
               Query("subject 2", "description 2", "qc"), Query("something new", "never stored", "qx"),
               Query("subject 5", "description 5", "qy")]
    judgements = [("qa", "t1", 5.0), ("qb", "t0", 5.0), ("qc", "t3", 5.0), ("qx", "t3", 5.0), ("qx", "t4", 4.0),
                  ("qy", "t6", 5.0), ("qy", "t7", 1.0)]
    judged = judged_queries(queries, judgements, kb, [], relevant_min=3.0)
    assert [q.id for q in judged.queries] == ["qa", "qb", "qc", "qx", "qx", "qy"]  # the NO judgement is no query
    groups = judged.groups
    assert groups[0] == groups[1] and groups[2] == groups[3] == groups[4] and len(set(groups.tolist())) == 3
    assert judged.own.tolist() == [0, 1, 2, -1, -1, 5]  # each stored copy of a query is left out of its ranking
    for seed in range(5):
        fold = judged.folds(2, np.random.default_rng(seed))
        assert fold[0] == fold[1] and fold[2] == fold[3] == fold[4] and set(fold.tolist()) == {0, 1}


def test_one_query_text_stored_under_two_ids_is_one_query():
    """An engineer who asks the same text twice and judges a different ticket each time asked one query: its two
    judgements are one group, and each one's ranking leaves the other's ticket out."""
    kb = [Ticket(f"t{i}", f"subject {i}", f"description {i}") for i in range(6)]
    queries = [Query("VPN drops", "every hour ", "q1"), Query(" VPN drops", "every hour", "q2"),
               Query("printer jammed", "tray 2", "q3")]
    judged = judged_queries(queries, [("q1", "t1", 5.0), ("q2", "t4", 5.0), ("q3", "t2", 5.0)], kb, [],
                            relevant_min=3.0)
    assert judged.groups[0] == judged.groups[1] != judged.groups[2]
    assert [o.tolist() for o in judged.others] == [[judged.truth[1]], [judged.truth[0]], []]


def test_a_query_judged_relevant_to_several_tickets_finds_each_without_the_others_competing(tiny_model):
    """One query judged relevant to two tickets is two judged queries; in each one's ranking the other ticket is left
    out, as the query's own stored copy is, so finding either counts as a first place when the other ranks above it."""
    model_dir, data = tiny_model
    model = TicketModel.load(model_dir)
    kb = data.tickets[:30]
    a, b = kb[3], kb[7]
    query = Query(a.subject, b.description, "q")  # close to both tickets, each judged relevant
    judged = judged_queries([query], [("q", a.id, 5.0), ("q", b.id, 4.0)], kb, [], relevant_min=3.0)
    assert [o.tolist() for o in judged.others] == [[judged.truth[1]], [judged.truth[0]]]
    ranked = judged.ranked_slice(model)
    first, second = ranked.dist[:, :, 0, judged.truth[1]], ranked.dist[:, :, 1, judged.truth[0]]
    assert (first == 1e6).all() and (second == 1e6).all() and (ranked.lexical[[0, 1], judged.truth[[1, 0]]] < 0).all()
    assert (ranked.dist[:, :, 0, judged.truth[0]] < 1e6).all()  # the judged ticket itself is ranked
    assert judged.subset(np.array([False, True])).others[0].tolist() == [judged.truth[0]]


def test_feedback_adapts_the_encoder_of_a_model_that_serves_s(s_model, tmp_path, monkeypatch):
    """The judgements teach S the jargon: the adapted encoder ranks the judged queries of folds it did not train on
    better than the model's own, so it is kept, saved into the tuned
    model and served by it; the base model keeps its encoder. (A random-weight encoder needs more and larger steps than
    the pretrained one's one epoch at 2e-5 to learn from a few dozen pairs.)"""
    model_dir, kb, feedback = s_model
    monkeypatch.setattr(feedback_encoder, "LEARNING_RATE", 1e-3)
    monkeypatch.setattr(feedback_encoder, "EPOCHS", 20)
    base = TicketModel.load(model_dir)
    base_files = file_checksums(model_dir / "sentence_encoder")
    tuned, report = fine_tune(base, feedback, feedback, tmp_path / "tuned", seed=0, epochs=1, progress=False,
                              knowledge_base=kb)
    adaptation = report["sentence_encoder"]
    assert adaptation["queries"] == len(feedback.pairs) >= feedback_encoder.MIN_ADAPT_QUERIES
    assert adaptation["mined_pairs"] == len(kb) and adaptation["kept"]
    assert adaptation["cross_validated"] > adaptation["current"]
    saved = TicketModel.load(tmp_path / "tuned")
    assert tuned.sentence_encoder_dir == tmp_path / "tuned" / "sentence_encoder"  # not a scratch copy
    assert saved.meta["sentence_encoder"]["files"] == file_checksums(tmp_path / "tuned" / "sentence_encoder")
    assert saved.meta["sentence_encoder"]["files"] != base_files
    assert saved.meta["sentence_encoder"]["feedback"]["feedback_pairs"] == len(feedback.pairs)
    np.testing.assert_allclose(_s_vectors(saved, kb[:5]), _s_vectors(tuned, kb[:5]), atol=1e-6)  # served = evaluated
    assert np.abs(_s_vectors(saved, kb[:5]) - _s_vectors(base, kb[:5])).max() > 1e-3
    assert file_checksums(model_dir / "sentence_encoder") == base_files
    assert base.meta["sentence_encoder"]["files"] == base_files  # the input model is left as it was


def test_the_adaptation_runs_on_the_threads_asked_for_and_the_network_on_one(s_model, monkeypatch):
    """`train --with-feedback --threads N`: every adaptation of S (the folds' and the final one) fine-tunes on N
    torch threads, the network trains on one, and the caller's count comes back."""
    import torch

    import recommender.model.adaptation as adaptation
    import recommender.model.feedback as feedback_module

    model_dir, kb, feedback = s_model
    monkeypatch.setattr(feedback_encoder, "MIN_GAIN", -float("inf"))  # kept: the final adaptation runs too
    seen = {"adapt": [], "steps": [], "fit": []}
    real_adapt, real_fit = adaptation.adapt, feedback_module.fit

    def adapt_noting(*args, **kwargs):
        seen["adapt"].append(kwargs.get("threads"))
        return real_adapt(*args, **kwargs)

    def step_noting(self, *args, **kwargs):  # the loss of a fine-tuning step: torch's count while it fine-tunes
        seen["steps"].append(torch.get_num_threads())
        return real_step(self, *args, **kwargs)

    def fit_noting(*args, **kwargs):
        seen["fit"].append(torch.get_num_threads())
        return real_fit(*args, **kwargs)

    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    real_step = MultipleNegativesRankingLoss.forward
    monkeypatch.setattr(adaptation, "adapt", adapt_noting)
    monkeypatch.setattr(MultipleNegativesRankingLoss, "forward", step_noting)
    monkeypatch.setattr(feedback_module, "fit", fit_noting)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        _, report = fine_tune(TicketModel.load(model_dir), feedback, feedback, None, seed=0, epochs=1,
                              progress=False, knowledge_base=kb, threads=2)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert report["sentence_encoder"]["kept"]
    assert seen["adapt"] == [2] * (feedback_encoder.ADAPT_FOLDS + 1) and set(seen["steps"]) == {2}
    assert seen["fit"] == [1]


def test_an_adaptation_that_does_not_pay_leaves_the_encoder(s_model, monkeypatch):
    model_dir, kb, feedback = s_model
    monkeypatch.setattr(feedback_encoder, "MIN_GAIN", float("inf"))
    base = TicketModel.load(model_dir)
    tuned, report = fine_tune(base, feedback, feedback, None, seed=0, epochs=1, progress=False, knowledge_base=kb)
    assert report["sentence_encoder"]["kept"] is False
    assert tuned.meta["sentence_encoder"] == base.meta["sentence_encoder"]
    assert tuned.sentence_encoder_dir == model_dir / "sentence_encoder"
    np.testing.assert_allclose(_s_vectors(tuned, kb[:5]), _s_vectors(base, kb[:5]), atol=1e-6)


def test_too_few_judgements_adapt_nothing(s_model):
    model_dir, kb, feedback = s_model
    few = Dataset(feedback.tickets, feedback.queries, feedback.pairs[: feedback_encoder.MIN_ADAPT_QUERIES - 1])
    _, report = fine_tune(TicketModel.load(model_dir), few, feedback, None, seed=0, epochs=1, progress=False,
                          knowledge_base=kb)
    assert report["sentence_encoder"] is None


def test_labelled_pairs_without_a_knowledge_base_adapt_nothing(s_model):
    """Without the knowledge base the judged queries cannot be ranked, so nothing can tell whether S improved."""
    model_dir, _, feedback = s_model
    _, report = fine_tune(TicketModel.load(model_dir), feedback, feedback, None, seed=0, epochs=1, progress=False)
    assert report["sentence_encoder"] is None


def test_a_model_without_s_adapts_nothing(tiny_model):
    model_dir, data = tiny_model
    feedback = Dataset(data.tickets, data.queries, [p for p in data.pairs if p.score == 5.0], "feedback")
    _, report = fine_tune(TicketModel.load(model_dir), feedback, feedback, None, seed=0, epochs=1, progress=False,
                          knowledge_base=data.tickets)
    assert report["sentence_encoder"] is None
