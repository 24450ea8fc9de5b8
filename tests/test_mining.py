"""Mining training pairs from a knowledge base, and the augmentations of the character-level Siamese paper."""
import random

import numpy as np
import pytest

from recommender.data.records import NO, YES, Ticket
from recommender.data.synthetic import generate
from recommender.errors import InputError
from recommender.model.augment import Augmenter, induce_synonyms, typo
from recommender.model.mining import (MIN_TICKETS, MiningConfig, draw_excluding, mine_pairs, require_minable,
                                      split_ticket)


@pytest.fixture(scope="module")
def kb():
    return generate(n_tickets=60, n_queries=0, seed=3).tickets


def _as_tuples(mined):
    return ([(q.subject, q.description) for q in mined.train_queries], mined.train_q.tolist(), mined.train_t.tolist(),
            mined.train_y.tolist(), [(q.subject, q.description) for q in mined.held_out_queries],
            mined.held_out_q.tolist(), mined.held_out_t.tolist(), mined.held_out_truth.tolist())


def test_mining_is_deterministic_for_a_seed(kb):
    aug = Augmenter({"valve": ["damper"]}, ["noise"], seed=1)
    a = mine_pairs(kb, MiningConfig(), seed=4, augmenter=aug)
    b = mine_pairs(kb, MiningConfig(), seed=4, augmenter=Augmenter({"valve": ["damper"]}, ["noise"], seed=1))
    c = mine_pairs(kb, MiningConfig(), seed=5, augmenter=aug)
    assert _as_tuples(a) == _as_tuples(b)
    assert _as_tuples(a) != _as_tuples(c)


@pytest.mark.parametrize("held_out_prefix_words", [0, 1_000_000])
def test_targets_leave_the_query_words_out(kb, held_out_prefix_words):
    mined = mine_pairs(kb, MiningConfig(prefix_words=12, held_out_prefix_words=held_out_prefix_words), seed=0)
    by_id = {t.id: t for t in kb}
    held = {q.id.split(":")[1] for q in mined.held_out_queries}
    prefixes = {q.id.split(":")[1]: q.description for q in mined.train_queries + mined.held_out_queries
                if q.id.count(":") == 1}
    assert any(prefixes.values())  # the synthetic descriptions are long enough for a first sentence
    for view in mined.views:
        original = by_id[view.id]
        assert view.subject == ""  # the subject is the query, never the target
        assert view.solution == original.solution
        words, prefix = original.description.split(), prefixes[view.id].split()
        assert prefix + view.description.split() == words  # query and view split the description between them
        limit = held_out_prefix_words if view.id in held and held_out_prefix_words else 12
        assert len(prefix) <= min(limit, len(words) / 2)
        if prefix:
            assert prefixes[view.id].endswith((".", "!", "?"))  # cut between sentences
    train_words = [len(q.description.split()) for q in mined.train_queries if q.id.count(":") == 1]
    held_words = [len(q.description.split()) for q in mined.held_out_queries]
    assert max(train_words) <= 12
    if held_out_prefix_words:  # held-out queries carry up to half of the description, like a whole new ticket
        assert max(held_words) > 12
    else:
        assert max(held_words) <= 12


def test_each_positive_has_its_negatives_half_hard_never_itself(kb):
    config = MiningConfig(negatives=4, hard_share=0.5)
    mined = mine_pairs(kb, config, seed=0)
    for q_arr, t_arr, y_arr, queries in ((mined.train_q, mined.train_t, mined.train_y, mined.train_queries),
                                         (mined.held_out_q, mined.held_out_t, mined.held_out_y, mined.held_out_queries)):
        for qi in range(len(queries)):
            rows, labels = t_arr[q_arr == qi], y_arr[q_arr == qi]
            assert (labels == YES).sum() == 1 and (labels == NO).sum() == 4
            own = rows[labels == YES][0]
            assert own not in rows[labels == NO]  # negatives exclude the positive
            assert len(set(rows.tolist())) == 5
            assert mined.views[own].id == queries[qi].id.split(":")[1]


def test_hard_negatives_share_words_random_ones_need_not(kb):
    from recommender.lexical.bm25 import Bm25Scorer

    mined = mine_pairs(kb, MiningConfig(negatives=4, hard_share=1.0, hard_pool=3), seed=0)
    scorer = Bm25Scorer(mined.views)
    for qi, query in enumerate(mined.held_out_queries):
        own = mined.held_out_truth[qi]
        scores = scorer.scores(f"{query.subject}\n{query.description}")
        scores[own] = -1
        top = set(np.argsort(-scores, kind="stable")[:4].tolist())  # 3 of the top 3 + 1 random fill-in at most
        negs = mined.held_out_t[(mined.held_out_q == qi) & (mined.held_out_y == NO)]
        assert len(set(negs.tolist()) & top) >= 3


def test_each_training_query_records_its_hardest_negative(kb):
    """`train_hard[i]`: the hard negative of training query i with the highest BM25; -1 without hard negatives."""
    from recommender.lexical.bm25 import Bm25Scorer

    aug = Augmenter({"valve": ["damper"]}, ["noise"], seed=1)
    mined = mine_pairs(kb, MiningConfig(negatives=4, hard_share=0.5), seed=0, augmenter=aug)
    assert len(mined.train_hard) == len(mined.train_queries) and (mined.train_hard >= 0).all()
    scorer = Bm25Scorer(mined.views)
    for qi, query in enumerate(mined.train_queries):
        negatives = mined.train_t[(mined.train_q == qi) & (mined.train_y == NO)]
        hardest = int(mined.train_hard[qi])
        assert hardest == negatives[0] and hardest in negatives  # mined first, among its NO pairs
        scores = scorer.scores(f"{query.subject}\n{query.description}")
        assert scores[hardest] > 0 and scores[hardest] >= scores[negatives[1]]  # the other hard one is below
    none = mine_pairs(kb, MiningConfig(negatives=4, hard_share=0.0), seed=0)
    assert (none.train_hard == -1).all()


def test_held_out_slice_is_by_ticket_and_augmented_copies_only_in_training(kb):
    aug = Augmenter({}, ["noise", "extra"], seed=0, typo_words=0.5, extra_words=0.5)
    mined = mine_pairs(kb, MiningConfig(held_out=0.2, augmented=1), seed=0, augmenter=aug)
    held = {q.id.split(":")[1] for q in mined.held_out_queries}
    trained = {q.id.split(":")[1] for q in mined.train_queries}
    assert held and trained and not held & trained
    assert len(held) == max(8, round(0.2 * len(kb)))
    assert all(":aug" not in q.id for q in mined.held_out_queries)
    assert mined.stats["augmented_queries"] > 0
    assert any(":aug" in q.id for q in mined.train_queries)


def test_paraphrase_queries_reword_a_held_out_subject_and_find_its_full_view(kb):
    """Each paraphrase query is a held-out ticket's subject reworded (never as it was) with the held-out query's
    description prefix; it must find its ticket among the full views (the views with their subjects back)."""
    aug = Augmenter({}, ["noise", "extra"], seed=0, typo_words=0.5, extra_words=0.5)
    mined = mine_pairs(kb, MiningConfig(held_out=0.2), seed=0, augmenter=aug)
    by_id = {t.id: t for t in kb}
    held = {q.id: q for q in mined.held_out_queries}
    assert 0 < len(mined.paraphrase_queries) <= len(held)
    assert mined.stats["paraphrase_queries"] == len(mined.paraphrase_queries)
    for query, row in zip(mined.paraphrase_queries, mined.paraphrase_truth):
        original = held[query.id.removesuffix(":paraphrase")]
        assert query.subject.lower() != original.subject.lower() and query.description == original.description
        assert mined.full_views[row].id == mined.views[row].id == original.id.split(":")[1]
    for view, full in zip(mined.views, mined.full_views):
        assert (full.id, full.subject, full.description, full.solution) == (
            view.id, by_id[view.id].subject, view.description, view.solution)
    again = mine_pairs(kb, MiningConfig(held_out=0.2), seed=0, augmenter=Augmenter({}, ["noise", "extra"], seed=0,
                                                                                     typo_words=0.5, extra_words=0.5))
    assert [q.subject for q in again.paraphrase_queries] == [q.subject for q in mined.paraphrase_queries]
    assert not mine_pairs(kb, MiningConfig(held_out=0.2), seed=0).paraphrase_queries  # no augmenter: none
    off = mine_pairs(kb, MiningConfig(held_out=0.2, held_out_paraphrases=False), seed=0, augmenter=aug)
    assert not off.paraphrase_queries and _as_tuples(off) == _as_tuples(mined)  # the other pairs are unchanged


@pytest.mark.parametrize("n", [1, 2, 5, 12, 600, 10_001, 25_000])
def test_random_negatives_are_drawn_as_numpy_draws_them_from_the_other_rows(n):
    # mining's random negatives: the same rows, and the same generator state after them, as numpy's choice over the
    # array of the rows not excluded (what mining built for every query before), for small and large bases alike
    for seed in range(40):
        pick = np.random.default_rng(seed)
        excluded = sorted({int(r) for r in pick.choice(n, min(n, int(pick.integers(0, 6))), replace=False)})
        k = int(pick.integers(0, 5))
        ours, numpys = np.random.default_rng(seed + 1), np.random.default_rng(seed + 1)
        others = np.setdiff1d(np.arange(n), np.array(excluded, dtype=np.int64))
        expected = [int(r) for r in numpys.choice(others, min(k, len(others)), replace=False)]
        rows = draw_excluding(ours, n, excluded, k)
        assert rows == expected and not set(rows) & set(excluded)
        assert ours.integers(1 << 30) == numpys.integers(1 << 30)


def test_too_few_tickets_or_no_negatives_refused():
    tiny = [Ticket(f"t{i}", f"subject {i}", f"description {i}", "") for i in range(MIN_TICKETS - 1)]
    with pytest.raises(InputError, match=f"at least {MIN_TICKETS} tickets"):
        mine_pairs(tiny)
    subject_only = [Ticket(f"t{i}", f"subject {i}", "", "") for i in range(100)]
    with pytest.raises(InputError, match="subject and a description or solution") as refused:
        require_minable(subject_only)
    # what is missing, and how to import it, named: not "import more tickets" to a help desk that has 100
    assert "100 have a subject and nothing else" in str(refused.value)
    assert "--map description=COLUMN" in str(refused.value) and "more tickets" not in str(refused.value)
    no_subject = [Ticket(f"t{i}", "", f"description {i}", "") for i in range(60)] + subject_only[:10]
    with pytest.raises(InputError, match="10 have a subject and nothing else; 60 have no subject") as refused:
        require_minable(no_subject)
    assert "--map subject=COLUMN" in str(refused.value)
    with pytest.raises(InputError, match="Import more tickets"):
        require_minable(tiny)
    with pytest.raises(InputError, match="positives alone"):
        MiningConfig(negatives=0)
    with pytest.raises(InputError, match="unknown mining option"):
        MiningConfig.from_dict({"negativs": 3})


def test_split_ticket_skips_tickets_without_a_subject_or_a_body():
    assert split_ticket(Ticket("a", "", "body", ""), 0) is None
    assert split_ticket(Ticket("a", "subject", "", ""), 0) is None
    q, v = split_ticket(Ticket("a", "Subject", "One two. Three four five. Six seven eight nine.", "fix"), 5)
    assert (q.subject, q.description, v.description, v.solution) == (
        "Subject", "One two.", "Three four five. Six seven eight nine.", "fix")  # 5 words would pass half of 9
    q, v = split_ticket(Ticket("a", "Subject", "One two.\nThree four\n five six seven eight nine ten", "fix"), 9)
    assert (q.description, v.description) == ("One two. Three four", "five six seven eight nine ten")  # lines
    q, v = split_ticket(Ticket("a", "Subject", "One two three four five six. Seven.", ""), 5)
    assert (q.description, v.description) == ("", "One two three four five six. Seven.")  # no sentence fits
    q, v = split_ticket(Ticket("a", "Subject", "One. Two.", ""), 0)
    assert (q.description, v.description) == ("", "One. Two.")  # prefix_words 0: the subject alone
    q, v = split_ticket(Ticket("a", "Subject", "One two three.", ""), 30)  # the last sentence stays in the view
    assert (q.description, v.description) == ("", "One two three.")


# -- augmentations --------------------------------------------------------------------------------------------
def test_typo_rates_are_those_of_the_paper():
    rng = random.Random(0)
    word = "abcdefghij" * 2000
    out = typo(word, rng, substitute=0.20, delete=0.05)
    deleted = 1 - len(out) / len(word)
    assert 0.04 < deleted < 0.06
    # align: deletions shift the text, so count substitutions on a no-deletion run
    same_len = typo(word, random.Random(1), substitute=0.20, delete=0.0)
    changed = np.mean([a != b for a, b in zip(word, same_len)])
    assert 0.18 < changed < 0.22
    assert typo("x", random.Random(2), substitute=0.0, delete=1.0) == "x"  # never empty


def test_augmenter_rates_and_determinism():
    words = [f"w{i}" for i in range(4000)]
    text = " ".join(words)
    aug = Augmenter({}, ["EXTRA"], seed=3, typo_words=0.0, synonym_words=0.0, drop_words=0.10, extra_words=0.10)
    out = aug.augment(text).split()
    kept = [w for w in out if w != "EXTRA"]
    assert 0.08 < 1 - len(kept) / len(words) < 0.12
    assert 0.08 < out.count("EXTRA") / len(words) < 0.12
    assert aug.augment(text) == aug.augment(text) != aug.augment(text, key="other")
    syn = Augmenter({"pump": ["compressor"]}, seed=0, synonym_words=1.0, typo_words=0.0, drop_words=0.0, extra_words=0.0)
    assert syn.augment("pump pump valve") == "compressor compressor valve"
    typos = Augmenter({}, seed=0, typo_words=1.0, synonym_words=0.0, drop_words=0.0, extra_words=0.0)
    noisy = typos.augment("vibration " * 200).split()
    assert 0.5 < np.mean([w != "vibration" for w in noisy]) < 1.0
    assert Augmenter({}, seed=0, drop_words=1.0).augment("single") == "single"  # a one-word text keeps its word


def test_synonyms_come_from_nearest_vectors():
    tokens = ["<pad>", "<unk>", "<eos>", "pump", "compressor", "valve", "the"]
    vectors = np.array([[0, 0], [0, 0], [0, 0], [1.0, 0.1], [1.0, 0.12], [0.0, 1.0], [1.0, 0.11]], np.float32)
    syn = induce_synonyms(tokens, vectors, counts=[0, 0, 0, 9, 9, 9, 9], top_n=1, min_similarity=0.9)
    assert syn["pump"] == ["compressor"] and syn["compressor"] == ["pump"]
    assert "valve" not in syn and "the" not in syn  # no close neighbour; stop words never take part


def test_perturbations_of_the_invariance_tests():
    aug = Augmenter({}, ["EXTRA", "MORE"], seed=1)
    text = "compressor surge at start-up after the overhaul"
    words = text.split()
    typos = aug.perturb(text, "typos", key="q1")
    assert typos != text and len(typos.split()) == len(words)  # every word may change, none is lost
    extra = aug.perturb(text, "extra_words", key="q1").split()
    assert len(extra) == len(words) + 2 and [w for w in extra if w not in ("EXTRA", "MORE")] == words
    swapped = aug.perturb(text, "word_order", key="q1").split()
    assert sorted(swapped) == sorted(words) and sum(a != b for a, b in zip(swapped, words)) == 2
    assert aug.perturb(text, "typos", key="q1") == typos != aug.perturb(text, "typos", key="q2")
    assert aug.perturb("pump pump", "word_order") == "pump pump"  # no two different words to swap
    with pytest.raises(ValueError, match="unknown perturbation"):
        aug.perturb(text, "shuffle")
    many = aug.perturb("abcdefghij " * 300, "typos", key=3).split()
    assert 0.93 < sum(map(len, many)) / 3000 < 0.97  # 5 % of the characters deleted (20 % substituted: `typo`)


def test_a_mining_record_saved_before_template_lines_reads_as_without_them():
    """`MiningConfig.template_share` came later: a model's saved record without it re-mines as it was trained."""
    assert MiningConfig.from_saved({}).template_share == 0.0 == MiningConfig().template_share  # an option, off
    assert "template_share" not in MiningConfig.from_saved({}).fingerprint_dict()
    assert MiningConfig.from_saved({"template_share": 0.01}).fingerprint_dict()["template_share"] == 0.01
    with pytest.raises(InputError, match="template_share"):
        MiningConfig(template_share=1.0)


def test_a_mining_record_saved_before_hard_negatives_in_the_adaptation_reads_as_without_them():
    """`MiningConfig.adapt_hard_negatives` came later, an option that is off: old records read as without it."""
    assert MiningConfig.from_saved({}).adapt_hard_negatives is False is MiningConfig().adapt_hard_negatives
    assert "adapt_hard_negatives" not in MiningConfig.from_saved({}).fingerprint_dict()
    assert MiningConfig.from_dict({"adapt_hard_negatives": True}).adapt_hard_negatives is True


def test_a_mining_record_saved_before_the_adaptations_length_option_reads_as_128_word_pieces():
    """`MiningConfig.adapt_max_tokens` came later (an option; 128 as before): old records read as 128."""
    assert MiningConfig.from_saved({}).adapt_max_tokens == 128 == MiningConfig().adapt_max_tokens
    assert "adapt_max_tokens" not in MiningConfig.from_saved({}).fingerprint_dict()
    assert MiningConfig.from_dict({"adapt_max_tokens": 256}).fingerprint_dict()["adapt_max_tokens"] == 256
    for length in (4, 1024):
        with pytest.raises(InputError, match="adapt_max_tokens"):
            MiningConfig(adapt_max_tokens=length)
