"""Learning from feedback: stored judgements become pairs that fine-tune the model (train --with-feedback)."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from recommender.cli import main
from recommender.config import Settings
from recommender.errors import InputError
from recommender.lexical.bm25 import Bm25Scorer
from recommender.model.feedback import feedback_dataset, fine_tune
from recommender.data.records import query_text
from recommender.model.bundle import TicketModel
from recommender.data.store import Feedback, Store


@pytest.fixture
def kb(tmp_path, tiny_model):
    """(settings, store, model_dir, dataset): the tiny model's knowledge base in a fresh store."""
    model_dir, data = tiny_model
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_MODEL": str(model_dir)})
    store = Store(settings.db)
    store.import_dataset(data)
    yield settings, store, model_dir, data
    store.close()


def _give_feedback(store, data, n_queries=8):
    """Judge the first queries' labelled tickets as the gold label says (YES 5, REL 3, NO 1); returns how many."""
    label = {5.0: "YES", 3.0: "REL", 1.0: "NO"}
    chosen = {q.id: q for q in data.queries[:n_queries]}
    given = 0
    for pair in data.pairs:
        if pair.query_id in chosen:
            q = chosen[pair.query_id]
            store.add_feedback(Feedback(q.subject, q.description, pair.ticket_id, label[pair.score], "m", "i"))
            given += 1
    return given


def test_feedback_becomes_one_pair_per_query_and_ticket_latest_wins(kb):
    _, store, _, data = kb
    t1, t2 = data.tickets[0].id, data.tickets[1].id
    store.add_feedback(Feedback("Pump leak", "Seal leaks at start.", t1, "NO", created_at=1.0))
    store.add_feedback(Feedback("Pump leak", "Seal leaks at start.", t1, "YES", created_at=2.0))
    store.add_feedback(Feedback("pump  LEAK", "seal leaks at start.", t2, "REL", created_at=3.0))
    fb = feedback_dataset(store)
    assert len(fb.queries) == 1  # the same query, typed with other case and spacing
    assert sorted((p.ticket_id, p.score) for p in fb.pairs) == sorted([(t1, 5.0), (t2, 3.0)])
    assert {t.id for t in fb.tickets} == {t1, t2}


def test_fine_tune_reports_before_and_after_on_the_same_held_out_pairs(kb, tmp_path):
    _, store, model_dir, data = kb
    assert _give_feedback(store, data) > 0
    fb = feedback_dataset(store)
    base = TicketModel.load(model_dir)
    tuned, report = fine_tune(base, fb, data, tmp_path / "tuned", seed=0, epochs=2, progress=False)
    assert report["held_out_pairs"] == len(data.pairs)
    for side in ("before", "after"):
        assert report[side]["pairs"] == len(data.pairs)
        assert np.isfinite(report[side]["mse"])
    assert report["base_version"] == TicketModel.load(model_dir).version
    reloaded = TicketModel.load(tmp_path / "tuned")
    assert reloaded.version == tuned.version != report["base_version"]
    assert reloaded.meta["fine_tuning"][-1]["train_pairs"] == report["train_pairs"]


def test_fine_tune_returns_a_new_model_and_leaves_its_input_untouched(kb):
    _, store, model_dir, data = kb
    _give_feedback(store, data)
    base = TicketModel.load(model_dir)
    weights = {k: v.clone() for k, v in base.net.state_dict().items()}
    version, config, meta = base.version, base.siamese_config, json.dumps(base.meta, sort_keys=True)
    tuned, report = fine_tune(base, feedback_dataset(store), data, None, seed=0, epochs=2, progress=False)
    assert tuned is not base and report["epochs"] == 2
    state = base.net.state_dict()
    assert all(np.array_equal(state[k].numpy(), v.numpy()) for k, v in weights.items())
    assert base.siamese_config == config and json.dumps(base.meta, sort_keys=True) == meta
    base.invalidate()  # recomputed from the weights, not the cached value
    assert base.version == version == report["base_version"] != tuned.version
    assert "fine_tuning" not in base.meta and tuned.meta["fine_tuning"][-1]["base_version"] == version


def test_fine_tune_trains_on_one_torch_thread_and_gives_the_same_model_again(kb, monkeypatch):
    """On several torch threads the network's sums run in an order that varies run to run (two runs of `train
    --with-feedback` on SeaMonkey gave two models): fine-tuning runs on one, and gives back the caller's count."""
    import torch

    import recommender.model.feedback as feedback

    _, store, model_dir, data = kb
    _give_feedback(store, data)
    seen = []
    real_fit = feedback.fit

    def fit_noting_threads(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(feedback, "fit", fit_noting_threads)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        versions = [fine_tune(TicketModel.load(model_dir), feedback_dataset(store), data, None, seed=0, epochs=1,
                              progress=False)[0].version for _ in range(2)]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1]
    assert versions[0] == versions[1]


def test_the_version_of_a_tuned_model_is_its_weights_not_its_wall_time(kb, tmp_path):
    """Two fine-tunings to the same weights are one model: the version leaves the fine-tuning report out (its wall
    time made every run another version). A model saved while the report counted loads with the version it was
    saved with; any other mismatch is still a corrupt artifact."""
    from recommender.errors import ModelError
    from recommender.model.bundle import LEGACY_REPORT_KEYS

    _, store, model_dir, data = kb
    _give_feedback(store, data)
    tuned, _ = fine_tune(TicketModel.load(model_dir), feedback_dataset(store), data, tmp_path / "t", seed=0, epochs=1,
                         progress=False)
    version = tuned.version
    legacy = TicketModel.load(tmp_path / "t")._fingerprint(LEGACY_REPORT_KEYS)
    assert legacy != version
    tuned.meta["fine_tuning"][-1]["wall_seconds"] += 60.0
    tuned.invalidate()
    assert tuned.version == version
    config_file = tmp_path / "t" / "config.json"
    config = json.loads(config_file.read_text())
    config["version"] = legacy  # as a model fine-tuned before 2026-12-03 was saved
    config_file.write_text(json.dumps(config))
    assert TicketModel.load(tmp_path / "t").version == legacy
    config["version"] = "0123456789abcdef"
    config_file.write_text(json.dumps(config))
    with pytest.raises(ModelError, match="the artifact is corrupt"):
        TicketModel.load(tmp_path / "t")


def test_cli_train_with_feedback_writes_a_tuned_model(kb, tmp_path):
    settings, store, model_dir, data = kb
    _give_feedback(store, data)
    env = {"TICKETREC_HOME": str(settings.home), "TICKETREC_MODEL": str(model_dir)}
    out = tmp_path / "tuned-cli"
    refused = CliRunner().invoke(main, ["train", "--with-feedback", "--threads", "2", "--out", str(out)], env=env)
    assert refused.exit_code == 1 and "does not rank with S" in refused.output and not out.exists()
    result = CliRunner().invoke(main, ["train", "--with-feedback", "--out", str(out), "--epochs", "1"], env=env)
    assert result.exit_code == 0, result.output
    assert "fine-tuned on" not in result.output  # no S, no adaptation whose threads to tell
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["before"] is not None and summary["after"] is not None
    assert TicketModel.load(out).version == summary["version"]


def test_cli_train_with_feedback_and_no_feedback_is_a_clear_error(kb, tmp_path):
    settings, _, model_dir, _ = kb
    env = {"TICKETREC_HOME": str(settings.home), "TICKETREC_MODEL": str(model_dir)}
    result = CliRunner().invoke(main, ["train", "--with-feedback", "--out", str(tmp_path / "x")], env=env)
    assert result.exit_code == 1
    assert "no labelled pairs" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_train_without_data_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "m")], env={"TICKETREC_HOME": str(tmp_path)})
    assert result.exit_code == 1 and "--train" in result.output


def test_fine_tune_without_pairs_raises(kb, tmp_path):
    _, store, model_dir, _ = kb
    with pytest.raises(InputError, match="no labelled pairs"):
        fine_tune(TicketModel.load(model_dir), feedback_dataset(store), None, None, progress=False)


def _give_yes(store, data, n_queries=None):
    """YES on each query's best-labelled ticket only, as engineers mostly give: returns the (query, ticket) pairs."""
    best: dict[str, tuple[float, str]] = {}
    for pair in data.pairs:
        if pair.score == 5.0:
            best.setdefault(pair.query_id, (pair.score, pair.ticket_id))
    by_id = {q.id: q for q in data.queries}
    given = []
    for qid, (_, tid) in list(best.items())[:n_queries]:
        q = by_id[qid]
        store.add_feedback(Feedback(q.subject, q.description, tid, "YES", "m", "i"))
        given.append((q, tid))
    return given


def test_yes_only_feedback_recalibrates_on_random_tickets_as_no(kb):
    """A calibrator fitted on YES alone would map every score to 5; random tickets of the knowledge base are the
    NO side, and, as label-free training calibrates, one ticket each judged query ranks 5th to 20th (the off-topic
    promise), so judged tickets still score above random ones afterwards and scores keep their spread."""
    from recommender.model.mined_calibration import BAND_NO

    _, store, model_dir, data = kb
    given = _give_yes(store, data)
    assert len(given) >= 8
    tuned, report = fine_tune(TicketModel.load(model_dir), feedback_dataset(store), data, None, seed=0, epochs=1,
                         progress=False, knowledge_base=data.tickets)
    by_id = {t.id: t for t in data.tickets}
    queries = [q for q, _ in given]
    bm25 = Bm25Scorer(data.tickets)

    def scores(tickets):  # as served: the lexical feature over the knowledge base
        lexical = bm25.lexical_pairs([query_text(q) for q in queries], np.arange(len(queries)), [t.id for t in tickets])
        return tuned.calibrate(tuned.score_pairs(queries, tickets, lexical))

    yes = scores([by_id[t] for _, t in given])
    rng = np.random.default_rng(0)
    rand = scores([data.tickets[int(i)] for i in rng.choice(len(data.tickets), len(given))])
    assert np.median(yes) > np.median(rand) + 1.0
    assert len(np.unique(np.round(np.r_[yes, rand], 6))) > len(given)
    fitted = report["calibration"]
    assert fitted["judged"]["pairs"] == len(given)
    assert fitted[BAND_NO]["pairs"] == len(given)
    assert fitted["random NO"]["pairs"] > len(given)


def test_feedback_re_selects_weights_that_rank_the_judged_tickets_better(kb):
    """A model whose weights serve the judged queries badly (the barely trained LSTM alone) gets weights from its
    grid re-selected on the feedback, because re-selecting pays in cross-validation over the judged queries."""
    _, store, model_dir, data = kb
    _give_yes(store, data)
    base = TicketModel.load(model_dir)
    spec = base.metric_spec()
    base.net.set_weights([v for *_, v in spec["pairs"]], {c: float(c == "h") for c in spec["channels"]}, 0.0)
    base.invalidate()
    tuned, report = fine_tune(base, feedback_dataset(store), data, None, seed=0, epochs=1, progress=False,
                              knowledge_base=data.tickets)
    selection = report["weight_selection"]
    assert selection["changed"] and selection["cross_validated"] > selection["current"] + selection["stderr"]
    assert tuned.metric_spec() == selection["spec"] != base.metric_spec()
    kept, _ = fine_tune(tuned, feedback_dataset(store), data, None, seed=0, epochs=1, progress=False,
                        knowledge_base=data.tickets)
    assert kept.meta["fine_tuning"][-1]["weight_selection"]["changed"] is False  # already the selected weights
