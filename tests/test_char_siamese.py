"""The character-level Siamese BLSTM (Neculoiu et al. 2016) and its character-trigram baseline."""
import json

import numpy as np
import pytest
import torch

from recommender.data.records import Query, Ticket, component_text, query_text, ticket_text
from recommender.data.synthetic import generate
from recommender.errors import InputError, ModelError
from recommender.lexical.trigram import TrigramMatcher
from recommender.model.char_siamese import (ARCH, CharBLSTM, CharSiamese, CharSiameseConfig, TrigramEncoder,
                                            contrastive_loss, grid_model)

#: Small enough to train in seconds on one thread; the structure (stacked BLSTM, mean, projection) is the paper's.
TINY = dict(char_dim=8, hidden=16, layers=2, output_dim=16, epochs=2, batch_size=16)


@pytest.fixture(scope="module")
def kb():
    return generate(n_tickets=40, n_queries=0, seed=5).tickets


@pytest.fixture(scope="module")
def trained(kb):
    torch.set_num_threads(1)
    return CharSiamese(CharSiameseConfig(**TINY)).fit(kb, seed=3, progress=False)


def test_network_shapes_and_unit_vectors():
    config = CharSiameseConfig()
    net = CharBLSTM(40, config)
    assert len(net.cells) == 2 * config.layers == 8  # 4 layers, two directions each
    assert all(c.hidden_size == 64 for c in net.cells)
    ids = torch.randint(2, 40, (3, 7))
    assert net(ids, torch.tensor([7, 5, 1])).shape == (3, 128)
    model = CharSiamese(config, "abcdefghijklmnopqrstuvwxyz ", net)
    vectors = model.encode(["pump trips", "", "a much longer subject about a valve leak" * 5])
    assert vectors.shape == (3, 128) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors[[0, 2]], axis=1), 1.0, atol=1e-5)
    assert not vectors[1].any()  # an empty text: a zero row, similar to nothing
    assert model.similarity(vectors[0], vectors).shape == (3,)
    assert model.similarity(vectors[:1], vectors).shape == (3,)  # one query row against many
    assert model.similarity(vectors, vectors).shape == (3,)  # aligned rows
    assert model.similarity(vectors[0], vectors)[0] == pytest.approx(1.0, abs=1e-5)


def test_a_vector_does_not_depend_on_its_batch_or_padding():
    model = CharSiamese(CharSiameseConfig(), "abcdefghijklmnopqrstuvwxyz ", CharBLSTM(29, CharSiameseConfig()))
    alone = model.encode(["valve leak"])
    with_longer = model.encode(["valve leak", "compressor surge at start-up after the overhaul"])
    assert np.allclose(alone[0], with_longer[0], atol=1e-6)


def test_texts_are_cut_to_max_chars():
    model = CharSiamese(CharSiameseConfig(), "ab", CharBLSTM(4, CharSiameseConfig()))
    long = "ab" * 50
    assert np.allclose(model.encode([long + "a" * 30])[0], model.encode([long])[0], atol=1e-6)


def test_contrastive_loss_on_hand_computed_values():
    energy = torch.tensor([0.6, -0.2, 0.6, 0.3, -0.2, 0.9])
    similar = torch.tensor([True, True, False, False, False, False])
    loss = contrastive_loss(energy, similar, margin=0.5)
    # similar: (1 − E)²/4 → 0.16/4, 1.44/4; dissimilar: E² above the margin, else 0 → 0.36, 0, 0, 0.81
    assert loss.tolist() == pytest.approx([0.04, 0.36, 0.36, 0.0, 0.0, 0.81])
    assert contrastive_loss(energy, similar, margin=0.0)[3].item() == pytest.approx(0.09)


def test_components_and_config_checks():
    ticket = Ticket("t1", "Pump trips", "At start-up.", "Replaced the relay.")
    assert component_text(ticket, "SUB") == "Pump trips"
    assert component_text(ticket, "SUB+SOL") == "Pump trips\nReplaced the relay."
    assert component_text(ticket, "SUB+SOL", solution=False) == "Pump trips"
    assert component_text(Query("Pump trips", "At start-up."), "SUB+DESC+SOL") == "Pump trips\nAt start-up."
    assert query_text(ticket) == "Pump trips\nAt start-up."  # what a ticket asks as a query: never its solution
    assert query_text(Query("Pump trips", "")) == query_text(Query("", "Pump trips")) == "Pump trips"
    assert ticket_text(ticket) == "Pump trips\nAt start-up.\nReplaced the relay."  # MiniLM's document
    assert ticket_text(Ticket("T2", "Pump trips", "", "")) == "Pump trips"
    with pytest.raises(InputError, match="component 'SUBJECT'"):
        CharSiameseConfig(component="SUBJECT")
    with pytest.raises(InputError, match="unknown char-siamese option.*units"):
        CharSiameseConfig.from_dict({"units": 64})
    with pytest.raises(InputError, match="margin"):
        CharSiameseConfig(margin=2.0)


def test_tiny_training_ranks_an_exact_copy_first_and_is_deterministic(kb, trained):
    history = trained.meta["history"]
    assert trained.meta["pairs"] == "mined" and [h["epoch"] for h in history] == [0, 1, 2]
    assert history[-1]["loss"] > 0
    rank = trained.ranker(kb)
    matrix = trained.encode_tickets(kb)
    subjects = [t.subject for t in kb]
    unique = [t for t in kb if subjects.count(t.subject) == 1][:10]  # the generator repeats a few subjects
    assert len(unique) == 10
    for ticket in unique:
        assert rank(Ticket("query", ticket.subject, "whatever the description says"), 1) == [ticket.id]
        scores = trained.similarity(trained.encode([ticket.subject])[0], matrix)
        others = np.delete(scores, kb.index(ticket))
        assert scores[kb.index(ticket)] > others.max() + 1e-4  # first by a margin: no collapse onto one vector
    again = CharSiamese(CharSiameseConfig(**TINY)).fit(kb, seed=3, progress=False)
    assert again.version == trained.version
    assert CharSiamese(CharSiameseConfig(**TINY)).fit(kb, seed=4, progress=False).version != trained.version


def test_labelled_pairs_train_with_four_negatives_each(tiny_tickets):
    data = tiny_tickets(0)
    lines = []
    model = CharSiamese(CharSiameseConfig(**{**TINY, "epochs": 1})).fit(data.tickets, data, seed=0, progress=False,
                                                                        echo=lines.append)
    assert model.meta["pairs"] == "labelled"
    positives = model.meta["positives"]
    assert positives == sum(1 for p in data.pairs if p.score >= 3)
    assert f"{positives:,} of them similar" in lines[0]
    assert "on {:,} pairs".format(5 * positives) in lines[1]  # 1 similar : 4 dissimilar


def test_save_load_round_trip_and_damaged_files_refused(tmp_path, kb, trained):
    out = tmp_path / "char"
    trained.save(out)
    config = json.loads((out / "config.json").read_text())
    assert config["arch"] == ARCH and config["format_version"] == 1 and set(config["files"]) == {"weights.pt"}
    loaded = CharSiamese.load(out)
    assert loaded.version == trained.version and loaded.config == trained.config
    assert np.array_equal(loaded.encode_tickets(kb), trained.encode_tickets(kb))
    assert CharSiamese.is_saved_at(out) and not CharSiamese.is_saved_at(tmp_path)

    weights = out / "weights.pt"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"weights\.pt.*damaged, retrain it: ticketrec train --arch char-siamese"):
        CharSiamese.load(out)
    weights.unlink()
    with pytest.raises(ModelError, match="do not match the SHA-256"):
        CharSiamese.load(out)
    with pytest.raises(ModelError, match="no char-siamese model at"):
        CharSiamese.load(tmp_path / "nothing")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"format_version": 1, "hyperparameters": {}}))
    with pytest.raises(ModelError, match="not a char-siamese one"):
        CharSiamese.load(tmp_path / "other")


def test_trigram_matcher_finds_a_subject_despite_typos():
    subjects = ["Printer offline after the update", "Password reset fails", "VPN drops every hour",
                "Printer paper jam in tray 2"]
    matcher = TrigramMatcher(subjects)
    rows, scores = matcher.top_k("Pritner ofline aftr the updte", 2)
    assert rows.tolist()[0] == 0 and scores[0] > scores[1] > 0
    assert matcher.scores("Password reset fails")[1] == pytest.approx(1.0, abs=1e-5)
    assert matcher.top_k("drops every hour VPN", 1)[0].tolist() == [2]  # word order does not matter
    with pytest.raises(InputError, match="no character trigram"):
        TrigramMatcher(["", "  "])


def test_trigram_encoder_as_a_grid_row(tiny_tickets):
    data = tiny_tickets(1)
    encoder = grid_model(data, None, {"arch": "trigram"}, 0, "unused")
    assert isinstance(encoder, TrigramEncoder)
    vectors = encoder.encode_tickets(data.tickets)
    own = encoder.similarity(encoder.encode_queries([data.tickets[3]])[0], vectors)
    assert own.shape == (len(data.tickets),) and own[3] == pytest.approx(own.max())
    with pytest.raises(InputError, match="pairs labelled or mined"):
        grid_model(data, None, {"pairs": "feedback"}, 0, "unused")


def test_cli_trains_a_char_siamese_model_from_the_store(tmp_path, kb):
    from click.testing import CliRunner

    from recommender.cli import main
    from recommender.data.store import Dataset
    from recommender.data.synthetic import write_jsonl

    env = {"TICKETREC_HOME": str(tmp_path / "home")}
    data = write_jsonl(Dataset(kb, source="kb"), tmp_path / "kb.jsonl")
    runner = CliRunner()
    assert runner.invoke(main, ["import", str(data), "--quiet"], env=env).exit_code == 0
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({k: v for k, v in TINY.items() if k != "epochs"}))
    out = tmp_path / "char"
    result = runner.invoke(main, ["train", "--arch", "char-siamese", "--config", str(config), "--epochs", "1",
                                  "--out", str(out)], env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["arch"] == "char-siamese" and report["pairs"] == "mined"
    assert CharSiamese.load(out).version == report["version"]
    wrong = runner.invoke(main, ["train", "--arch", "char-siamese", "--preset", "ml", "--out", str(out)], env=env)
    assert wrong.exit_code != 0 and "do not apply to --arch char-siamese" in wrong.output
    # its model is a channel of another, never the served one: without --out it is refused, not written there
    unnamed = runner.invoke(main, ["train", "--arch", "char-siamese", "--config", str(config)], env=env)
    assert unnamed.exit_code != 0 and "give its directory with --out DIR" in unnamed.output
    assert not (tmp_path / "home" / "models" / "current").exists()


def test_siamese_grid_rows_run_end_to_end_on_tiny_data(tmp_path):
    from recommender.data import synthetic
    from recommender.evaluation import experiments as X

    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    synthetic.write_jsonl(synthetic.generate(n_tickets=40, n_queries=8, seed=1), train)
    synthetic.write_jsonl(synthetic.generate(n_tickets=30, n_queries=6, seed=2), dev)
    ours = [r for r in X.siamese_rows() if r.preset == "char-siamese"]
    assert [r.overrides.get("arch", r.overrides.get("pairs")) for r in ours] == ["trigram", "labelled", "mined"]
    rows = [X.Row(r.name, "", r.description, r.kind, r.preset, {**r.overrides, **TINY, "epochs": 1}
                  if r.overrides.get("arch") != "trigram" else r.overrides, r.headline) for r in ours]
    results = X.run_experiment(train, dev, tmp_path / "out", rows=rows, seeds=2, candidates=0, progress=False)
    assert not results["notes"], results["notes"]
    by_name = {r["name"]: r for r in results["rows"]}
    assert by_name["CharSiamese SUB, labelled pairs"]["seeds"] == [0, 1]  # the headline row: every seed
    for row in results["rows"]:
        assert 0.0 <= row["dev"]["official_map"] <= 100.0 and 0.0 <= row["dev"]["kb_acc@10"] <= 1.0
    assert CharSiamese.is_saved_at(tmp_path / "out" / "models" / "charsiamese-sub--mined-pairs-seed0")


def test_siamese_grid_on_duplicate_links(tmp_path, kb):
    import csv

    from recommender.data.store import Dataset
    from recommender.data.synthetic import write_jsonl
    from recommender.evaluation.experiments import Row
    from recommender.evaluation.siamese_duplicates import run_siamese_duplicates

    data = write_jsonl(Dataset(kb, source="kb"), tmp_path / "kb.jsonl")
    links = tmp_path / "links.csv"
    with open(links, "w", newline="") as fh:
        csv.writer(fh).writerows([("a", "b"), (kb[0].id, kb[4].id), (kb[1].id, kb[9].id)])
    rows = [Row("trigrams", "", "", "encoder", "char-siamese", {"arch": "trigram"}),
            Row("char", "", "", "encoder", "char-siamese", {**TINY, "epochs": 1, "pairs": "mined"}),
            Row("char, labelled", "", "", "encoder", "char-siamese", {"pairs": "labelled"})]
    results = run_siamese_duplicates(data, links, out=tmp_path / "report", rows=rows, n_boot=50, progress=False)
    assert [r["system"] for r in results["rows"]] == ["BM25", "trigrams", "char"]
    assert all(r["queries"] == 4 and 0.0 <= r["MRR@10"] <= 1.0 for r in results["rows"])
    assert any("char, labelled: left out" in note for note in results["notes"])
    assert "| char |" in (tmp_path / "report" / "report.md").read_text()


def test_cli_siamese_grid_on_duplicates_trains_its_own_networks(tmp_path):
    from click.testing import CliRunner

    from recommender.cli import main

    kb, links = tmp_path / "kb.csv", tmp_path / "links.csv"
    kb.write_text("id,subject,description\nA,Pump trips,At start-up\nB,Pump trip,During start-up\n")
    links.write_text("A,B\n")
    result = CliRunner().invoke(main, ["evaluate", "--kb", str(kb), "--duplicates", str(links), "--grid", "siamese",
                                       "--model", str(tmp_path / "m")], env={"TICKETREC_HOME": str(tmp_path / "h")})
    assert result.exit_code != 0 and "--grid siamese trains its own networks on the --kb tickets: drop --model" \
        in result.output
