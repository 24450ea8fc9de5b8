"""The LDA baseline and the DocNADE-vs-LDA perplexity comparison."""
import json
import math

import numpy as np
import pytest

from topic_models.docnade import TopicModelError
from topic_models.lda import fit_lda
from topic_models.perplexity import build_id_documents, compare, markdown_table


def _toy_corpus(n_docs: int = 40, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [((0 if n % 2 == 0 else 6) + rng.integers(0, 6, size=rng.integers(5, 15))).tolist() for n in range(n_docs)]


@pytest.fixture(scope="module")
def lda():
    return fit_lda(_toy_corpus(), 12, n_topics=2, passes=20, seed=0)


def test_lda_fits_with_finite_perplexity_and_normalised_proportions(lda):
    held = _toy_corpus(10, seed=3)
    ppl = lda.perplexity(held)
    assert math.isfinite(ppl)
    assert ppl < 9  # two clean topics of 6 words: far better than uniform over 12 words
    theta = lda.transform(held + [[]])
    assert theta.shape == (11, 2)
    np.testing.assert_allclose(theta.sum(axis=1), 1.0, atol=1e-5)
    tops = lda.top_words(6)
    assert sorted(sorted(t) for t in tops) == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]


def test_lda_perplexity_is_the_chain_rule_with_the_prefix_posterior(lda):
    doc = [7, 8, 7, 11]
    phi = lda.model.get_topics().astype(np.float64)
    phi /= phi.sum(axis=1, keepdims=True)
    alpha = np.asarray(lda.model.alpha, dtype=np.float64)
    nll = 0.0
    for i, word in enumerate(doc):
        if i == 0:
            theta = alpha / alpha.sum()
        else:
            counts = np.bincount(doc[:i], minlength=12)
            gamma, _ = lda.model.inference([[(w, int(c)) for w, c in enumerate(counts) if c]])
            theta = gamma[0] / gamma[0].sum()
        nll -= math.log(theta @ phi[:, word])
    assert lda.perplexity([doc], refresh="every") == pytest.approx(math.exp(nll / len(doc)), rel=1e-3)
    assert lda.perplexity([doc]) == lda.perplexity([doc], refresh="every")  # the default
    # The cheaper geometric refresh is still a proper predictive: finite and close on a shuffled-like document.
    long_doc = _toy_corpus(1, seed=9)[0] * 3
    assert lda.perplexity([long_doc], refresh="geometric") == pytest.approx(lda.perplexity([long_doc]), rel=0.1)


def test_lda_refuses_bad_input(lda):
    with pytest.raises(TopicModelError, match="outside"):
        lda.perplexity([[12]])
    with pytest.raises(TopicModelError, match="no training document"):
        fit_lda([[]], 12, n_topics=2)
    with pytest.raises(TopicModelError, match="outside"):
        fit_lda([[0, 99]], 12, n_topics=2)


def test_build_id_documents_drops_rare_words_everywhere():
    train = {"M1": [["pump", "leak"], ["pump"]], "M2": [["pump", "leak", "seal"], ["pump", "seal", "oil"]]}
    held = {"all": [["pump", "oil", "valve", "seal"]]}
    words, train_ids, held_ids = build_id_documents(train, held, vocab_from="M2", min_count=2)
    assert words == ["pump", "seal"]
    assert train_ids["M1"] == [[0], [0]]
    assert held_ids["all"] == [[0, 1]]
    with pytest.raises(TopicModelError, match="min count"):
        build_id_documents(train, held, vocab_from="M1", min_count=5)


def test_compare_gives_one_row_per_training_set_and_model():
    docs = _toy_corpus(20)
    held = {"held": _toy_corpus(6, seed=4)}
    rows = compare({"M1": [d[:3] for d in docs], "M2": docs}, held, vocab_size=12, n_topics=2,
                   docnade_options={"epochs": 2}, lda_options={"passes": 2}, progress=False)
    assert [(r["train"], r["model"]) for r in rows] == [("M1", "LDA"), ("M1", "DocNADE"), ("M2", "LDA"), ("M2", "DocNADE")]
    assert all(math.isfinite(r["held"]) and r["held words"] == sum(map(len, held["held"])) for r in rows)
    table = markdown_table(rows, ["held"])
    assert table.count("\n") == 5 and "DocNADE" in table


def test_cli_topics_perplexity_on_synthetic_files(tmp_path):
    from click.testing import CliRunner

    from recommender.cli import main
    from recommender.data.synthetic import generate, write_jsonl

    write_jsonl(generate(n_tickets=40, n_queries=0, seed=1), tmp_path / "train.jsonl")
    write_jsonl(generate(n_tickets=15, n_queries=0, seed=2), tmp_path / "held.jsonl")
    args = ["topics", "perplexity", "--train", str(tmp_path / "train.jsonl"), "--heldout", str(tmp_path / "held.jsonl"),
            "--topics", "3", "--epochs", "1", "--passes", "1", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    assert report["topics"] == 3 and report["vocabulary"] > 10
    assert len(report["rows"]) == 4
    assert all(math.isfinite(r["SUB+DESC+SOL"]) and r["SUB+DESC+SOL"] > 1 for r in report["rows"])


def test_cli_topics_show_without_a_model_says_what_to_do(tmp_path):
    from click.testing import CliRunner

    from recommender.cli import main

    result = CliRunner().invoke(main, ["topics", "show", "--model", str(tmp_path / "nothing")])
    assert result.exit_code == 1
    assert "ticketrec train" in result.output and "Traceback" not in result.output
