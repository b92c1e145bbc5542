"""Contrastive training of embedding models: the in-batch-negatives loss, its version over a device mesh, and
cached (GradCache) large batches.

    loss = multiple_negatives_ranking_loss(anchors, positives, negatives, scale=20.0, symmetric=False)

MultipleNegativesRankingLoss (sentence-transformers; van den Oord et al.'s InfoNCE with in-batch negatives): anchor
i is scored against every positive of the batch and every hard negative, `scale * cosine`, and the loss is the
cross-entropy of picking its own positive, averaged over the anchors. `symmetric` adds the other direction,
positive i against every anchor (MultipleNegativesSymmetricRankingLoss), and averages the two.

Over a mesh, `mesh_ranking_loss` computes the same number from the rows each device holds: every device
all-gathers the positives (and negatives, and for the symmetric loss the anchors) across the batch axes, scores its
own anchors against all of them, and the per-device sums are added (psum). Every anchor thus sees the negatives of
the whole global batch, as on one device, while the [batch, batch] score matrix is split by rows across devices.
The gradient of the all-gather is a reduce-scatter, so each device gets the gradient of its own rows.

`cached_loss_and_grads` is GradCache (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup"): the loss couples every row of the batch, so plain gradient accumulation cannot split it. Instead
(1) embed the batch chunk by chunk without keeping activations, (2) compute the loss and its gradient with respect
to the embeddings (small: [batch, dim]), (3) run each chunk again with a vector-Jacobian product against its slice
of that gradient, summing parameter gradients. Activation memory is then that of one chunk, whatever the batch;
dropout keys are folded from the chunk index, so the second forward pass draws the masks of the first. Without
dropout the gradient is the uncached one; with dropout it is equal in distribution, but each chunking (and the
uncached pass, which uses the step key itself) draws other masks.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from bertjax.embeddings.similarity import unit_rows

_HIGHEST = jax.lax.Precision.HIGHEST
SIMILARITIES = ("cosine", "dot")


def _prepare(x: jax.Array, similarity: str) -> jax.Array:
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    return unit_rows(x) if similarity == "cosine" else jnp.asarray(x, jnp.float32)


def _scores(a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    return scale * jnp.matmul(a, b.T, precision=_HIGHEST)


def _cross_entropy_sum(scores: jax.Array, targets: jax.Array) -> jax.Array:
    """sum over rows of -log softmax(scores)[row, target]."""
    picked = jnp.take_along_axis(scores, targets[:, None], axis=1)[:, 0]
    return jnp.sum(jax.nn.logsumexp(scores, axis=1) - picked)


def _flat_negatives(negatives: jax.Array | None, dim: int) -> jax.Array | None:
    """[batch, dim] or [batch, n, dim] hard negatives -> [batch * n, dim] rows (None stays None)."""
    if negatives is None:
        return None
    return negatives.reshape(-1, dim)


def _check_shapes(anchors, positives, negatives) -> None:
    if anchors.ndim != 2 or anchors.shape != positives.shape:
        raise ValueError(f"anchors and positives must both be [batch, dim]; got {anchors.shape} and "
                         f"{positives.shape}")
    if negatives is not None and (negatives.shape[0] != anchors.shape[0] or negatives.shape[-1] != anchors.shape[1]
                                  or negatives.ndim not in (2, 3)):
        raise ValueError(f"negatives must be [batch, dim] or [batch, n, dim] with batch {anchors.shape[0]} and dim "
                         f"{anchors.shape[1]}; got {negatives.shape}")


def ranking_loss_sums(anchors: jax.Array, positives: jax.Array, negatives: jax.Array | None,
                      all_anchors: jax.Array, all_positives: jax.Array, all_negatives: jax.Array | None,
                      offset: jax.Array | int, *, scale: float, symmetric: bool) -> jax.Array:
    """The loss summed over some rows of the batch (those of one device), scored against the whole batch.

    anchors/positives [b, dim]: this device's rows, already prepared (unit rows for cosine); all_* the whole
    batch's, the global row of local row i being `offset + i`. Returns the sum over the local rows of the forward
    cross-entropies, plus (symmetric) that of the backward ones; divide by the global batch (and 2) for the mean.
    """
    dim = anchors.shape[-1]
    candidates = all_positives
    flat = _flat_negatives(all_negatives, dim)
    if flat is not None:
        candidates = jnp.concatenate([all_positives, flat], axis=0)
    targets = offset + jnp.arange(anchors.shape[0])
    total = _cross_entropy_sum(_scores(anchors, candidates, scale), targets)
    if symmetric:
        # Positive i against every anchor: sentence-transformers' scores[:, :batch].T, row by row.
        total = total + _cross_entropy_sum(_scores(positives, all_anchors, scale), targets)
    return total


def multiple_negatives_ranking_loss(anchors: jax.Array, positives: jax.Array, negatives: jax.Array | None = None,
                                    *, scale: float = 20.0, symmetric: bool = False,
                                    similarity: str = "cosine") -> jax.Array:
    """float32 scalar: sentence-transformers' MultipleNegativesRankingLoss (symmetric: its
    MultipleNegativesSymmetricRankingLoss) of one batch.

    anchors, positives [batch, dim]; negatives None, [batch, dim] or [batch, n, dim]: hard negatives, which every
    anchor is scored against too (as sentence-transformers does with a third column).
    """
    _check_shapes(anchors, positives, negatives)
    a, p = _prepare(anchors, similarity), _prepare(positives, similarity)
    n = None if negatives is None else _prepare(negatives, similarity)
    total = ranking_loss_sums(a, p, n, a, p, n, 0, scale=scale, symmetric=symmetric)
    return total / (anchors.shape[0] * (2 if symmetric else 1))


def mesh_ranking_loss(mesh: Mesh, batch_axes: tuple[str, ...], *, scale: float = 20.0, symmetric: bool = False,
                      similarity: str = "cosine") -> Callable[..., jax.Array]:
    """`loss(anchors, positives, negatives=None)` over global arrays whose rows are split over `batch_axes` of
    `mesh`: equal to `multiple_negatives_ranking_loss` of the whole batch, computed by row blocks per device with
    the negatives all-gathered (see the module docstring). Differentiable; call it inside jit."""
    axes = tuple(a for a in batch_axes if a in mesh.shape)

    def local(a, p, n):
        a, p = _prepare(a, similarity), _prepare(p, similarity)
        n = None if n is None else _prepare(n, similarity)
        gather = lambda x: jax.lax.all_gather(x, axes, axis=0, tiled=True)  # noqa: E731
        all_p = gather(p)
        all_n = None if n is None else gather(n)
        all_a = gather(a) if symmetric else a
        offset = jax.lax.axis_index(axes) * a.shape[0]
        total = ranking_loss_sums(a, p, n, all_a, all_p, all_n, offset, scale=scale, symmetric=symmetric)
        return jax.lax.psum(total, axes)

    def loss(anchors, positives, negatives=None):
        _check_shapes(anchors, positives, negatives)
        rows = PartitionSpec(axes)
        if negatives is None:
            fn = jax.shard_map(lambda a, p: local(a, p, None), mesh=mesh, in_specs=(rows, rows),
                               out_specs=PartitionSpec())
            total = fn(anchors, positives)
        else:
            fn = jax.shard_map(local, mesh=mesh, in_specs=(rows, rows, rows), out_specs=PartitionSpec())
            total = fn(anchors, positives, negatives)
        return total / (anchors.shape[0] * (2 if symmetric else 1))

    return loss


# ---------------------------------------------------------------------------------------------------------------
# GradCache.

EmbedFn = Callable[[Any, dict, jax.Array], jax.Array]  # (params, rows {name: [n, ...]}, key) -> float32 [n, dim]
LossFn = Callable[[jax.Array], jax.Array]  # embeddings [rows, dim] -> scalar


def split_chunks(rows: dict[str, jax.Array], count: int, batch_axes: tuple[str, ...] | None = None) -> dict:
    """[n, ...] -> [count, n // count, ...], chunk c holding rows c, c + count, c + 2 count, ...

    Strided rather than contiguous: a device that owns a contiguous block of the batch owns the same block of
    every chunk, so splitting moves no data between devices (as the train step's microbatches)."""
    def split(x):
        x = x.reshape(x.shape[0] // count, count, *x.shape[1:]).swapaxes(0, 1)
        if batch_axes is not None:
            x = jax.lax.with_sharding_constraint(x, PartitionSpec(None, batch_axes, *([None] * (x.ndim - 2))))
        return x
    return jax.tree.map(split, rows)


def merge_chunks(x: jax.Array) -> jax.Array:
    """The inverse of `split_chunks` for one array: [count, n // count, ...] -> [n, ...] in the original order."""
    return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def uncached_loss_and_grads(embed: EmbedFn, loss_of: LossFn, params: Any, rows: dict,
                            key: jax.Array) -> tuple[jax.Array, Any]:
    """(loss, gradient wrt params) with the whole batch embedded in one differentiated forward pass."""
    return jax.value_and_grad(lambda p: loss_of(embed(p, rows, key)))(params)


def cached_loss_and_grads(embed: EmbedFn, loss_of: LossFn, params: Any, rows: dict, key: jax.Array,
                          chunks: int, batch_axes: tuple[str, ...] | None = None) -> tuple[jax.Array, Any]:
    """(loss, gradient wrt params) of `loss_of(embed(params, rows))` with the rows embedded `chunks` at a time
    (GradCache). Equal to `uncached_loss_and_grads` when `embed` ignores its key (no dropout); chunk c uses the
    key `fold_in(key, c)` in both of its forward passes, so with dropout another `chunks` gives other masks.

    rows: arrays [n, ...] (n divisible by `chunks`); embed maps [n / chunks, ...] rows to [n / chunks, dim].
    """
    micro = split_chunks(rows, chunks, batch_axes)
    indices = jnp.arange(chunks)

    def forward(_, item):  # no gradient is taken through this scan: no activations are kept
        index, chunk = item
        return None, embed(params, chunk, jax.random.fold_in(key, index))

    _, embedded = jax.lax.scan(forward, None, (indices, micro))  # [chunks, n / chunks, dim]
    embeddings = jax.lax.stop_gradient(merge_chunks(embedded))
    loss, embedding_grads = jax.value_and_grad(loss_of)(embeddings)
    chunk_grads = split_chunks({"g": embedding_grads}, chunks, batch_axes)["g"]

    def backward(total, item):  # one chunk's activations at a time
        index, chunk, cotangent = item
        _, vjp = jax.vjp(lambda p: embed(p, chunk, jax.random.fold_in(key, index)), params)
        (grads,) = vjp(cotangent)
        return jax.tree.map(jnp.add, total, grads), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, _ = jax.lax.scan(backward, zeros, (indices, micro, chunk_grads))
    return loss, grads
