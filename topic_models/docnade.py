"""DocNADE (Larochelle & Lauly, 2012): a neural autoregressive topic model over token-id documents.

    h_i = sigmoid(c + sum_{k<i} W[:, v_k])          (H hidden units = topics)
    p(v_i = w | v_<i) = softmax(b + U h_i)_w         (full softmax, or a balanced binary-tree softmax)

The document's negative log-likelihood is exact: sum_i -log p(v_i | v_<i). The document vector T is
the hidden layer after the last word, sigmoid(c + sum_all W[:, v_k]).
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from tqdm.auto import tqdm

Documents = Sequence[Sequence[int]]

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.pt"
#: Positions scored at once by the full softmax; bounds the [positions, V] logits kept in memory.
_SOFTMAX_CHUNK = 2048
#: Words of a document `transform` reads when the model has no `max_doc_len` (a batch pads to its longest document,
#: so an uncut 10 MB text would need tens of GB).
MAX_TRANSFORM_WORDS = 1000


class TopicModelError(Exception):
    """A topic model input or artifact is unusable; the message says what to do (callers wrap it)."""


@dataclass
class DocNADEConfig:
    """Hyperparameters of a DocNADE model (stored as its config.json)."""

    vocab_size: int
    n_topics: int = 100
    softmax: str = "full"  # "full" or "tree" (balanced binary tree over word ids)
    max_doc_len: int | None = 300  # training documents are cut to this many tokens (None: no cap)

    def __post_init__(self) -> None:
        if self.vocab_size < 2:
            raise TopicModelError(f"vocab_size must be at least 2, got {self.vocab_size}")
        if self.n_topics < 1:
            raise TopicModelError(f"n_topics must be positive, got {self.n_topics}")
        if self.softmax not in ("full", "tree"):
            raise TopicModelError(f"softmax must be 'full' or 'tree', got {self.softmax!r}")
        if self.max_doc_len is not None and self.max_doc_len < 1:
            raise TopicModelError(f"max_doc_len must be positive or None, got {self.max_doc_len}")


def _balanced_tree_paths(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Paths of every word id through a balanced binary tree with `vocab_size` leaves.

    Returns (nodes [V, D] internal-node ids, signs [V, D] +1 = left / -1 = right, mask [V, D]) with
    D = ceil(log2 V); the tree has V - 1 internal nodes.
    """
    depth = max(1, math.ceil(math.log2(vocab_size)))
    nodes = np.zeros((vocab_size, depth), dtype=np.int64)
    signs = np.zeros((vocab_size, depth), dtype=np.float32)
    mask = np.zeros((vocab_size, depth), dtype=np.float32)
    next_node = 0
    # (lo, hi, path of (node, sign)) — split each id range in halves until one word is left.
    stack: list[tuple[int, int, list[tuple[int, float]]]] = [(0, vocab_size, [])]
    while stack:
        lo, hi, path = stack.pop()
        if hi - lo == 1:
            for d, (node, sign) in enumerate(path):
                nodes[lo, d], signs[lo, d], mask[lo, d] = node, sign, 1.0
            continue
        node, next_node = next_node, next_node + 1
        mid = (lo + hi + 1) // 2
        stack.append((lo, mid, path + [(node, 1.0)]))
        stack.append((mid, hi, path + [(node, -1.0)]))
    assert next_node == vocab_size - 1
    return torch.from_numpy(nodes), torch.from_numpy(signs), torch.from_numpy(mask)


def _pad(docs: Documents) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token-id documents into ids [B, L] and a float mask [B, L]."""
    length = max(1, max((len(d) for d in docs), default=1))
    ids = torch.zeros((len(docs), length), dtype=torch.long)
    mask = torch.zeros((len(docs), length), dtype=torch.float32)
    for row, doc in enumerate(docs):
        if len(doc):
            ids[row, : len(doc)] = torch.as_tensor(list(doc), dtype=torch.long)
            mask[row, : len(doc)] = 1.0
    return ids, mask


class DocNADE(nn.Module):
    """The DocNADE network; `fit` trains one, `load` reads one saved by `save`."""

    def __init__(self, config: DocNADEConfig):
        super().__init__()
        self.config = config
        V, H = config.vocab_size, config.n_topics
        self.W = nn.Embedding(V, H)  # row w = the column W[:, w] of the paper (word w's input weights)
        self.c = nn.Parameter(torch.zeros(H))
        n_out = V if config.softmax == "full" else V - 1  # softmax rows, or internal tree nodes
        self.U = nn.Parameter(torch.empty(n_out, H))
        self.b = nn.Parameter(torch.zeros(n_out))
        bound = math.sqrt(6.0 / (V + H))
        nn.init.uniform_(self.W.weight, -bound, bound)
        nn.init.uniform_(self.U, -bound, bound)
        if config.softmax == "tree":
            nodes, signs, mask = _balanced_tree_paths(V)
            self.register_buffer("path_nodes", nodes, persistent=False)
            self.register_buffer("path_signs", signs, persistent=False)
            self.register_buffer("path_mask", mask, persistent=False)

    # -- the model --------------------------------------------------------------------------------
    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """h_i for every position of padded ids [B, L] -> [B, L, H] (each from the words before i only)."""
        emb = self.W(ids)
        before = torch.cumsum(emb, dim=1) - emb  # exclusive prefix sum: sum_{k<i} W[:, v_k]
        return torch.sigmoid(self.c + before)

    def _word_log_probs(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(target | h) for flat hidden states h [N, H] and targets [N]."""
        if self.config.softmax == "tree":
            nodes = self.path_nodes[targets]  # [N, D]
            logits = torch.einsum("nh,ndh->nd", h, self.U[nodes]) + self.b[nodes]
            return (F.logsigmoid(self.path_signs[targets] * logits) * self.path_mask[targets]).sum(dim=1)
        parts = []
        for start in range(0, h.shape[0], _SOFTMAX_CHUNK):
            hc, tc = h[start : start + _SOFTMAX_CHUNK], targets[start : start + _SOFTMAX_CHUNK]
            parts.append(-F.cross_entropy(F.linear(hc, self.U, self.b), tc, reduction="none"))
        return torch.cat(parts) if parts else h.new_zeros(0)

    def nll(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Total exact negative log-likelihood (nats) of the padded batch ids [B, L] with mask [B, L]."""
        h = self.hidden_states(ids)
        keep = mask.bool()
        return -self._word_log_probs(h[keep], ids[keep]).sum()

    def position_log_probs(self, doc: Sequence[int]) -> np.ndarray:
        """log p(v_i = w | v_<i) for every position i of `doc` and every word w: float64 [len(doc), V]."""
        self._check_ids([doc])
        with torch.no_grad():
            ids, _ = _pad([doc])
            h = self.hidden_states(ids)[0, : len(doc)]
            if self.config.softmax == "full":
                out = F.log_softmax(F.linear(h, self.U, self.b), dim=1)
            else:
                V = self.config.vocab_size
                words = torch.arange(V).repeat(len(doc))
                out = self._word_log_probs(h.repeat_interleave(V, dim=0), words).view(len(doc), V)
        return out.double().numpy()

    def init_output_bias(self, docs: Documents) -> None:
        """Start the output biases at the (add-one smoothed) unigram distribution of `docs`.

        With h carrying no information yet, the model then already predicts word frequencies, and training
        spends its steps on topics instead of on learning the unigram (a standard NADE initialisation).
        """
        counts = np.ones(self.config.vocab_size, dtype=np.float64)
        for doc in docs:
            np.add.at(counts, np.asarray(doc, dtype=np.int64), 1.0)
        with torch.no_grad():
            if self.config.softmax == "full":
                self.b.copy_(torch.from_numpy(np.log(counts / counts.sum())))
                return
            # Tree: each internal node's bias = log(mass of its left subtree / mass of its right subtree).
            nodes, signs, mask = (t.numpy() for t in (self.path_nodes, self.path_signs, self.path_mask))
            left, right = np.zeros(self.config.vocab_size - 1), np.zeros(self.config.vocab_size - 1)
            weights = np.broadcast_to(counts[:, None], nodes.shape) * mask
            np.add.at(left, nodes[signs > 0], weights[signs > 0])
            np.add.at(right, nodes[signs < 0], weights[signs < 0])
            self.b.copy_(torch.from_numpy(np.log(left / right)))

    # -- public face ------------------------------------------------------------------------------
    @property
    def n_topics(self) -> int:
        return self.config.n_topics

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_doc_words(self) -> int:
        """The words of a document `transform` reads (its first ones): the training cut `max_doc_len`, so a
        document is read as the model learnt to read one, else MAX_TRANSFORM_WORDS."""
        return self.config.max_doc_len or MAX_TRANSFORM_WORDS

    def _check_ids(self, docs: Documents) -> None:
        V = self.config.vocab_size
        for n, doc in enumerate(docs):
            if len(doc) and (min(doc) < 0 or max(doc) >= V):
                raise TopicModelError(
                    f"document {n} has a token id outside 0..{V - 1}; map unknown words away before using the model"
                )

    def _batches(self, docs: Documents, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = sorted(range(len(docs)), key=lambda i: len(docs[i]))  # similar lengths pad less
        for start in range(0, len(order), batch_size):
            yield _pad([docs[i] for i in order[start : start + batch_size]])

    def total_nll(self, docs: Documents, batch_size: int = 32) -> tuple[float, int]:
        """(total NLL in nats, number of words) of `docs`, exact, full documents (no length cap)."""
        self._check_ids(docs)
        total, words = 0.0, 0
        was_training = self.training
        self.eval()
        with torch.no_grad():
            for ids, mask in self._batches(docs, batch_size):
                total += float(self.nll(ids, mask))
                words += int(mask.sum())
        self.train(was_training)
        return total, words

    def perplexity(self, docs: Documents, batch_size: int = 32) -> float:
        """exp(total NLL / total number of words) over `docs` (empty documents count nothing)."""
        total, words = self.total_nll(docs, batch_size)
        if words == 0:
            raise TopicModelError("cannot compute a perplexity over documents without any word")
        return math.exp(total / words)

    def transform(self, docs: Documents, batch_size: int = 256) -> np.ndarray:
        """Document vectors T: the hidden layer after the last word, sigmoid(c + sum_all W[:, v_k]) -> float32 [n, H].

        Each document is cut to its first `max_doc_words` words, which bounds the memory of a batch
        (batch_size x max_doc_words x H) whatever the input."""
        limit = self.max_doc_words
        docs = [doc if len(doc) <= limit else doc[:limit] for doc in docs]
        self._check_ids(docs)
        out = np.zeros((len(docs), self.config.n_topics), dtype=np.float32)
        with torch.no_grad():
            for start in range(0, len(docs), batch_size):
                ids, mask = _pad(docs[start : start + batch_size])
                summed = (self.W(ids) * mask.unsqueeze(-1)).sum(dim=1)
                out[start : start + len(ids)] = torch.sigmoid(self.c + summed).numpy()
        return out

    def top_words(self, k: int = 10) -> list[list[int]]:
        """The k word ids with the largest input weight W[j, w] for each hidden unit (topic) j.

        W[j, w] is how much seeing word w switches unit j on, so its largest entries are the words that
        define the topic (Larochelle & Lauly's and Gupta et al.'s Table 8 reading of DocNADE topics).
        """
        with torch.no_grad():
            weights = self.W.weight.t()  # [H, V]
            k = min(k, self.config.vocab_size)
            return torch.topk(weights, k, dim=1).indices.tolist()

    # -- persistence ------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        """Write config.json and weights.pt into `directory` (created when missing).

        The two files are written in place: a caller that needs them atomic writes into a directory that is
        renamed into place afterwards (TicketModel.save writes into `recommender.files.atomic_directory`).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {"format_version": FORMAT_VERSION, "model": "docnade", **asdict(self.config)}
        torch.save(self.state_dict(), directory / WEIGHTS_FILE)
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2), encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path) -> "DocNADE":
        """Read a model written by `save`; a missing or corrupt file raises TopicModelError naming it."""
        directory = Path(directory)
        cfg_path, w_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
        try:
            raw = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TopicModelError(f"cannot read the DocNADE config {cfg_path}: {exc}; retrain the topic model") from exc
        if not isinstance(raw, dict) or raw.get("model") != "docnade" or raw.get("format_version") != FORMAT_VERSION:
            raise TopicModelError(
                f"{cfg_path} is not a DocNADE config of format version {FORMAT_VERSION}; retrain the topic model"
            )
        try:
            config = DocNADEConfig(**{f.name: raw[f.name] for f in fields(DocNADEConfig) if f.name in raw})
        except TypeError as exc:
            raise TopicModelError(f"{cfg_path} is incomplete ({exc}); retrain the topic model") from exc
        model = cls(config)
        try:
            state = torch.load(w_path, map_location="cpu", weights_only=True)
            model.load_state_dict(state)
        except FileNotFoundError as exc:
            raise TopicModelError(f"the DocNADE weights {w_path} are missing; retrain the topic model") from exc
        except Exception as exc:  # torch raises several types for truncated or foreign files
            raise TopicModelError(f"the DocNADE weights {w_path} are corrupt ({type(exc).__name__}); retrain the topic model") from exc
        model.eval()
        return model


def fit(
    docs: Documents,
    vocab_size: int,
    n_topics: int = 100,
    epochs: int = 20,
    lr: float = 3e-3,
    batch_size: int = 16,
    seed: int = 0,
    dev_docs: Documents | None = None,
    progress: bool = True,
    softmax: str = "full",
    max_doc_len: int | None = 300,
    patience: int = 5,
) -> DocNADE:
    """Train DocNADE with Adam on the exact NLL; with `dev_docs`, stop early on dev perplexity and keep the best epoch.

    Training documents are cut to `max_doc_len` tokens; the same seed gives the same model.
    """
    config = DocNADEConfig(vocab_size=vocab_size, n_topics=n_topics, softmax=softmax, max_doc_len=max_doc_len)
    train = [list(d)[: max_doc_len] if max_doc_len else list(d) for d in docs]
    train = [d for d in train if d]
    if not train:
        raise TopicModelError("no training document has any word; give documents with at least one known token")
    torch.manual_seed(seed)
    model = DocNADE(config)
    model._check_ids(train)
    model.init_output_bias(train)
    if dev_docs is not None:
        model._check_ids(dev_docs)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    shuffler = random.Random(seed)
    n_words = sum(len(d) for d in train)
    best_ppl, best_state, bad_epochs = math.inf, None, 0
    for epoch in range(1, epochs + 1):
        model.train()
        # Shuffle, then sort within pools of batches by length: little padding, random batch order.
        order = list(range(len(train)))
        shuffler.shuffle(order)
        pool = batch_size * 20
        batches = []
        for p in range(0, len(order), pool):
            chunk = sorted(order[p : p + pool], key=lambda i: len(train[i]))
            batches += [chunk[s : s + batch_size] for s in range(0, len(chunk), batch_size)]
        shuffler.shuffle(batches)
        seen_nll, seen_words = 0.0, 0
        bar = tqdm(total=n_words, desc=f"DocNADE epoch {epoch}/{epochs}", unit="word", disable=not progress, leave=False)
        for batch in batches:
            ids, mask = _pad([train[i] for i in batch])
            n = int(mask.sum())
            loss = model.nll(ids, mask)
            optimiser.zero_grad()
            (loss / n).backward()
            optimiser.step()
            seen_nll += float(loss.detach())
            seen_words += n
            bar.update(n)
            bar.set_postfix(train_ppl=f"{math.exp(seen_nll / seen_words):.1f}", refresh=False)
        bar.close()
        if dev_docs is None:
            continue
        dev_ppl = model.perplexity(dev_docs)
        if progress:
            tqdm.write(f"DocNADE epoch {epoch}: train ppl {math.exp(seen_nll / seen_words):.1f}, dev ppl {dev_ppl:.1f}")
        if dev_ppl < best_ppl:
            best_ppl, bad_epochs = dev_ppl, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad_epochs += 1
            if bad_epochs >= patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return model


def load(directory: str | Path) -> DocNADE:
    """Read a DocNADE model saved with `DocNADE.save`."""
    return DocNADE.load(directory)
