"""Label-free training: a knowledge base of tickets and no labelled pairs in, a calibrated TicketModel out.

    1. the unsupervised parts, from the knowledge-base text: Punkt, vocabulary, word2vec, char vocabulary,
       DocNADE (`training._unsupervised_parts`, as labelled training builds them);
    2. pairs mined from the tickets (`mining.py`): a ticket's subject → its other fields, 4 negatives each (half
       hard), augmented variants (`augment.py`, synonyms from the word2vec neighbours), a held-out slice by ticket;
       labelled pairs and engineers' feedback, when there are some, are added to them (weighted);
    3. with the pretrained channel S, its encoder fine-tuned on the mined pairs, kept only when it ranks the
       held-out slice better (`mined_adaptation.py`);
    4. the Siamese LSTM trained on the mined pairs (`training.fit`: MSE plus an in-batch ranking loss, Adadelta,
       early stopping on the slice);
    5. channel and pair weights selected by rank on the held-out slice (`weight_selection.py`): each held-out query
       ranks every ticket's view, and each paraphrase query (its subject reworded) every full view (the view with its
       subject), and the simplest weights within one standard error of the best MRR@10 of the own ticket win;
    6. calibration (`Calibrator.fit_centered`) on pairs scored as serving scores them (`mined_calibration.py`): a
       held-out ticket's own subject query against the full ticket (YES 5), against random tickets (NO 1) and
       against a ticket it ranks between 5th and 20th (NO 1: what an unrelated best match scores; left out where
       those score more like the own tickets than like random ones, a knowledge base of large clusters, when S
       ranks; with 10 or more labelled YES pairs, where they score more like those pairs' tickets), plus any labels.

Pairs whose ticket side the mined training pairs never show (the view has no subject, so SUB1–SUB2; DESC1–…
without a description prefix) are left out of training (weight 0 meanwhile); SUB1–SUB2 is selected on the
paraphrase queries, and a pair no slice shows keeps the configuration's weight (`weight_selection.restored_pairs`).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..data.records import YES, Ticket
from ..data.store import Dataset
from ..lexical.bm25 import Bm25Scorer
from .adaptation import check_threads, keep_saved_encoder
from .augment import vocabulary_augmenter
from .bundle import TicketModel, _package_versions
from .calibration import Calibrator
from .encoder_base import encode_threads, memoised_sentence_vectors
from .grid_ranks import MRR_K
from .mined_adaptation import adapt_sentence_encoder
from .mined_calibration import (CALIBRATION_BAND, BandSamples, band_is_no, band_negatives, band_position,
                                prepared_calibration, yes_band_decision)
from .mining import MiningConfig, mine_pairs, require_minable
from .siamese import MERGED, TABLE2_PAIRS, ReplicatedSiameseLSTM, SiameseConfig
from .static_fit import fit_static_encoder, runs_static
from .template_lines import TemplateLines
from .training import (PairSet, PreparedPairs, _seed_everything, _unit_scale, _unsupervised_parts,
                       dataset_fingerprint, fit, lexical_features, pair_scores, random_negatives)
from .vocab import EOS, UNK_ID
from .weight_selection import (MIN_LABELLED_QUERIES, PASTED, observable_pairs, restored_pairs, select_on_held_out,
                               select_on_labelled, selecting_queries, set_weights_on_filled_fields)

#: The weight grid of label-free selection. The held-out slice holds hundreds of queries ranked against the
#: whole knowledge base (a labelled dev set has tens), so the grid can afford 0 for every channel, for the levels
#: the held-out queries show (SUB–SUB through the paraphrase queries, DESC–DESC, SUB–DESC, the merged texts) and a
#: wider BM25 range; which channels and levels serve is then the knowledge base's decision.
LABEL_FREE_GRID = {
    "h": [0.0, 0.1, 0.3, 0.7], "E": [0.0, 0.1, 0.3, 1.0], "T": [0.0, 0.1, 0.3], "S": [0.0, 0.3, 1.0, 3.0],
    "C": [0.0, 0.3, 1.0], "V": [0.0, 0.3, 1.0], "bm25": [0.0, 0.1, 0.3, 1.0, 3.0],
    "SUB|SUB": [0.0, 0.1, 0.3], "DESC|DESC": [0.0, 0.3, 0.4], "SUB|DESC": [0.0, 0.1, 0.2, 0.4], "SUB|SOL": [0.1, 0.2],
    "DESC|SOL": [0.1, 0.2], "ALL|ALL": [0.0, 0.3, 1.0],
}
#: Label-free pairs: Table 2's five, and the merged texts (query SUB+DESC against ticket SUB+DESC+SOL) as one more
#: level. A sentence encoder reads a whole ticket better than its fields apart, and a help desk's duplicates are
#: whole tickets; the held-out selection decides its weight (0 drops it).
LABEL_FREE_PAIRS = [list(p) for p in TABLE2_PAIRS] + [[MERGED, MERGED, 0.3]]
#: Weight of the in-batch ranking loss beside MSE (`training.in_batch_ranking_loss`). A mined pair says which of the
#: knowledge base's tickets a query belongs to, a ranking, not a 1–5 grade; with MSE alone on 1:4 pairs the LSTM
#: ranked the held-out slice at random (h alone: held-out MRR@10 0.004 on SeaMonkey, 0.010 on SemEval-2016).
#: Chosen on the mined held-out slices of both (see docs/internals.md), never on their labels.
RANK_LOSS = 1.0
#: Token updates of the knowledge base's word2vec in label-free training without S (`word2vec_updates`): ceil(updates /
#: tokens) epochs, 20 to 400 (`embeddings.word2vec_epochs`). A knowledge base is a corpus of 10^5 tokens: at 20 epochs
#: SumEMB of its vectors found a mined held-out query's own ticket at MRR@10 0.078 on SeaMonkey (100,000 tokens), at
#: 200 epochs 0.269 and at 400 0.300 (SemEval-2016 train-part2: 0.131 → 0.420 → 0.448;
#: `benchmarks/word2vec_epochs.py`). The default with S lost SemEval-2016 dev MAP with the budget of 20 M (79.63 →
#: 77.48), so with S word2vec keeps the config's epochs: docs/internals.md, "Learning without labels", step 1.
W2V_UPDATES = 40_000_000
#: The Siamese LSTM trains on the pairs of at most this many mined training queries (`lstm_training_pairs`), a seeded
#: sample when there are more: about 9 pairs per ticket over 4 epochs made it the one stage that kept growing with the
#: knowledge base (947 s of 31.5 min at 4,000 tickets; 514 s of 23.9 with the cap), where S's adaptation, the weight
#: selection and the calibration band were capped. 4,000 queries are mined from 2,200 to 2,400 tickets (augmented
#: subjects included): SeaMonkey's 1,076 and SemEval-2016's train-part2 train as before. Half of SeaMonkey's queries
#: moved its held-out selection by less than one standard error (docs/internals.md, "Learning without labels", 4).
MAX_LSTM_QUERIES = 4000


def lstm_training_pairs(pairs: PairSet, seed: int, cap: int | None = None) -> PairSet:
    """`pairs` whole when at most `cap` (default `MAX_LSTM_QUERIES`) queries hold them, else the pairs of a seeded
    sample of `cap` queries (each with its positive and negatives), for the Siamese LSTM's training."""
    cap = MAX_LSTM_QUERIES if cap is None else cap
    if len(pairs.queries) <= cap:
        return pairs
    rows = np.sort(np.random.default_rng([seed, cap]).choice(len(pairs.queries), cap, replace=False))
    return pairs.of_queries(rows)


def word2vec_updates(config: SiameseConfig) -> int:
    """Token updates of the knowledge base's word2vec in label-free training: `W2V_UPDATES` for a configuration
    without the sentence encoder S, 0 (the config's `w2v_epochs`) with it."""
    return 0 if "S" in config.active_channels else W2V_UPDATES


def label_free_config(pretrained: bool = True, **overrides) -> SiameseConfig:
    """The default configuration of label-free training: h, E, T (+ S with `pretrained`) and BM25 over Table 2's
    pairs and the merged texts (`LABEL_FREE_PAIRS`), weights selected on the mined held-out slice from
    `LABEL_FREE_GRID`, 4 epochs, MSE plus the in-batch ranking loss (`RANK_LOSS`)."""
    channels = {"h": 0.7, "E": 0.1, "T": 0.2}
    if pretrained:
        channels["S"] = 0.3
    data = dict(pairs=[list(p) for p in LABEL_FREE_PAIRS], channels=channels, bm25=0.3, weights="grid",
                grid={k: list(v) for k, v in LABEL_FREE_GRID.items()}, epochs=4, patience=2, rank_loss=RANK_LOSS)
    data.update(overrides)
    return SiameseConfig().replace(**data)


# ---------------------------------------------------------------------------------------------------------------
# reporting helpers
# ---------------------------------------------------------------------------------------------------------------
class _Stages:
    """Times each stage of training and tells the user (one line per stage)."""

    def __init__(self, echo: Callable[[str], None]):
        self.echo, self.seconds = echo, {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.time()
        yield
        self.seconds[name] = round(time.time() - started, 1)
        self.echo(f"[{self.seconds[name]:7.1f} s] {name}")


def oov_rate(model: TicketModel, tickets: Sequence[Ticket]) -> dict:
    """Share of the knowledge base's word occurrences without a word vector: outside the vocabulary (seen fewer
    than min_count times) or absent from the word vectors (a user's file); such words have only their char part."""
    vectors = model.net.embedder.words.weight.detach().numpy()
    has_vector = np.abs(vectors).sum(1) > 0
    total = missing = 0
    for t in tickets:
        comps = model.featurizer.ticket_tokens(model.model_input(t))
        for name, comp in comps.items():
            if name == MERGED and len(comps) > 1:  # the merged text repeats the other components' words
                continue
            for tok in comp:
                if tok == EOS:
                    continue
                total += 1
                i = model.vocab.index.get(tok, UNK_ID)
                missing += int(i == UNK_ID or not has_vector[i])
    return {"tokens": total, "without_vector": missing, "rate": missing / total if total else 0.0}


def _concat(a: PairSet, b: PairSet, repeat: int = 1) -> PairSet:
    """The pairs of `a` then those of `b` (each `repeat` times), queries and tickets concatenated."""
    q = np.concatenate([a.q] + [b.q + len(a.queries)] * repeat)
    t = np.concatenate([a.t] + [b.t + len(a.tickets)] * repeat)
    y = np.concatenate([a.y] + [b.y] * repeat)
    return PairSet(a.queries + b.queries, a.tickets + b.tickets, q, t, y)


# ---------------------------------------------------------------------------------------------------------------
# the recipe
# ---------------------------------------------------------------------------------------------------------------
@encode_threads()
@memoised_sentence_vectors()
def train_without_labels(tickets: Sequence[Ticket], config: SiameseConfig | None = None,
                         out_dir: str | Path | None = None, *, seed: int = 0, labelled: Dataset | None = None,
                         mining: MiningConfig | dict | None = None, word_vectors: str | Path | None = None,
                         progress: bool = True, echo: Callable[[str], None] | None = None,
                         channel_encoders: dict | None = None, threads: int = 1) -> TicketModel:
    """Train a calibrated TicketModel on the knowledge base `tickets` alone (plus `labelled` pairs, e.g. engineers'
    feedback, when given: added to the mined pairs `labelled_weight` times and to the calibration pairs, or with the
    mining option `select_on_labelled` and enough labelled queries, selecting the channel weights instead); save it
    to `out_dir` when given. `channel_encoders` computes the extra channels C / V the config weighs
    (`extra_channels.py`). The networks train on one torch thread, S's fine-tuning on `threads`
    (`adaptation.adapt`). Deterministic for a seed and `threads`. Raises InputError when the tickets cannot be
    mined."""
    started = time.time()
    echo = echo or (lambda line: tqdm.write(line) if progress else None)
    config = config or label_free_config()
    mining = mining if isinstance(mining, MiningConfig) else MiningConfig.from_dict(mining)
    torch.set_num_threads(1)
    check_threads(threads)
    _seed_everything(seed)
    tickets = list({t.id: t for t in tickets}.values())
    stages = _Stages(echo)
    labelled_pairs = trained_labels = None
    selecting, n_selecting = False, 0
    if labelled is not None and labelled.pairs:
        labelled_pairs = PairSet.from_dataset(labelled, "labelled")
        kb_ids = {t.id for t in tickets}
        tickets += [t for t in labelled.tickets if t.id not in kb_ids]
        n_selecting = len(selecting_queries(labelled_pairs, config.relevant_min))
        selecting = mining.select_on_labelled and config.weights == "grid" and n_selecting >= MIN_LABELLED_QUERIES
        # the labels either train (added to the mined pairs) or select the weights: never both, as a selection on
        # the pairs a channel learnt from favours that channel
        trained_labels = None if selecting else labelled_pairs
    require_minable(tickets, mining)  # fail before the slow stages

    with stages("word vectors, Punkt, vocabulary, DocNADE"):
        splitter, vocab, chars, vectors, w2v_source, topic_model, topic_vocab = _unsupervised_parts(
            config, tickets, list(labelled.queries) if trained_labels is not None else [], seed, word_vectors, progress,
            w2v_updates=word2vec_updates(config))
    _seed_everything(seed)
    net = ReplicatedSiameseLSTM(config, vectors, len(chars))
    meta = {"data_fingerprint": dataset_fingerprint(Dataset(tickets), labelled), "seed": seed,
            "word_vectors": w2v_source, "packages": _package_versions(), "kb_text": "the knowledge base's tickets"}
    if mining.template_share > 0:
        template = TemplateLines.learn(tickets, mining.template_share)
        if len(template):
            meta["template_lines"] = template.to_dict()
        echo(f"template lines: {len(template):,} lines recur in at least {100 * mining.template_share:g} % of the "
             "tickets that fill their field, beside other lines (" + ", ".join(
                 f"{name} {len(lines):,}" for name, lines in template.lines.items())
             + "); the learned channels leave them out, BM25 reads them")
    model = TicketModel(config, vocab, chars, splitter, net, None, topic_model, topic_vocab, meta,
                        channel_encoders=channel_encoders)
    oov = oov_rate(model, tickets)
    echo(f"out-of-vocabulary: {100 * oov['rate']:.1f} % of {oov['tokens']:,} word occurrences have no word vector "
         f"(seen < {config.min_count} times{' or not in ' + str(word_vectors) if word_vectors else ''}); "
         "their char-BiLSTM part still represents them")

    with stages("mining pairs"):
        augmenter = vocabulary_augmenter(vocab, vectors, seed)
        mined = mine_pairs(tickets, mining, seed, augmenter)
    s = mined.stats
    echo(f"mined {s['train_pairs']:,} training pairs ({s['train_queries']:,} queries from "
         f"{s['minable_tickets'] - s['held_out_tickets']:,} tickets, {s['augmented_queries']:,} of them augmented; "
         f"{len(augmenter.synonyms):,} words with induced synonyms) and {s['held_out_pairs']:,} held-out pairs "
         f"({s['held_out_tickets']:,} tickets); 1 positive : {mining.negatives} negatives "
         f"({int(round(mining.negatives * mining.hard_share))} hard)"
         + (f"; plus {len(trained_labels):,} labelled pairs ×{mining.labelled_weight}" if trained_labels else ""))
    if mining.select_on_labelled and labelled_pairs is not None:
        echo(f"{len(labelled_pairs):,} labelled pairs, {n_selecting:,} queries with a relevant and a non-relevant "
             "ticket: " + ("they select the channel weights and train nothing" if selecting else
                           "the configuration's weights are fixed (weights: grid selects them), added to the mined "
                           "pairs" if config.weights != "grid" else
                           f"too few to select the channel weights ({MIN_LABELLED_QUERIES} needed), added to the "
                           "mined pairs"))

    observable = observable_pairs(config, mined)
    adapted = None
    if "S" in config.active_channels and mining.adapt_pretrained:
        with stages("adapting the sentence encoder S to the knowledge base"):
            adapted = adapt_sentence_encoder(model, mined, mining, seed, progress, threads)
        echo(f"sentence encoder S: held-out MRR@{MRR_K} {adapted['base']:.3f} packaged, {adapted['adapted']:.3f} "
             f"adapted on {adapted['pairs']:,} mined pairs"
             + (f" ({adapted['hard_negatives']:,} with a hard negative)" if "hard_negatives" in adapted else "")
             + (f" on {threads} threads" if threads > 1 else "")
             + f": {'kept' if adapted['kept'] else 'not kept'}")
    static_fit = None
    if runs_static(model):
        with stages("fitting the static S vectors to the knowledge base"):
            static_fit = fit_static_encoder(model, tickets, seed, progress)
        if static_fit:
            echo(f"static S vectors fitted on {static_fit['texts']:,} texts of the knowledge base: held-out cosine "
                 f"distance to the transformer {static_fit['held_out_distance_mapped']:.3f} mapped, "
                 f"{static_fit['held_out_distance']:.3f} fitted ({static_fit['epochs']} epochs)")
    with stages("preparing texts (tokens, topics, sentence vectors)"):
        views = list(mined.views)
        train_pairs = lstm_training_pairs(PairSet(mined.train_queries, views, mined.train_q, mined.train_t,
                                                  mined.train_y), seed)
        lstm_queries = len(train_pairs.queries)
        held_pairs = PairSet(mined.held_out_queries, views, mined.held_out_q, mined.held_out_t, mined.held_out_y)
        view_scorer = Bm25Scorer(views)
        kb_scorer = Bm25Scorer(tickets)
        use_lexical = config.bm25 > 0
        train_lex = lexical_features(train_pairs, view_scorer) if use_lexical else None
        held_lex = lexical_features(held_pairs, view_scorer) if use_lexical else None
        if trained_labels is not None:
            train_pairs = _concat(train_pairs, trained_labels, mining.labelled_weight)
            if use_lexical:
                extra_lex = lexical_features(trained_labels, kb_scorer)
                train_lex = np.concatenate([train_lex] + [extra_lex] * mining.labelled_weight)
        tickets_prepared = model.prepare(train_pairs.tickets, "ticket", progress)
        train_data = PreparedPairs(train_pairs, model.prepare(train_pairs.queries, "query", progress),
                                   tickets_prepared, train_lex)
        held_data = PreparedPairs(held_pairs, model.prepare(held_pairs.queries, "query", progress),
                                  tickets_prepared, held_lex)

    spec = net.metric_spec()
    configured_pairs = [v for *_, v in spec["pairs"]]
    net.set_weights([v if obs else 0.0 for v, obs in zip(configured_pairs, observable)], spec["channels"], spec["bm25"])
    history: list[dict] = []
    sample = (f", on the pairs of a sample of {lstm_queries:,} of the {len(mined.train_queries):,} training queries"
              if lstm_queries < len(mined.train_queries) else "")
    with stages(f"training the Siamese LSTM (up to {config.epochs} epochs{sample})"):
        _unit_scale(model, train_data)
        model = fit(model, train_data, held_data, seed=seed, calibrate=False, progress=progress, history=history)
        net = model.net

    selection = None
    if config.weights == "grid":
        with stages("selecting channel and pair weights on the held-out slice"):
            selection, observable = select_on_held_out(model, mined, held_data, tickets_prepared,
                                                       view_scorer if use_lexical else None, observable, seed,
                                                       mining.held_out_pasted, progress)
        echo(f"held-out MRR@{MRR_K}: {selection['before']:.3f} with the configured weights, {selection['value']:.3f} "
             f"with the selected ones (the simplest within one standard error, {selection['stderr']:.3f}, of the best "
             f"grid point, {selection['best']:.3f}; "
             + ", ".join(f"{name} queries {v:.3f}" for name, v in selection["by_slice"].items())
             + "); each channel alone: " + ", ".join(f"{c} {v:.3f}" for c, v in selection["alone"].items()))
        if PASTED in selection:
            p = selection[PASTED]
            echo(f"held-out tickets pasted whole: MRR@{MRR_K} {p['value']:.3f} with the selected weights; "
                 f"{p['eligible']:,} of {p['combinations']:,} weightings were eligible (within one standard error, "
                 f"{p['stderr']:.3f}, of the best, {p['best']:.3f})")
    selected = net.metric_spec()
    restored = restored_pairs(selected, configured_pairs, observable)
    unfilled = ", ".join(set_weights_on_filled_fields(
        model, dict(selected, pairs=[[a, b, v] for (a, b, _), v in zip(selected["pairs"], restored)]), tickets))
    echo(f"metric weights: {_short(net.metric_spec())}"
         + (f"; weight 0 for the pairs against a field no ticket fills: {unfilled}" if unfilled else ""))
    lab_data = labelled_selection = None

    def prepared_labels() -> PreparedPairs:
        return PreparedPairs.of(model, labelled_pairs,
                                lexical_features(labelled_pairs, kb_scorer) if use_lexical else None, progress)

    if selecting:
        with stages("re-selecting the channel weights on the labelled queries"):
            lab_data = prepared_labels()
            labelled_selection = select_on_labelled(model, lab_data, config.relevant_min)
        echo(_labelled_selection_line(labelled_selection, net.metric_spec()))

    with stages("calibrating on serving-like pairs"):
        cal, cal_data = prepared_calibration(model, mined, tickets, augmenter, kb_scorer if use_lexical else None,
                                              seed, progress)
        if labelled_pairs is not None and lab_data is None:
            lab_data = prepared_labels()
        _unit_scale(model, cal_data)
        cal_g = pair_scores(model, cal_data)
        samples = BandSamples(model, tickets, progress)  # prepared once for the mined band and the labelled one
        band_g, band_y = band_negatives(model, cal_data, tickets, kb_scorer if use_lexical else None, seed, progress,
                                        samples)
        position = band_position(cal_g[cal.y == YES], cal_g[cal.y != YES], band_g)
        band = {"position": None if np.isnan(position) else round(position, 3),
                "as_no": band_is_no(position, model, mining.band_as_no),
                "by": "mined" if mining.band_as_no == "auto" else "option"}
        if labelled_pairs is not None:
            lab_g = pair_scores(model, lab_data)
            by_yes = _labelled_band_decision(model, mining, lab_data, lab_g, tickets,
                                             kb_scorer if use_lexical else None, seed, progress, samples)
            if by_yes is not None:
                band.update(as_no=by_yes["as_no"], by=by_yes["by"], labelled_position=by_yes["position"])
        g, y = (np.concatenate([cal_g, band_g]), np.concatenate([cal.y, band_y])) if band["as_no"] else (cal_g, cal.y)
        if labelled_pairs is not None:
            g, y = np.concatenate([g, lab_g]), np.concatenate([y, labelled_pairs.y])
        model.calibrator = Calibrator.fit_centered(g, y)
    calibrated = model.calibrate(cal_g)
    yes = cal.y == YES
    echo(f"calibrated: held-out own-subject queries score {np.median(calibrated[yes]):.2f} (median), random "
         f"tickets {np.median(calibrated[~yes]):.2f}, the tickets they rank {CALIBRATION_BAND[0]}th to "
         f"{CALIBRATION_BAND[1]}th {np.median(model.calibrate(band_g)):.2f} "
         f"({_band_decision(position, band, mining)})")

    model.meta["training"] = {
        "mode": "label-free", "mining": mined.stats, "lstm_queries": lstm_queries, "oov": oov, "history": history,
        "weight_selection": selection, "labelled_selection": labelled_selection,
        "observable_pairs": [f"{a}|{b}" for (a, b, _), o in zip(config.metric_pairs, observable) if o],
        "labelled_pairs": len(labelled_pairs) if labelled_pairs is not None else 0,
        "labelled_use": None if labelled_pairs is None else "weight selection" if selecting else "training",
        "calibration_pairs": int(len(y)),
        "calibration_band": band,
        "stage_seconds": stages.seconds, "sentence_encoder": adapted,
        "static_fit": static_fit,
        "wall_seconds": round(time.time() - started, 1), "trained_at": time.time()}
    model.invalidate()
    if out_dir is not None:
        model.save(out_dir)
        if (adapted and adapted["kept"]) or static_fit:
            keep_saved_encoder(model, out_dir)
    return model


def _labelled_selection_line(report: dict, spec: dict) -> str:
    """What the re-selection on labelled queries did, in one line of training's output."""
    return (f"channel weights re-selected on {report['queries']} labelled queries: rerank MAP {report['before']:.2f} "
            f"with the mined slice's weights, {report['value']:.2f} with the simplest within one standard error "
            f"({report['stderr']:.2f}) of the best ({report['best']:.2f}); metric weights: {_short(spec)}")


def _labelled_band_decision(model: TicketModel, mining: MiningConfig, lab_data: PreparedPairs, lab_g: np.ndarray,
                            tickets: Sequence[Ticket], kb_scorer: Bm25Scorer | None, seed: int,
                            progress: bool, samples: BandSamples) -> dict | None:
    """The band decision by the labelled pairs marked YES (`mined_calibration.yes_band_decision`, by "labelled
    YES"): engineers' feedback in the store and --train files are different tickets of their query's problem, as in
    `train --with-feedback`'s refit, so a retraining decides as the refit did. None where they do not decide."""
    return yes_band_decision(
        model, mining.band_as_no, lab_g[lab_data.pairs.y == YES],
        lambda: random_negatives(model, lab_data, tickets, kb_scorer, seed, progress)[0],
        lambda: band_negatives(model, lab_data, tickets, kb_scorer, seed, progress, samples)[0], "labelled YES")


def _band_decision(position: float, band: dict, mining: MiningConfig) -> str:
    """What training tells the user about the calibration band's tickets: where they score and whether they were NO
    (`band`: the decision training records)."""
    where = (f"their raw scores lie {position:.2f} of the way from random tickets' to the own tickets'"
             if np.isfinite(position) else "their place between random and own tickets is undefined")
    as_no = band["as_no"]
    if band["by"] == "labelled YES":
        placed = (f"{band['labelled_position']:.2f} of the way from random tickets to the labelled YES ones"
                  if band["labelled_position"] is not None else "undefined: the labelled YES tickets score no higher "
                  "than random ones")
        return (f"{'taken as NO' if as_no else 'not taken as NO'}, by the labelled YES pairs: for their queries the "
                f"band lies {placed}; {where}")
    if mining.band_as_no != "auto":
        return (f"{'taken' if as_no else 'not taken'} as NO, as the mining option band_as_no={mining.band_as_no} "
                f"says; {where}")
    if as_no:
        return (f"taken as NO: {where}; where problems recur and true matches score low, the mining option "
                "band_as_no=never leaves them out")
    return f"not taken as NO: {where}, mostly the same problem, as where tickets recur"


def _short(spec: dict) -> str:
    channels = ", ".join(f"{c} {v:g}" for c, v in spec["channels"].items())
    pairs = ", ".join(f"{a}-{b} {v:g}" for a, b, v in spec["pairs"])
    return f"(channels {channels}; BM25 {spec['bm25']:g}; pairs {pairs})"
