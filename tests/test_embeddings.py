"""Vocabulary, word2vec (trained and loaded), the char-BiLSTM and the SumEMB channel E."""
import math

import numpy as np
import pytest
import torch

from recommender.model.embeddings import (CharBiLSTM, CharVocabulary, WordBatch, WordEmbedder, align_vectors,
                                    load_word2vec, sum_emb, train_word2vec, word2vec_epochs)
from recommender.errors import InputError, ModelError
from recommender.model.vocab import EOS_ID, PAD_ID, UNK_ID, Vocabulary

DOCS = [["turbine", "blade", "the", "crack"], ["valve", "leak", "the"], ["turbine", "rotor"], ["turbine"]]


def test_vocabulary_ids_counts_idf_and_json_roundtrip(tmp_path):
    vocab = Vocabulary.build(DOCS, min_count=1)
    assert vocab.tokens[:3] == ["<pad>", "<unk>", "<eos>"] and (PAD_ID, UNK_ID, EOS_ID) == (0, 1, 2)
    assert vocab.tokens[3] == "turbine"  # most frequent first
    assert vocab.ids(["turbine", "never-seen"]) == [3, UNK_ID]
    assert vocab.doc_freq[vocab.id("turbine")] == 3 and vocab.n_docs == 4
    assert vocab.idf_of("turbine") == pytest.approx(math.log(5 / 4) + 1)
    assert vocab.idf_of("the") == 0.0  # stop word
    assert vocab.idf_of("never-seen") == pytest.approx(math.log(5 / 1) + 1)  # unseen: the largest IDF
    assert Vocabulary.build(DOCS, min_count=2).tokens == ["<pad>", "<unk>", "<eos>", "turbine", "the"]
    vocab.save(tmp_path / "v.json")
    again = Vocabulary.load(tmp_path / "v.json")
    assert again.tokens == vocab.tokens and np.array_equal(again.idf(), vocab.idf())


def test_vocabulary_load_of_a_corrupt_file_names_it(tmp_path):
    bad = tmp_path / "vocab.json"
    bad.write_text("{not json")
    with pytest.raises(ModelError, match="vocab.json"):
        Vocabulary.load(bad)


def test_word2vec_is_deterministic_for_a_seed_and_aligns_to_the_vocabulary():
    sentences = DOCS * 20
    a = train_word2vec(sentences, dim=8, seed=3, epochs=2)
    b = train_word2vec(sentences, dim=8, seed=3, epochs=2)
    c = train_word2vec(sentences, dim=8, seed=4, epochs=2)
    assert np.array_equal(a["turbine"], b["turbine"])
    assert not np.array_equal(a["turbine"], c["turbine"])
    vocab = Vocabulary.build(DOCS + [["only-in-vocab"]])
    table = align_vectors(a, vocab, 8)
    assert table.shape == (len(vocab), 8) and table.dtype == np.float32
    assert np.array_equal(table[vocab.id("turbine")], a["turbine"])
    assert not table[[PAD_ID, UNK_ID, EOS_ID, vocab.id("only-in-vocab")]].any()  # missing words: zeros
    with pytest.raises(InputError, match="dimensions"):
        align_vectors(a, vocab, 16)


def test_word2vec_epochs_follow_the_token_budget_within_their_bounds():
    assert word2vec_epochs(100_000, 20) == 20  # no budget: the fixed count
    assert word2vec_epochs(156_259, 20, updates=40_000_000) == 256  # ceil(40M / tokens)
    assert word2vec_epochs(99_866, 20, updates=40_000_000) == 400  # 401, capped at max_epochs
    assert word2vec_epochs(99_866, 20, updates=40_000_000, max_epochs=200) == 200
    assert word2vec_epochs(10_000_000, 20, updates=40_000_000) == 20  # a large corpus keeps the minimum
    assert word2vec_epochs(1_000, 30, updates=20_000_000, max_epochs=10) == 30  # the minimum wins over the cap
    assert word2vec_epochs(0, 20, updates=20_000_000) == 20


def test_load_word2vec_reads_text_and_binary_and_rejects_junk(tmp_path):
    kv = train_word2vec(DOCS * 5, dim=4, seed=0, epochs=1)
    kv.save_word2vec_format(str(tmp_path / "v.txt"), binary=False)
    kv.save_word2vec_format(str(tmp_path / "v.bin"), binary=True)
    for name in ("v.txt", "v.bin"):
        loaded = load_word2vec(tmp_path / name)
        assert np.allclose(loaded["turbine"], kv["turbine"], atol=1e-5)
    (tmp_path / "junk.txt").write_text("this is not a vector file\n")
    with pytest.raises(InputError, match="junk.txt"):
        load_word2vec(tmp_path / "junk.txt")
    with pytest.raises(InputError, match="does not exist"):
        load_word2vec(tmp_path / "missing.txt")


def test_char_bilstm_gives_every_word_a_50d_vector_and_padding_zeros():
    torch.manual_seed(0)
    vocab = Vocabulary.build(DOCS)
    chars = CharVocabulary.build(vocab.tokens)
    net = CharBiLSTM(len(chars), char_dim=8, hidden=25)
    batch = WordBatch.build(["", "turbine", "turbines", "zzq"], vocab, chars)  # OOV words included
    out = net(batch.char_ids, batch.char_lengths)
    assert out.shape == (4, 50)
    assert not out[0].any()
    assert out[1:].abs().sum(1).min() > 0
    assert not torch.allclose(out[1], out[2])
    assert batch.vocab_ids.tolist() == [PAD_ID, vocab.id("turbine"), UNK_ID, UNK_ID]


def test_word_embedder_cache_gives_the_same_vectors_as_the_char_bilstm():
    torch.manual_seed(0)
    vocab = Vocabulary.build(DOCS)
    chars = CharVocabulary.build(vocab.tokens)
    emb = WordEmbedder(np.random.default_rng(0).normal(size=(len(vocab), 6)).astype(np.float32), len(chars), 8, 25)
    assert emb.dim == 56
    batch = WordBatch.build(["", "turbine", "unseen-word", "rotor"], vocab, chars)
    emb.eval()
    uncached = emb(batch)
    emb.cache_chars(vocab, chars)
    cached = emb(batch)
    assert torch.allclose(uncached, cached, atol=1e-6)
    assert cached[2, 6:].abs().sum() > 0  # an OOV word still gets a char vector
    emb.train()
    assert emb._char_cache is None


def test_sum_emb_normalisations():
    words = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [5.0, 5.0]])  # distinct words; row 0 pads
    idf = torch.tensor([0.0, 3.0, 1.0, 9.0])
    index = torch.tensor([[1, 2, 0], [2, 2, 3]])  # text 1: two words + padding; text 2: a word twice, one masked
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    assert torch.allclose(sum_emb(words, index, mask, idf, "sum"), torch.tensor([[1.0, 2.0], [0.0, 4.0]]))
    assert torch.allclose(sum_emb(words, index, mask, idf, "mean"), torch.tensor([[0.5, 1.0], [0.0, 2.0]]))
    weighted = torch.tensor([3.0, 2.0]) / 4
    e = sum_emb(words, index, mask, idf, "idf_l2")
    assert torch.allclose(e[0], weighted / weighted.norm())
    assert torch.allclose(e[1], torch.tensor([0.0, 1.0]))
    assert e.norm(dim=1).tolist() == pytest.approx([1.0, 1.0])
    # the same as gathering every position's vector and summing (the textbook definition)
    w = mask * idf[index]
    textbook = (words[index] * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True)
    assert torch.allclose(e, textbook / textbook.norm(dim=1, keepdim=True), atol=1e-6)
    with pytest.raises(ValueError, match="idf_l2"):
        sum_emb(words, index, mask, idf, "max")
