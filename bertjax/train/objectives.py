"""Pretraining losses: MLM cross-entropy at the masked positions only, and NSP/SOP cross-entropy.

The model gathers the `max_predictions` masked positions of each row before the vocabulary projection (static
shapes, as original BERT's `max_predictions_per_seq`), so logits are [batch, max_predictions, vocab] and unused
prediction slots carry weight 0.

Losses are returned as sums with their counts, not means: the train step divides by the counts of the *whole*
batch, so gradient accumulation over microbatches gives exactly the full-batch gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class LossSums:
    """Per-batch sums; a mean is a sum divided by its count."""

    mlm_loss: jax.Array  # sum over masked positions of weight * cross-entropy
    mlm_weight: jax.Array  # sum of masked_weights (the number of predictions)
    mlm_correct: jax.Array  # weighted count of argmax == target
    nsp_loss: jax.Array  # sum over rows of NSP cross-entropy (0 without NSP)
    nsp_count: jax.Array  # rows with an NSP label (0 without NSP)
    nsp_correct: jax.Array

    def __add__(self, other: "LossSums") -> "LossSums":
        return jax.tree.map(jnp.add, self, other)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """-log softmax(logits)[label] in float32, per position."""
    logits = logits.astype(jnp.float32)
    log_normaliser = jax.nn.logsumexp(logits, axis=-1)
    label_logit = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return log_normaliser - label_logit


def mlm_sums(logits: jax.Array, masked_ids: jax.Array, masked_weights: jax.Array) -> tuple[jax.Array, ...]:
    """(loss sum, weight sum, correct sum) over [batch, max_predictions] predicted slots."""
    weights = masked_weights.astype(jnp.float32)
    loss = jnp.sum(cross_entropy(logits, masked_ids) * weights)
    correct = jnp.sum((jnp.argmax(logits, axis=-1) == masked_ids) * weights)
    return loss, jnp.sum(weights), correct


def nsp_sums(nsp_logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, ...]:
    """(loss sum, count, correct sum) over rows; labels 0 = is next (in order), 1 = not next (swapped), and -1 on
    the padding rows of evaluation batches, which do not count."""
    valid = (labels >= 0).astype(jnp.float32)
    safe = jnp.maximum(labels, 0)
    loss = jnp.sum(cross_entropy(nsp_logits, safe) * valid)
    correct = jnp.sum((jnp.argmax(nsp_logits, axis=-1) == safe) * valid)
    return loss, jnp.sum(valid), correct


def loss_sums(output, batch: dict, with_nsp: bool) -> LossSums:
    """The sums of one (micro)batch from the model output (`MaskedLMOutput` or `PreTrainingOutput`)."""
    mlm = mlm_sums(output.logits, batch["masked_ids"], batch["masked_weights"])
    zero = jnp.float32(0.0)
    nsp = nsp_sums(output.nsp_logits, batch["nsp_labels"]) if with_nsp else (zero, zero, zero)
    return LossSums(*mlm, *nsp)


@struct.dataclass
class Normalisers:
    """Counts of the whole batch that turn sums into means (at least 1, so an empty batch gives loss 0)."""

    mlm_weight: jax.Array
    nsp_count: jax.Array


def normalisers(batch: dict, with_nsp: bool) -> Normalisers:
    mlm = jnp.maximum(jnp.sum(batch["masked_weights"].astype(jnp.float32)), 1.0)
    nsp = jnp.maximum(jnp.sum(batch["nsp_labels"] >= 0).astype(jnp.float32), 1.0) if with_nsp else jnp.float32(1.0)
    return Normalisers(mlm_weight=mlm, nsp_count=nsp)


def total_loss(sums: LossSums, norm: Normalisers) -> jax.Array:
    """MLM mean plus NSP mean (the BERT pretraining loss); the NSP term is 0 without NSP."""
    return sums.mlm_loss / norm.mlm_weight + sums.nsp_loss / norm.nsp_count


def metrics(sums: LossSums, with_nsp: bool) -> dict[str, jax.Array]:
    """Means of a whole batch (or of several batches' summed sums)."""
    mlm_weight = jnp.maximum(sums.mlm_weight, 1.0)
    out = {"mlm_loss": sums.mlm_loss / mlm_weight, "mlm_accuracy": sums.mlm_correct / mlm_weight}
    loss = out["mlm_loss"]
    if with_nsp:
        nsp_count = jnp.maximum(sums.nsp_count, 1.0)
        out["nsp_loss"] = sums.nsp_loss / nsp_count
        out["nsp_accuracy"] = sums.nsp_correct / nsp_count
        loss = loss + out["nsp_loss"]
    out["loss"] = loss
    return out
