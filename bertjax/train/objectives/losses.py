"""Loss pieces the objectives share: cross-entropy, masked-LM and sentence-pair sums.

The model gathers the `max_predictions` masked positions of each row before the vocabulary projection (static
shapes, as original BERT's `max_predictions_per_seq`), so logits are [batch, max_predictions, vocab] and unused
prediction slots carry weight 0.

Losses are sums with their counts, not means: the train step divides by the counts of the *whole* batch, so
gradient accumulation over microbatches gives exactly the full-batch gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy_and_hit(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(-log softmax(logits)[label] in float32, whether the label has the top logit), per position.

    The hit reuses the maximum that the log-normaliser needs anyway: over a 30-50k vocabulary a separate argmax is
    a third full pass over the logits (~5% of a small model's CPU train step). Exact ties with another token, which
    argmax would break by index, count as hits.

    The label's logit is picked by comparing against the vocabulary index, not gathered: the gather's gradient is
    a scatter into a zero [positions, vocab] float32 array, a kernel of its own that XLA cannot fuse; with the
    comparison, whose gradient is elementwise and fuses into the softmax's, modernbert-base's H100 step moves 9.0 of
    its 88.2 GB less (docs/benchmarks.md).
    """
    logits = logits.astype(jnp.float32)
    top = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
    log_normaliser = top + jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    label_logit = jnp.sum(jnp.where(vocab == labels[..., None].astype(jnp.int32), logits, 0.0), axis=-1)
    return log_normaliser - label_logit, label_logit >= top


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """-log softmax(logits)[label] in float32, per position."""
    return cross_entropy_and_hit(logits, labels)[0]


def mlm_sums(logits: jax.Array, masked_ids: jax.Array, masked_weights: jax.Array) -> tuple[jax.Array, ...]:
    """(loss sum, weight sum, correct sum) over [batch, max_predictions] predicted slots."""
    weights = masked_weights.astype(jnp.float32)
    losses, hits = cross_entropy_and_hit(logits, masked_ids)
    return jnp.sum(losses * weights), jnp.sum(weights), jnp.sum(hits * weights)


def nsp_sums(nsp_logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, ...]:
    """(loss sum, count, correct sum) over rows; labels 0 = is next (in order), 1 = not next (swapped), and -1 on
    the padding rows of evaluation batches, which do not count."""
    valid = (labels >= 0).astype(jnp.float32)
    safe = jnp.maximum(labels, 0)
    loss = jnp.sum(cross_entropy(nsp_logits, safe) * valid)
    correct = jnp.sum((jnp.argmax(nsp_logits, axis=-1) == safe) * valid)
    return loss, jnp.sum(valid), correct


def prediction_count(batch: dict) -> jax.Array:
    """Masked predictions of a whole batch, at least 1 (an empty batch gives loss 0, not NaN)."""
    return jnp.maximum(jnp.sum(batch["masked_weights"].astype(jnp.float32)), 1.0)


def real_token_count(batch: dict) -> jax.Array:
    """Non-padding tokens of a whole batch, at least 1 (the count per-token losses are divided by)."""
    return jnp.maximum(jnp.sum(batch["segment_ids"] > 0).astype(jnp.float32), 1.0)


def mean(total: jax.Array, count: jax.Array) -> jax.Array:
    """A sum over (possibly several batches') counts as a mean; 0 when nothing was counted."""
    return total / jnp.maximum(count, 1.0)
