"""Retrieval quality of an embedding model on pairs: each anchor queries a corpus of the pairs' positives (and hard
negatives) and should find its own positive. recall@k (its positive is among the k most similar texts) and MRR@k
(1 / rank of the positive, 0 beyond k), as sentence-transformers' InformationRetrievalEvaluator reports them.
"""

from __future__ import annotations

import numpy as np

from bertjax.embeddings.similarity import SIMILARITY_FUNCTIONS


def pair_corpus(positives: list[str], negatives: list[str] | None = None) -> tuple[list[str], np.ndarray]:
    """(corpus texts: the distinct positives then the distinct negatives, index of each pair's positive in it)."""
    index: dict[str, int] = {}
    for text in positives + (negatives or []):
        index.setdefault(text, len(index))
    return list(index), np.asarray([index[text] for text in positives], np.int64)


def retrieval_metrics(queries: np.ndarray, corpus: np.ndarray, gold: np.ndarray, k: int = 10,
                      similarity: str = "cosine", chunk: int = 1024) -> dict[str, float]:
    """{"recall@k", "mrr@k"} of queries [n, dim] against corpus [m, dim]; query i's answer is corpus row gold[i].

    The rank of the answer is 1 + the number of other corpus rows scored at least as high: a tie counts against
    it, so a model that maps texts to one vector (collapsed, or texts cut to the same tokens) scores as badly as it
    retrieves instead of perfectly (`pair_corpus` holds each text once, so a tie is two different texts). An answer
    whose score is not finite is not found."""
    if len(queries) != len(gold):
        raise ValueError(f"{len(queries)} queries but {len(gold)} answers")
    if len(corpus) == 0 or len(queries) == 0:
        raise ValueError("retrieval metrics need at least one query and one corpus text")
    score = SIMILARITY_FUNCTIONS[similarity]
    ranks = []
    for start in range(0, len(queries), chunk):
        scores = np.asarray(score(queries[start:start + chunk], corpus))
        answer = scores[np.arange(len(scores)), gold[start:start + chunk]]
        # NaN scores compare False: a NaN answer would rank first, so it gets no rank at all.
        rank = np.sum(scores >= answer[:, None], axis=1).astype(np.float64)
        ranks.append(np.where(np.isfinite(answer), np.maximum(rank, 1), np.inf))
    rank = np.concatenate(ranks)
    found = rank <= k
    return {f"recall@{k}": float(np.mean(found)), f"mrr@{k}": float(np.mean(np.where(found, 1.0 / rank, 0.0)))}
