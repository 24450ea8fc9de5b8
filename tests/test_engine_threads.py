"""One engine, many threads: while they query, a reindex with another model switches the version, and every
answer is consistent: its items and scores are exactly those of the index version (and its model) its info names."""
import threading
import time

import numpy as np
import torch

from recommender.config import Settings
from recommender.data.records import Query, Ticket
from recommender.data.store import Dataset, Store
from recommender.model.bundle import TicketModel
from recommender.serving.engine import Recommender
from recommender.serving.index import open_version
from recommender.serving.index_build import build_index

THREADS = 8


def test_answers_stay_consistent_while_a_reindex_switches_the_version(tmp_path, tiny_model):
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_CANDIDATES": "20",
                                  "TICKETREC_MODEL": str(tmp_path / "no-model-here")})  # readers use the versions'
    old_model = TicketModel.load(tiny_model[0])
    new_model = TicketModel.load(tiny_model[0])
    with torch.no_grad():
        for param in new_model.net.parameters():
            param.mul_(1.1)  # another fingerprint: every vector of the new version differs
    new_model.invalidate()
    queries = [Query(q.subject, q.description) for q in tiny_model[1].queries[:6]]
    store = Store(settings.db)
    store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
    first = build_index(store, old_model, settings, progress=False)

    engine = Recommender(settings)  # no store given: one connection per thread, as in the web app
    answers: list[tuple[int, object]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def ask(worker: int) -> None:
        i = worker
        try:
            while not stop.is_set():
                q = i % len(queries)
                answers.append((q, engine.recommend(queries[q], k=5)))
                i += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(w,)) for w in range(THREADS)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while len(answers) < 40 and not errors and time.monotonic() < deadline:
            time.sleep(0.01)
        # the reindex: new tickets that answer the queries word for word, encoded with the new model
        store.import_dataset(Dataset([Ticket(f"NEW-{j}", q.subject, q.description, "Replaced the part.")
                                      for j, q in enumerate(queries)], source="new"))
        second = build_index(store, new_model, settings, progress=False)
        switched = len(answers)
        while len(answers) < switched + 40 * THREADS and not errors and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    seen = {a.info.index_version for _, a in answers}
    assert seen == {first, second}, seen
    models = {first: old_model.version, second: new_model.version}
    expected = {}
    for version in seen:  # the reference: one thread, the version pinned
        pinned = Recommender(settings, store=store, index=open_version(settings, version))
        expected[version] = [pinned.recommend(q, k=5) for q in queries]
    new_ids = {f"NEW-{j}" for j in range(len(queries))}
    for q, answer in answers:
        version = answer.info.index_version
        assert answer.info.model_version == models[version]
        reference = expected[version][q]
        assert [r.ticket.id for r in answer] == [r.ticket.id for r in reference]
        np.testing.assert_allclose([r.raw_score for r in answer], [r.raw_score for r in reference], rtol=1e-6)
        assert bool(new_ids & {r.ticket.id for r in answer}) == (version == second)
    store.close()
