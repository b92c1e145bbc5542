"""Fine-tuning heads: per-segment pooling, a sequence head and a token head, shared by every family.

Every family's classification head is the same computation under different names: pool the token states, then
dense -> activation -> (ModernBERT: norm) -> dropout -> linear. BERT/ALBERT call the dense layer their pooler,
RoBERTa/ELECTRA a classification head, DistilBERT `pre_classifier`, ModernBERT `head`; the Hugging Face key
mappings (bertjax/hf/task_heads.py) name them. The knobs are EncoderConfig's classifier_* fields and
EncoderConfig.task (labels, dropout, pooling).

Pooling is per segment (bertjax/models/pooling.py), so a packed row yields one prediction per example.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.config import EncoderConfig
from bertjax.models.common import ACTIVATIONS, dense, norm
from bertjax.models.pooling import pool_segments, segment_membership


def _transform(cfg: EncoderConfig, x: jax.Array) -> jax.Array:
    """dense -> classifier_activation -> [norm]; called inside a head's compact method, so parameters are the
    head's children `dense` and `norm`."""
    x = dense(cfg, cfg.hidden_size, ("embed", "mlp"), use_bias=cfg.head_dense_bias, name="dense")(x)
    x = ACTIVATIONS[cfg.classifier_activation](x)
    if cfg.classifier_norm:
        x = norm(cfg, "norm")(x)
    return x


def _dropout_rate(cfg: EncoderConfig) -> float:
    rate = cfg.task_or_default.classifier_dropout
    return cfg.dropout_rate if rate is None else rate


def _out(cfg: EncoderConfig, x: jax.Array, num_outputs: int, deterministic: bool) -> jax.Array:
    x = nn.Dropout(_dropout_rate(cfg))(x, deterministic=deterministic)
    logits = dense(cfg, num_outputs, ("mlp", "classes"), use_bias=True, name="out")(x)
    return logits.astype(jnp.float32)


class SequenceHead(nn.Module):
    """One prediction per segment: pool -> dense -> activation -> [norm] -> dropout -> out.

    Returns (logits [batch, K, num_outputs] float32, segment_mask [batch, K]); empty slots hold zeros.
    "late" pooling (EuroBERT) runs the head on every token and averages the logits over the segment instead.
    """

    config: EncoderConfig
    num_outputs: int

    @nn.compact
    def __call__(self, hidden: jax.Array, segment_ids: jax.Array, max_segments: int | None = None,
                 deterministic: bool = True) -> tuple[jax.Array, jax.Array]:
        cfg = self.config
        pooling = cfg.classifier_pooling
        member = segment_membership(segment_ids, max_segments)
        if pooling == "late":
            logits = pool_segments(_out(cfg, _transform(cfg, hidden), self.num_outputs, deterministic), member, "mean")
        else:
            logits = _out(cfg, _transform(cfg, pool_segments(hidden, member, pooling)), self.num_outputs,
                          deterministic)
        segment_mask = jnp.any(member, axis=1)
        return jnp.where(segment_mask[..., None], logits, 0.0), segment_mask


class TokenHead(nn.Module):
    """One prediction per token: [dense -> activation -> norm (ModernBERT)] -> dropout -> out."""

    config: EncoderConfig
    num_outputs: int

    @nn.compact
    def __call__(self, hidden: jax.Array, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        if cfg.classifier_token_transform:
            hidden = _transform(cfg, hidden)
        return _out(cfg, hidden, self.num_outputs, deterministic)
