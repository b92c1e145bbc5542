"""Exact top-k search over an embedding matrix, jitted and chunked over the corpus so memory stays bounded.

    scores, indices = top_k_search(query_vectors, corpus, k=10)          # float32 / int64 [queries, k]
    corpus = np.load("corpus.npy", mmap_mode="r")                         # read chunk by chunk, never all at once

The corpus streams through the device in chunks of `chunk_size` rows (the last one padded, so one program serves
every chunk); each chunk's scores are reduced to its top k at once and merged into the running top k, so memory is
O(queries * (chunk_size + k)) whatever the corpus size. Scores are cosine similarities (rows normalised on the
fly) or dot products, in float32 at full matmul precision. Results are best first; numpy's argsort of the full
score matrix gives the same indices (tests/test_inference.py). Rows holding NaN or infinities are never returned.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.embeddings.similarity import unit_rows

SEARCH_SIMILARITIES = ("cosine", "dot")
DEFAULT_CHUNK_SIZE = 32768


@functools.partial(jax.jit, static_argnames=("k", "similarity"))
def _chunk_top_k(queries, chunk, valid, offset, best_scores, best_indices, *, k: int, similarity: str):
    """Merge the top k of one corpus chunk into the running (best_scores, best_indices) [queries, k]; `valid`
    [chunk rows] marks the rows that may be returned (not padding, every value finite)."""
    chunk = jnp.asarray(chunk, jnp.float32)
    if similarity == "cosine":
        chunk = unit_rows(chunk)
    scores = jnp.matmul(queries, chunk.T, precision=jax.lax.Precision.HIGHEST)  # [queries, chunk]
    # A valid row always beats the -inf of padding and of the initial "no row yet" entries, even where a dot
    # product overflows to -inf or NaN, so the first k' results are valid rows.
    lowest = jnp.finfo(jnp.float32).min
    scores = jnp.where(jnp.isnan(scores), lowest, jnp.maximum(scores, lowest))
    scores = jnp.where(valid[None, :], scores, -jnp.inf)
    top_scores, top = jax.lax.top_k(scores, min(k, chunk.shape[0]))
    # Earlier chunks first on equal scores: the running best comes first in the concatenation.
    scores = jnp.concatenate([best_scores, top_scores], axis=1)
    indices = jnp.concatenate([best_indices, (top + offset).astype(best_indices.dtype)], axis=1)
    merged, where = jax.lax.top_k(scores, k)
    return merged, jnp.take_along_axis(indices, where, axis=1)


def top_k_search(queries, corpus, k: int = 10, *, similarity: str = "cosine",
                 chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32 [q, k'], indices int64 [q, k']) of the k' = min(k, usable rows) best corpus rows per query.

    queries: [q, dim] or [dim]; corpus: [n, dim] array-like (a memory-mapped .npy is read one chunk at a time).
    A corpus row holding NaN or an infinity has no meaningful score: it is never returned (k' counts only the
    other rows) and a RuntimeWarning says how many there are.
    """
    if similarity not in SEARCH_SIMILARITIES:
        raise ValueError(f"similarity must be one of {SEARCH_SIMILARITIES}, got {similarity!r}")
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    queries = np.asarray(queries, np.float32)
    if queries.ndim == 1:
        queries = queries[None]
    if not hasattr(corpus, "shape") or not hasattr(corpus, "ndim"):
        corpus = np.asarray(corpus, np.float32)  # lists of rows; arrays (memory-mapped ones too) are sliced as they are
    if corpus.ndim != 2 or queries.ndim != 2:
        raise ValueError(f"expected a [rows, dim] corpus and [queries, dim] queries, got shapes "
                         f"{tuple(corpus.shape)} and {tuple(queries.shape)}")
    rows, dim = corpus.shape
    if rows == 0:
        raise ValueError("the corpus holds no embeddings (0 rows); embed a non-empty input first")
    if queries.shape[1] != dim:
        raise ValueError(f"dimension mismatch: the queries have {queries.shape[1]} dimensions, the corpus "
                         f"{dim}; the corpus was embedded by another model (or with another truncate_dim)")
    if not np.isfinite(queries).all():
        raise ValueError("a query embedding holds NaN or infinite values")
    k = min(int(k), rows)
    # The program computes a power of two of results (the first k of them are the top k: one order, score then
    # index): a service passing each request's k compiles a few programs, not one per value, as fill-mask does.
    k_run = min(1 << (k - 1).bit_length(), rows)
    chunk_rows = min(chunk_size, 1 << (rows - 1).bit_length())  # small corpora: one chunk of a power of two
    # Queries padded with zero rows to a power of two, as the corpus chunks are: a service searching with each
    # request's number of queries compiles a few programs, not a set per count. The padding rows are dropped below.
    count = queries.shape[0]
    queries = np.concatenate([queries, np.zeros(((1 << (count - 1).bit_length()) - count, dim), np.float32)])
    query_array = unit_rows(queries) if similarity == "cosine" else jnp.asarray(queries)
    best_scores = jnp.full((queries.shape[0], k_run), -jnp.inf, jnp.float32)
    best_indices = jnp.full((queries.shape[0], k_run), -1, jnp.int32 if rows < 2**31 else jnp.int64)
    unusable = 0
    for start in range(0, rows, chunk_rows):
        chunk = np.asarray(corpus[start:start + chunk_rows], np.float32)
        # A fresh buffer per chunk: on CPU the device may alias a host array still being computed on.
        buffer = np.zeros((chunk_rows, dim), np.float32)
        buffer[:len(chunk)] = chunk
        valid = np.zeros(chunk_rows, bool)
        valid[:len(chunk)] = np.isfinite(chunk).all(axis=1)
        unusable += len(chunk) - int(valid.sum())
        best_scores, best_indices = _chunk_top_k(query_array, buffer, valid, start, best_scores, best_indices,
                                                 k=k_run, similarity=similarity)
    if unusable == rows:
        raise ValueError(f"every corpus row ({rows}) holds NaN or infinite values; nothing to search")
    if unusable:
        warnings.warn(f"{unusable} of {rows} corpus rows hold NaN or infinite values and are never returned "
                      "(re-embed those texts)", RuntimeWarning, stacklevel=2)
    found = min(k, rows - unusable)  # the entries past the usable rows are the -inf / -1 of "no row"
    return np.asarray(best_scores)[:count, :found], np.asarray(best_indices)[:count, :found].astype(np.int64)
