"""The Replicated Siamese LSTM: shared weights, gradients into every channel, the multi-channel Manhattan metric."""
import math

import numpy as np
import pytest
import torch

from recommender.model.embeddings import CharVocabulary
from recommender.errors import InputError
from recommender.data.records import Query, Ticket
from recommender.model.siamese import (MERGED, Featurizer, ReplicatedSiameseLSTM, SiameseConfig, TABLE2_CHANNELS,
                                 TABLE2_PAIRS)
from recommender.model.sentences import SentenceSplitter
from recommender.model.vocab import EOS, Vocabulary

TEXTS = ["Turbine blade crack found", "Valve leak at the seal. Pressure drops fast.",
         "Oil filter clogged. Pump runs hot. Replace filter.", "Rotor vibration high after restart"]


def build(config: SiameseConfig, seed: int = 0):
    torch.manual_seed(seed)
    splitter = SentenceSplitter()
    featurizer = Featurizer(config, None, None, splitter)
    docs = [tok for text in TEXTS for tok in featurizer.raw_components(text, text, text).values()]
    vocab = Vocabulary.build(docs)
    chars = CharVocabulary.build(vocab.tokens)
    vectors = np.random.default_rng(seed).normal(size=(len(vocab), config.word_dim)).astype(np.float32)
    net = ReplicatedSiameseLSTM(config, vectors, len(chars))
    return net, Featurizer(config, vocab, chars, splitter)


def small(**changes) -> SiameseConfig:
    base = dict(word_dim=12, hidden=6, char_dim=4, char_hidden=5, dropout=0.0, channels={"h": 0.7, "E": 0.3})
    base.update(changes)
    return SiameseConfig(**base)


def extras_for(n, comps, channels, seed):
    rng = np.random.default_rng(seed)
    dims = {"T": 7, "S": 9}
    return {f"{c}.{ch}": rng.random((n, dims[ch])).astype(np.float32) for c in comps for ch in channels if ch in dims}


def test_one_lstm_per_component_kind_shared_by_both_sides():
    net, feat = build(small())
    assert sorted(net.lstms.keys()) == ["DESC", "SOL", "SUB"]  # three LSTMs, not one per side
    q = Query("Valve leak", "Valve leak at the seal. Pressure drops fast.")
    t = Ticket("t", "Valve leak", "Valve leak at the seal. Pressure drops fast.", "Replace the seal.")
    net.eval()
    qv = net.encode(feat.batch([feat.query_tokens(q)]))
    tv = net.encode(feat.batch([feat.ticket_tokens(t)]))
    # same LSTM objects on both sides: equal up to float summation order (the batches hold different word sets)
    assert torch.allclose(qv["SUB.h"], tv["SUB.h"], atol=1e-6) and torch.allclose(qv["DESC.h"], tv["DESC.h"], atol=1e-6)
    # changing the DESC LSTM's weights moves both sides' DESC vectors
    with torch.no_grad():
        net.lstms["DESC"].weight_ih_l0.add_(0.5)
    qv2 = net.encode(feat.batch([feat.query_tokens(q)]))
    tv2 = net.encode(feat.batch([feat.ticket_tokens(t)]))
    assert not torch.allclose(qv["DESC.h"], qv2["DESC.h"], atol=1e-3)
    assert torch.allclose(qv2["DESC.h"], tv2["DESC.h"], atol=1e-6)
    assert torch.allclose(qv["SUB.h"], qv2["SUB.h"], atol=1e-6)


def test_identical_texts_score_exactly_one_and_g_falls_with_distance():
    config = small(pairs=[["SUB", "SUB", 0.5], ["DESC", "DESC", 0.5]], channels={"h": 0.5, "E": 0.5, "T": 0.3, "S": 0.2})
    net, feat = build(config)
    net.eval()
    desc = "valve leak at the seal pressure drops fast after restart"
    words = desc.split()
    replaced = ["turbine", "blade", "crack", "rotor", "oil", "filter", "pump", "hot", "vibration", "found"]
    q = feat.batch([feat.query_tokens(Query("valve leak", desc))], extras_for(1, ["SUB", "DESC"], "TS", 0))
    g = []
    for k in (0, 2, 5, 10):
        changed = " ".join(replaced[:k] + words[k:])
        t = feat.batch([feat.ticket_tokens(Ticket("t", "valve leak", changed, ""))], extras_for(1, ["SUB", "DESC"], "TS", 0))
        g.append(float(net(q, t).detach()))
    assert g[0] == 1.0
    assert g[0] > g[1] > g[2] > g[3] > 0


def test_metric_matches_the_formula_with_bm25():
    config = small(channels={"h": 0.7, "E": 0.1, "T": 0.2}, bm25=0.4)
    net, _ = build(config)
    rng = np.random.default_rng(1)
    dims = {"h": 6, "E": 16, "T": 7}
    q = {f"{c}.{ch}": torch.tensor(rng.random((2, d)), dtype=torch.float32) for c in ("SUB", "DESC") for ch, d in dims.items()}
    t = {f"{c}.{ch}": torch.tensor(rng.random((2, d)), dtype=torch.float32)
         for c in ("SUB", "DESC", "SOL") for ch, d in dims.items()}
    ratio = torch.tensor([1.0, 0.25])
    got = net.similarity(q, t, ratio)
    for row in range(2):
        d = sum(v * sum(TABLE2_CHANNELS[ch] * float((q[f"{a}.{ch}"][row] - t[f"{b}.{ch}"][row]).abs().sum())
                        for ch in ("h", "E", "T")) for a, b, v in TABLE2_PAIRS)
        d += 0.4 * (1 - float(ratio[row]))
        assert float(got[row]) == pytest.approx(math.exp(-d), rel=1e-5)
    spec = net.metric_spec()
    assert spec["pairs"] == [[a, b, pytest.approx(v)] for a, b, v in TABLE2_PAIRS]
    assert spec["channels"] == {k: pytest.approx(v) for k, v in TABLE2_CHANNELS.items()}
    assert spec["bm25"] == pytest.approx(0.4)


def test_gradient_flows_into_every_channel_both_lstm_kinds_and_the_char_bilstm():
    config = small(channels={"h": 0.5, "E": 0.3, "T": 0.2, "S": 0.2}, weights="learn", bm25=0.1)
    net, feat = build(config)
    net.train()
    queries = [feat.query_tokens(Query(TEXTS[i], TEXTS[i + 1])) for i in range(2)]
    tickets = [feat.ticket_tokens(Ticket(str(i), TEXTS[i + 2], TEXTS[i], TEXTS[i + 1])) for i in range(2)]
    g = net(feat.batch(queries, extras_for(2, ["SUB", "DESC"], "TS", 0)),
            feat.batch(tickets, extras_for(2, ["SUB", "DESC", "SOL"], "TS", 1)), torch.tensor([1.0, 0.5]))
    torch.mean((g - torch.tensor([1.0, 0.0])) ** 2).backward()
    assert net.channel_names == ["h", "E", "T", "S"]
    assert (net.log_channel.grad.abs() > 0).all()  # every channel's weight gets gradient
    assert (net.log_pair.grad.abs() > 0).all()
    assert net.log_bm25.grad.abs() > 0
    for kind in ("SUB", "DESC", "SOL"):
        assert net.lstms[kind].weight_ih_l0.grad.abs().sum() > 0
    assert net.embedder.chars.lstm.weight_ih_l0.grad.abs().sum() > 0
    assert net.embedder.chars.lstm.weight_ih_l0_reverse.grad.abs().sum() > 0
    assert net.embedder.words.weight.grad is None  # word2vec frozen by default


def test_fixed_weights_do_not_learn():
    net, _ = build(small())
    assert not net.log_channel.requires_grad and not net.log_pair.requires_grad
    assert all(p.requires_grad for p in net.network_parameters())


def test_featurizer_marks_sentence_boundaries_and_cuts_to_max_len():
    config = small(max_len={"SUB": 2, "DESC": 5, "SOL": 100, MERGED: 200})
    _, feat = build(config)
    tokens = feat.ticket_tokens(Ticket("t", "valve leak at seal", "Valve leaks. Seal is worn.", "Replace seal."))
    assert tokens["DESC"] == ["valve", "leaks", EOS, "seal", "is", "worn"]
    batch = feat.batch([tokens])
    assert batch.components["SUB"].lengths.tolist() == [2] and batch.components["DESC"].lengths.tolist() == [5]
    assert batch.components["DESC"].mask.tolist() == [[1.0, 1.0, 0.0, 1.0, 1.0]]  # <eos> is not a word for E


def test_merged_mode_uses_one_component_per_side():
    config = SiameseConfig.preset("slstm_merged", word_dim=12, hidden=6, char_dim=4, char_hidden=5)
    net, feat = build(config)
    assert list(net.lstms.keys()) == [MERGED] and net.pairs == [(MERGED, MERGED)]
    q = feat.query_tokens(Query("valve leak", "Seal worn."))
    t = feat.ticket_tokens(Ticket("t", "valve leak", "Seal worn.", "Replace seal."))
    assert q == {MERGED: ["valve", "leak", EOS, "seal", "worn"]}
    assert t[MERGED][-3:] == [EOS, "replace", "seal"]


def test_a_merged_pair_beside_the_component_pairs_adds_the_merged_texts_as_one_more_level():
    config = small(pairs=[["SUB", "SUB", 0.3], ["DESC", "DESC", 0.3], [MERGED, MERGED, 0.3]])
    net, feat = build(config)
    assert set(net.lstms.keys()) == {"SUB", "DESC", MERGED}
    q = feat.query_tokens(Query("valve leak", "Seal worn."))
    t = feat.ticket_tokens(Ticket("t", "valve leak", "Seal worn.", "Replace seal."))
    assert q == {"SUB": ["valve", "leak"], "DESC": ["seal", "worn"], MERGED: ["valve", "leak", EOS, "seal", "worn"]}
    assert t[MERGED] == ["valve", "leak", EOS, "seal", "worn", EOS, "replace", "seal"] and "SOL" not in t
    net.eval()
    with torch.no_grad():
        qv, tv = net.encode(feat.batch([q])), net.encode(feat.batch([t]))
        d = net.distances(qv, tv)  # [1, pairs, channels]: the merged pair's own distances
    assert d.shape == (1, 3, 2)
    assert torch.allclose(d[0, 2, 1], (qv[f"{MERGED}.E"] - tv[f"{MERGED}.E"]).abs().sum())


def test_every_preset_builds_and_the_config_roundtrips_through_json():
    for name in SiameseConfig.PRESETS:
        config = SiameseConfig.preset(name, word_dim=12, hidden=6, char_dim=4, char_hidden=5)
        assert SiameseConfig.from_dict(config.to_dict()) == config
        net, _ = build(config)
        assert set(net.metric_spec()["channels"]) == set(config.active_channels)
    assert SiameseConfig.preset("ml_cl_hET").channels == TABLE2_CHANNELS


@pytest.mark.parametrize("changes, message", [
    ({"colour": 1}, "unknown config key"),
    ({"channels": {"X": 1.0}}, "unknown channel"),
    ({"channels": {"h": 0.0}, "bm25": 0.0}, "positive weight"),
    ({"pairs": [["SOL", "SUB", 0.1]]}, "bad pair"),
    ({"pairs": [[MERGED, "SUB", 0.1]]}, "bad pair"),
    ({"e_norm": "max"}, "e_norm"),
    ({"e_unknown": "drop"}, "e_unknown"),
    ({"weights": "magic"}, "fixed, grid or learn"),
])
def test_bad_configs_say_what_to_fix(changes, message):
    with pytest.raises(InputError, match=message):
        SiameseConfig().replace(**changes)
    with pytest.raises(InputError, match="unknown preset"):
        SiameseConfig.preset("best")


def test_e_skip_leaves_unknown_words_out_of_sumemb_and_chars_keeps_their_char_half():
    """With e_unknown="skip" E is SumEMB of the known words alone (a text of unknown words only: the zero vector),
    with "chars" an unknown word adds its vector (in a trained model the char-BiLSTM half alone: `align_vectors`
    gives `<unk>` zeros); h reads the unknown words either way."""
    known, mixed, unknown = (Query("Valve leak seal", ""), Query("Valve leak seal zyxwv qqqqq", ""),
                             Query("zyxwv qqqqq", ""))
    vectors = {}
    for mode in ("chars", "skip"):
        net, feat = build(small(e_unknown=mode))
        net.eval()
        with torch.no_grad():
            vectors[mode] = [net.encode(feat.batch([feat.query_tokens(q)])) for q in (known, mixed, unknown)]
    skip, chars = vectors["skip"], vectors["chars"]
    assert torch.allclose(skip[1]["SUB.E"], skip[0]["SUB.E"], atol=1e-6)
    assert torch.count_nonzero(skip[2]["SUB.E"]) == 0
    assert not torch.allclose(chars[1]["SUB.E"], chars[0]["SUB.E"], atol=1e-3)
    assert torch.count_nonzero(chars[2]["SUB.E"]) > 0
    assert torch.allclose(skip[1]["SUB.h"], chars[1]["SUB.h"]) and torch.allclose(skip[0]["SUB.E"], chars[0]["SUB.E"])


def test_inference_lstm_equals_the_packed_nn_lstm():
    """`lstm_last_state` (eval mode) computes what the packed nn.LSTM (training mode) computes."""
    from torch.nn.utils.rnn import pack_padded_sequence

    from recommender.model.siamese import lstm_last_state

    torch.manual_seed(3)
    lstm = torch.nn.LSTM(7, 5, batch_first=True)
    words = torch.randn(30, 7)
    words[0] = 0.0  # padding word
    lengths = torch.tensor([4, 1, 9, 9, 2, 6, 1, 3])
    index = torch.randint(1, 30, (len(lengths), 9))
    index[torch.arange(9) >= lengths[:, None]] = 0
    with torch.no_grad():
        fast = lstm_last_state(lstm, words, index, lengths)
        packed = pack_padded_sequence(words[index], lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = lstm(packed)
    assert fast.shape == (8, 5)
    assert torch.allclose(fast, h_n[-1], atol=1e-6)


def test_eval_encoding_equals_the_training_graph_without_dropout():
    net, featurizer = build(small(channels={"h": 0.7, "E": 0.3}))
    batch = featurizer.batch([featurizer.ticket_tokens(Ticket(f"t{i}", t, t + " " + t, t))
                              for i, t in enumerate(TEXTS)])
    net.train()  # dropout is 0.0: the training graph computes the same function
    trained = {k: v.detach() for k, v in net.encode(batch).items()}
    net.eval()
    with torch.no_grad():
        inferred = net.encode(batch)
    differentiable = net.encode(batch)  # eval mode with gradients on: the autograd-safe path
    assert differentiable["DESC.h"].requires_grad
    assert trained.keys() == inferred.keys()
    for key in trained:
        assert torch.allclose(trained[key], inferred[key], atol=1e-5), key
