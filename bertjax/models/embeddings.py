"""Token, position and token-type embeddings, the embedding norm and the ALBERT/ELECTRA factorised projection."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.config import EncoderConfig
from bertjax.models.common import compute_dtype, dense, norm, param_dtype
from bertjax.models.inputs import EncoderInputs


@functools.lru_cache(maxsize=8)
def sinusoidal_table(num_positions: int, dim: int) -> np.ndarray:
    """DistilBERT's fixed position table [num_positions, dim] in float32: sin at even features, cos at odd ones,
    angle pos / 10000^(2 * (j // 2) / dim), computed in float64 as transformers does so the float32 values match
    its table bit for bit. A constant of the program, never a trained parameter."""
    positions = np.arange(num_positions, dtype=np.float64)[:, None]
    angles = positions / np.power(10000.0, 2 * (np.arange(dim) // 2) / dim)[None, :]
    table = np.where(np.arange(dim)[None, :] % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)
    table.flags.writeable = False  # shared through the cache
    return table


class Embeddings(nn.Module):
    config: EncoderConfig

    def setup(self):
        cfg = self.config
        init = nn.initializers.truncated_normal(cfg.initializer_range)
        embed = lambda num, axes, name: nn.Embed(num, cfg.embed_dim, dtype=compute_dtype(cfg),
                                                 param_dtype=param_dtype(cfg),
                                                 embedding_init=nn.with_logical_partitioning(init, axes), name=name)
        self.word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"), "word_embeddings")
        if cfg.position_embedding == "learned":
            self.position_embeddings = embed(cfg.max_position_embeddings, ("position", "embed"),
                                             "position_embeddings")
        if cfg.token_type_embedding:
            self.token_type_embeddings = embed(cfg.type_vocab_size, ("token_type", "embed"), "token_type_embeddings")
        if cfg.embedding_norm:
            self.norm = norm(cfg, "norm")
        if cfg.embed_dim != cfg.hidden_size:  # DeBERTa's embed_proj has no bias
            self.projection = dense(cfg, cfg.hidden_size, ("embed_factor", "embed"),
                                    use_bias=cfg.disentangled is None, name="projection")
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def __call__(self, inputs: EncoderInputs, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        x = self.word_embeddings(inputs.input_ids)
        if not self.is_initializing():  # init would otherwise return a "perturbations" collection next to params
            # Zero unless the caller passes a "perturbations" collection: then jax.grad with respect to it is the
            # gradient with respect to the input embeddings (bertjax.intermediates.input_perturbations).
            x = self.perturb("input_embeddings", x)
        if cfg.position_embedding == "learned":
            x = x + self.position_embeddings(inputs.positions)
        elif cfg.position_embedding == "sinusoidal":
            table = jnp.asarray(sinusoidal_table(cfg.max_position_embeddings, cfg.embed_dim), compute_dtype(cfg))
            x = x + table[inputs.positions]
        if cfg.token_type_embedding:
            x = x + self.token_type_embeddings(inputs.token_type_ids)
        if cfg.disentangled is not None:
            # DeBERTa projects before the norm and zeroes padding rows: v2's convolution reads its neighbours.
            if cfg.embed_dim != cfg.hidden_size:
                x = self.projection(x)
            x = self.norm(x) * (inputs.segment_ids != 0)[..., None].astype(x.dtype)
            return self.dropout(x, deterministic=deterministic)
        if cfg.embedding_norm:
            x = self.norm(x)
        x = self.dropout(x, deterministic=deterministic)
        if cfg.embed_dim != cfg.hidden_size:
            x = self.projection(x)
        return nn.with_logical_constraint(x, ("activation_batch", "activation_length", "activation_embed"))

    def attend(self, x: jax.Array) -> jax.Array:
        """Project hidden states onto the vocabulary with the (tied) word-embedding matrix."""
        return self.word_embeddings.attend(x)
