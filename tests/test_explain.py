"""Why each result was chosen: per-channel distances add up to the ranking's d, shares sum to 1 (or are all 0), a
channel with weight 0 never appears, and a ticket pasted as the query is explained by a weighted channel."""
import numpy as np
import pytest

from recommender.config import Settings
from recommender.data.records import Query
from recommender.data.store import Dataset, Store
from recommender.serving.engine import Recommender
from recommender.serving.index_build import build_index
from recommender.serving.scoring import PackedVectors, channel_distances, channel_shares, distances

SPEC = {
    "pairs": [["SUB", "SUB", 0.3], ["DESC", "DESC", 0.3], ["SUB", "DESC", 0.2], ["SUB", "SOL", 0.1], ["DESC", "SOL", 0.1]],
    "channels": {"h": 0.7, "E": 0.1, "T": 0.2, "S": 0.4},
    "bm25": 0.5,
}
DIMS = {"h": 6, "E": 11, "T": 4, "S": 9}


def random_vectors(n: int, components, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"{c}.{ch}": (rng.standard_normal((n, d)) * 0.3).astype(np.float32)
            for c in components for ch, d in DIMS.items()}


# -- the per-channel distances ------------------------------------------------------------------------------
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("use_numba", [True, False])
def test_channel_distances_add_up_to_the_ranking_distance(packed, use_numba):
    tickets = random_vectors(500, ["SUB", "DESC", "SOL"], seed=1)
    ticket_vecs = PackedVectors.pack(tickets) if packed else tickets
    query = {k: v[:1] for k, v in random_vectors(1, ["SUB", "DESC"], seed=2).items()}
    rng = np.random.default_rng(3)
    rows = rng.choice(500, 40, replace=False)
    bm25 = rng.uniform(0, 9, 40).astype(np.float32)
    for bm, bm_max in ((bm25, None), (bm25, 12.0), (None, None)):
        parts = channel_distances(SPEC, query, ticket_vecs, rows, bm, bm25_max=bm_max, use_numba=use_numba)
        assert set(parts) == {"h", "E", "T", "S"} | ({"bm25"} if bm is not None else set())
        assert all(v.shape == (40,) and v.dtype == np.float32 and (v >= 0).all() for v in parts.values())
        d = distances(SPEC, query, ticket_vecs, rows, bm, bm25_max=bm_max, use_numba=use_numba)
        np.testing.assert_allclose(sum(parts.values()), d, rtol=1e-5, atol=1e-5)


def test_channel_distances_of_a_real_index_add_up_to_its_ranking(served):
    settings, store, engine = served
    index = engine.index
    query = engine.model.encode_queries([Query("pump pressure", "the pump trips on low pressure")])
    rows = np.arange(len(index))
    bm25 = np.linspace(0.0, 7.0, len(index)).astype(np.float32)
    parts = channel_distances(index.metric_spec, query, index.vectors, rows, bm25)
    np.testing.assert_allclose(sum(parts.values()), distances(index.metric_spec, query, index.vectors, rows, bm25),
                               rtol=1e-5, atol=1e-5)


def test_a_channel_with_weight_zero_is_left_out():
    spec = {**SPEC, "channels": {"h": 0.7, "E": 0.0, "T": 0.2, "S": 0.0}, "bm25": 0.0}
    tickets = random_vectors(30, ["SUB", "DESC", "SOL"], seed=4)
    query = {k: v[:1] for k, v in random_vectors(1, ["SUB", "DESC"], seed=5).items()}
    parts = channel_distances(spec, query, tickets, np.arange(30), np.ones(30, np.float32))
    assert set(parts) == {"h", "T"}


def test_bad_rows_are_refused():
    tickets = random_vectors(10, ["SUB", "DESC", "SOL"], seed=6)
    query = {k: v[:1] for k, v in random_vectors(1, ["SUB", "DESC"], seed=7).items()}
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        channel_distances(SPEC, query, tickets, [3, 10])


# -- shares -------------------------------------------------------------------------------------------------
def test_shares_are_the_positive_gains_over_the_typical_candidate():
    reference = {"a": np.array([4.0, 5.0, 6.0]), "b": np.array([1.0, 2.0, 3.0]), "c": np.array([0.0, 1.0, 9.0])}
    result = {"a": np.array([2.0, 5.0, 7.0, 4.0]), "b": np.array([1.0, 0.0, 2.5, 1.0]),
              "c": np.array([1.5, 3.0, 9.0, 0.0])}
    shares = channel_shares(result, reference)
    # gains vs medians (5, 2, 1): row 0 (3, 1, −0.5); row 1 (0, 2, −2); row 2 none positive; row 3 (1, 1, 1)
    assert shares[0] == pytest.approx({"a": 0.75, "b": 0.25, "c": 0.0})
    assert shares[1] == pytest.approx({"a": 0.0, "b": 1.0, "c": 0.0})
    assert shares[2] == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert shares[3] == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert channel_shares({}, {}) == []


# -- in the engine's answer ---------------------------------------------------------------------------------
def with_weights(model, channels: dict, bm25: float | None = None):
    """The model with channel weights (and the BM25 weight) replaced, pair weights kept."""
    spec = model.metric_spec()
    model.net.set_weights([v for *_, v in spec["pairs"]], {**spec["channels"], **channels}, bm25)
    model.invalidate()
    return model


@pytest.fixture(params=[20, 0], ids=["K20", "K0"])
def served(request, tmp_path, tiny_model):
    """(settings, store, engine): the tiny knowledge base indexed with h 0.7, E 0.2, T 0 and BM25 0.5; K = 20
    pre-filtered candidates, or every ticket (K = 0)."""
    from recommender.model.bundle import TicketModel

    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_MAX_DESCRIPTION": "2000",
                                  "TICKETREC_CANDIDATES": str(request.param)})
    model = with_weights(TicketModel.load(tiny_model[0]), {"h": 0.7, "E": 0.2, "T": 0.0}, bm25=0.5)
    store = Store(settings.db)
    store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
    build_index(store, model, settings, progress=False)
    yield settings, store, Recommender(settings, store=store)
    store.close()


def weighted(spec: dict) -> set[str]:
    return {c for c, w in spec["channels"].items() if w > 0} | ({"bm25"} if spec.get("bm25", 0) > 0 else set())


def test_shares_sum_to_one_and_only_weighted_channels_appear(served, tiny_model):
    _, _, engine = served
    spec = engine.index.metric_spec
    assert spec["channels"]["T"] == 0 and weighted(spec) == {"h", "E", "bm25"}
    seen = set()
    for q in tiny_model[1].queries[:6]:
        answer = engine.recommend(Query(q.subject, q.description), k=8)
        for rec in answer:
            shares = rec.channel_shares
            assert set(shares) == weighted(spec)  # T (weight 0) never appears
            assert all(0.0 <= v <= 1.0 for v in shares.values())
            total = sum(shares.values())
            assert total == pytest.approx(1.0, abs=1e-9) or total == 0.0
            seen |= {c for c, v in shares.items() if v > 0}
            d = rec.to_dict()["channel_shares"]
            assert set(d) == set(shares) and sum(d.values()) == pytest.approx(total, abs=1e-3)
    assert len(seen) >= 2  # more than one channel explains some result


def test_a_ticket_pasted_as_the_query_is_explained_by_a_weighted_channel(served, tiny_model):
    _, _, engine = served
    spec = engine.index.metric_spec
    for ticket in tiny_model[1].tickets[:5]:
        answer = engine.recommend(Query(ticket.subject, ticket.description), k=5)
        top = answer[0]
        assert top.ticket.id == ticket.id
        assert sum(top.channel_shares.values()) == pytest.approx(1.0)
        best = max(top.channel_shares, key=top.channel_shares.get)
        assert best in weighted(spec) and top.channel_shares[best] > 0.0


def a_word_few_tickets_share(engine, tickets, fewest: int) -> tuple[str, int]:
    """(a subject word, how many tickets share it): at least `fewest` of them, fewer than the K candidates."""
    index = engine.index
    for ticket in tickets:
        for word in ticket.subject.split():
            rows, _ = engine.candidates(Query(word, ""), index, least=1)
            if rows is not None and fewest <= len(rows) < engine.settings.candidates:
                return word, len(rows)
    raise AssertionError("no subject word of the tiny knowledge base is shared by that many tickets")


def shares_against(engine, query: Query, answer, pool: np.ndarray) -> list[dict[str, float]]:
    """The answer's shares against every ticket of `pool` (index rows), a candidate with its BM25, others 0."""
    from recommender.serving.scoring import channel_distances, channel_shares

    index = engine.index
    rows, bm25 = engine.candidates(query, index, least=1)
    every = np.zeros(len(index), np.float32)
    every[rows] = bm25
    result_rows = np.array([index.row_of[r.ticket.id] for r in answer])
    d = channel_distances(index.metric_spec, engine.model_for(index).encode_queries([query]), index.vectors,
                          np.concatenate([result_rows, pool]), np.concatenate([every[result_rows], every[pool]]),
                          bm25_max=float(bm25.max()))
    n = len(answer)
    return channel_shares({c: v[:n] for c, v in d.items()}, {c: v[n:] for c, v in d.items()})


@pytest.mark.parametrize("served", [20], indirect=True, ids=["K20"])  # K = 0: the candidates are every ticket
def test_results_of_a_query_few_tickets_share_a_word_with_are_explained_against_every_ticket(served, tiny_model):
    """With fewer candidates than K (every ticket sharing a word with the query), the typical candidate is the
    typical ticket (those outside the candidates with no words in common), not the median of the few candidates,
    which are mostly the results themselves: every result holds the query's word, so each has a words-in-common
    share, where against the candidates the lower half of them had none. With a filter, the typical ticket of
    those it keeps."""
    from recommender.data.filters import TicketFilter
    from recommender.serving.engine import result_channel_shares

    settings, _, engine = served
    assert settings.candidates == 20
    tickets = tiny_model[1].tickets
    word, n = a_word_few_tickets_share(engine, tickets, fewest=4)
    query, index = Query(word, ""), engine.index
    answer = engine.recommend(query, k=n)
    assert answer.info.candidates == n and len(answer) == n
    assert all(r.channel_shares["bm25"] > 0 for r in answer), [r.channel_shares for r in answer]
    for got, want in zip(answer, shares_against(engine, query, answer, np.arange(len(index)))):
        assert got.channel_shares == pytest.approx(want, abs=1e-6)
    # against the candidates alone (the reference before), some result had no words-in-common share
    rows, bm25 = engine.candidates(query, index, least=1)
    alone = result_channel_shares(index, engine.model_for(index).encode_queries([query]),
                                  [(r.ticket.id, r.raw_score, r.bm25) for r in answer], rows, bm25)
    assert any(s["bm25"] == 0 for s in alone)

    # filtered: the tickets of a subsystem that the highest BM25 is not in (the lexical feature stays normalised by
    # the query's maximum over every ticket, as the ranking's)
    top = max(answer, key=lambda r: r.bm25).ticket.metadata["subsystem"]
    subsystem = next(r.ticket.metadata["subsystem"] for r in answer if r.ticket.metadata["subsystem"] != top)
    where = TicketFilter.equal({"subsystem": subsystem})
    passing = np.array([index.row_of[t.id] for t in tickets if t.metadata["subsystem"] == subsystem])
    filtered = engine.recommend(query, k=1, where=where)
    assert filtered.info.candidates < len(passing)  # those of the passing tickets that share the word
    assert filtered[0].bm25 < max(r.bm25 for r in answer)
    for got, want in zip(filtered, shares_against(engine, query, filtered, np.sort(passing))):
        assert got.channel_shares == pytest.approx(want, abs=1e-6)


def test_a_model_without_bm25_has_no_words_in_common_share(tmp_path, tiny_model):
    from recommender.model.bundle import TicketModel

    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_CANDIDATES": "0"})
    model = with_weights(TicketModel.load(tiny_model[0]), {"h": 0.0, "E": 0.3, "T": 0.5}, bm25=0.0)
    with Store(settings.db) as store:
        store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
        build_index(store, model, settings, progress=False)
        q = tiny_model[1].queries[0]
        answer = Recommender(settings, store=store).recommend(Query(q.subject, q.description), k=5)
    assert answer.info.prefilter == "none"
    for rec in answer:
        assert set(rec.channel_shares) == {"E", "T"}


# -- the Celery path: the workers return ids and g; the engine explains them from its index ---------------------
from test_celery import home, redis_url, worker  # noqa: E402,F401  (the private Redis and `ticketrec worker`)


@pytest.mark.integration
@pytest.mark.parametrize("candidates", [0, 20])
def test_results_scored_on_workers_get_the_in_process_shares(home, worker, tiny_model, candidates):
    _, settings = home
    local = Recommender(settings.replace(candidates=candidates))
    remote = Recommender(settings.replace(candidates=candidates, broker_url=worker))
    for q in tiny_model[1].queries[:3]:
        query = Query(q.subject, q.description)
        expected, got = local.recommend(query, k=6), remote.recommend(query, k=6)
        assert got.info.mode == "celery", got.info
        assert [r.ticket.id for r in got] == [r.ticket.id for r in expected]
        for a, b in zip(got, expected):
            assert a.channel_shares.keys() == b.channel_shares.keys() and a.channel_shares
            assert list(a.channel_shares.values()) == pytest.approx(list(b.channel_shares.values()), abs=1e-6)
