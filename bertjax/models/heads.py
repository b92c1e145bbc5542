"""Task heads: MLM (transform + tied decoder + bias), NSP/SOP classifier, [CLS] pooler, replaced-token detector."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.config import EncoderConfig
from bertjax.models.common import ACTIVATIONS, dense, norm, param_dtype, zeros_init


class MaskedLMHead(nn.Module):
    """dense -> activation -> norm -> decoder (the word-embedding matrix when tied) + bias.

    The transform projects to the embedding width, so a factorised model (ALBERT, the ELECTRA generator) decodes
    with its small embedding matrix. EuroBERT has no transform (`mlm_head_transform=False`): its decoder reads
    the final-norm output directly.
    """

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, attend) -> jax.Array:
        cfg = self.config
        in_axis = "embed"
        if cfg.mlm_head_transform:
            x = dense(cfg, cfg.embed_dim, ("embed", "embed_factor"), use_bias=cfg.head_dense_bias, name="dense")(x)
            x = norm(cfg, "norm")(ACTIVATIONS[cfg.head_activation](x))
            in_axis = "embed_factor"
        if cfg.tie_word_embeddings:
            logits = attend(x)
        else:
            logits = dense(cfg, cfg.vocab_size, (in_axis, "vocab"), use_bias=False, name="decoder")(x)
        if cfg.decoder_bias:
            logits = logits + self.param("decoder_bias", zeros_init(("vocab",)), (cfg.vocab_size,),
                                         param_dtype(cfg))
        return nn.with_logical_constraint(logits.astype(jnp.float32),
                                          ("activation_batch", "activation_length", "activation_vocab"))


class Pooler(nn.Module):
    """tanh(dense(hidden state of the row's first present token)), as BERT's pooler.

    The first present token, not index 0: on a left-padded row index 0 is padding, and the pooled output (and the
    NSP logits read from it) would depend on the padding, where the sequence-classification heads, which pool the
    first present token too, do not. On right-padded rows, the usual case, both are index 0 (transformers' choice).
    """

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """x [batch, seq, hidden]; segment_ids [batch, seq], 0 at padding (a row without present tokens pools
        index 0)."""
        cfg = self.config
        first = jnp.argmax(segment_ids != 0, axis=1)
        cls = jnp.take_along_axis(x, first[:, None, None], axis=1)[:, 0]
        return jnp.tanh(dense(cfg, cfg.hidden_size, ("embed", "mlp"), use_bias=True, name="dense")(cls))


class Classifier(nn.Module):
    """A linear classifier (NSP/SOP: 2 classes)."""

    config: EncoderConfig
    num_classes: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        logits = dense(self.config, self.num_classes, ("embed", "classes"), use_bias=True, name="dense")(x)
        return logits.astype(jnp.float32)


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator: dense -> hidden activation -> one logit per token (replaced vs original).

    The activation is the encoder's own (`activation`), as in the released discriminators; the generator's MLM
    head, by contrast, uses `head_activation`.
    """

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        x = ACTIVATIONS[cfg.activation](dense(cfg, cfg.hidden_size, ("embed", "mlp"), use_bias=True, name="dense")(x))
        logits = dense(cfg, 1, ("mlp", "classes"), use_bias=True, name="prediction")(x)[..., 0]
        return nn.with_logical_constraint(logits.astype(jnp.float32), ("activation_batch", "activation_length"))
