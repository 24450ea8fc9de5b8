"""The character-trigram matcher: the baseline of the character-level Siamese network (Neculoiu et al. 2016).

TF-IDF over the character 3-grams inside word boundaries (scikit-learn `TfidfVectorizer(analyzer="char_wb",
ngram_range=(3, 3))`: each word padded with a space, lower-cased, IDF smoothed, rows L2-normalised), and the cosine
of a query's vector to each text's. A typo changes only the trigrams around it, so a misspelt subject still shares
most of its trigrams with the original; word order does not matter at all.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import InputError


class TrigramMatcher:
    """Cosine of character-trigram TF-IDF vectors, IDF over the `texts` it holds (row i = texts[i])."""

    def __init__(self, texts: Sequence[str]):
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 3), lowercase=True, dtype=np.float32)
        try:
            self.matrix = self.vectorizer.fit_transform(list(texts)).tocsr()
        except ValueError as exc:  # scikit-learn: "empty vocabulary"
            raise InputError(f"the trigram matcher found no character trigram in {len(texts)} texts ({exc}); give "
                             "texts with at least one word of 2 or more characters") from exc

    def __len__(self) -> int:
        return self.matrix.shape[0]

    def transform(self, texts: Sequence[str]):
        """Unit TF-IDF vectors of `texts` (IDF of the held texts; trigrams they lack are ignored): a scipy CSR
        matrix [len(texts), trigrams], float32."""
        return self.vectorizer.transform(list(texts))

    @staticmethod
    def cosine(query_vecs, text_vecs) -> np.ndarray:
        """Cosine of one query (a 1-row matrix of `transform`) to every row of `text_vecs`, float32 [n]."""
        return np.asarray((text_vecs @ query_vecs.T).toarray(), dtype=np.float32).ravel()

    def scores(self, text: str) -> np.ndarray:
        """Cosine of `text` to every held text, float32 [n] (0 where no trigram is shared)."""
        return self.cosine(self.transform([text]), self.matrix)

    def top_k(self, text: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best rows (any score, ties: lower row first) and their cosines, best first."""
        scores = self.scores(text)
        rows = np.lexsort((np.arange(len(scores)), -scores))[: max(k, 0)]
        return rows, scores[rows]
