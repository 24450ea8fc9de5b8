"""benchmarks/real_kb.py: the real-vocabulary knowledge base, over a small data directory of the same layout."""
import csv
import json

import pytest
import real_kb

from recommender.data.importers import load

SEMEVAL = """<?xml version="1.0" encoding="utf-8"?>
<xml version="1.0">
<OrgQuestion ORGQ_ID="Q{n}"><OrgQSubject>Visa renewal question {n}</OrgQSubject><OrgQBody>How long does the visa
 renewal take? My sponsor changed jobs last month.</OrgQBody>
 <Thread THREAD_SEQUENCE="Q{n}_R1"><RelQuestion RELQ_ID="Q{n}_R1" RELQ_RANKING_ORDER="1" RELQ_CATEGORY="Visas"
   RELQ_DATE="2013-01-01" RELQ_RELEVANCE2ORGQ="Relevant"><RelQSubject>Residence permit {n}</RelQSubject>
   <RelQBody>Where do I renew the residence permit? The office was closed.</RelQBody></RelQuestion>
  <RelComment RELC_ID="Q{n}_R1_C1" RELC_RELEVANCE2RELQ="Good"><RelCText>Go to the immigration office in the
  morning. Bring two photos.</RelCText></RelComment>
 </Thread></OrgQuestion>
</xml>
"""


@pytest.fixture
def data_dir(tmp_path):
    """A data directory laid out like ../shared/data, with a few records of each source."""
    (tmp_path / "seamonkey").mkdir()
    with open(tmp_path / "seamonkey" / "SeaMonkey_bugs.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["Issue id", "Summary", "Description"])
        writer.writerow(["1", "Crash when opening the bookmarks manager", "Open the manager. The browser crashes."])
        writer.writerow(["2", "Mail filters ignore the junk flag", "Create a filter on junk mail! It never runs."])
    (tmp_path / "semeval2016").mkdir()
    for n, name in enumerate(("train-part2.xml", "dev.xml"), 1):
        (tmp_path / "semeval2016" / name).write_text(SEMEVAL.format(n=n), encoding="utf-8")
    return tmp_path


def test_tickets_are_recombined_from_real_sentences_and_deterministic(data_dir):
    pools = real_kb.pools(data_dir)
    assert "Crash when opening the bookmarks manager" in pools.subjects
    assert "The browser crashes." in pools.descriptions
    assert "Bring two photos." in pools.solutions
    tickets = real_kb.real_tickets(40, seed=3, data_dir=data_dir)
    assert [t.id for t in tickets] == [f"real-3-{i}" for i in range(40)]
    assert tickets == real_kb.real_tickets(40, seed=3, data_dir=data_dir)
    assert tickets != real_kb.real_tickets(40, seed=4, data_dir=data_dir)
    assert real_kb.real_tickets(10, seed=3, data_dir=data_dir) == tickets[:10]  # ticket i is the same for every n
    for t in tickets:
        assert t.subject in pools.subjects
        low, high = real_kb.DESCRIPTION_SENTENCES
        assert t.description and low <= sum(t.description.count(s) for s in pools.descriptions) <= high
    assert any(t.solution for t in tickets) and any(not t.solution for t in tickets)  # 0-4 answer sentences


def test_queries_come_from_their_own_stream(data_dir):
    queries = list(real_kb.iter_real_queries(20, seed=3, data_dir=data_dir))
    tickets = real_kb.real_tickets(20, seed=3, data_dir=data_dir)
    assert [q.id for q in queries] == [f"real-q3-{i}" for i in range(20)]
    assert [(q.subject, q.description) for q in queries] != [(t.subject, t.description) for t in tickets]


def test_jsonl_is_what_ticketrec_imports(data_dir, tmp_path):
    path = real_kb.write_jsonl(tmp_path / "kb.jsonl", 25, 5, seed=1, data_dir=data_dir)
    data = load(path)
    assert len(data.tickets) == 25 and len(data.queries) == 5
    assert data.tickets[0] == real_kb.real_tickets(1, seed=1, data_dir=data_dir)[0]
    assert all(json.loads(line)["type"] in ("ticket", "query") for line in path.read_text(encoding="utf-8").splitlines())


def test_missing_data_says_where_it_goes(tmp_path, capsys):
    assert not real_kb.available(tmp_path)
    with pytest.raises(real_kb.RealDataMissing, match="SeaMonkey_bugs.csv not found"):
        real_kb.pools(tmp_path / "nowhere")
    assert real_kb.main(["--tickets", "5", "--out", str(tmp_path / "kb.jsonl"), "--data", str(tmp_path)]) == 2
    assert "error: real-vocabulary knowledge base" in capsys.readouterr().err
    assert not (tmp_path / "kb.jsonl").exists()
