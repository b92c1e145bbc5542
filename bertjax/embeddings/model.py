"""The embedding model: backbone -> per-segment pooling -> Dense layers -> truncation -> normalisation.

    model = EncoderForEmbedding(encoder_config, pooling=PoolingConfig(modes=("mean",), normalize=True))
    params = init_params(model, jax.random.key(0))            # {"embeddings", "encoder", "dense_0", ...}
    vectors = model.apply({"params": params}, input_ids, segment_ids, max_segments=4)  # float32 [batch, 4, dim]

Packed rows (segment ids 1..K per row, 0 = padding) give one vector per text: slot k holds text k + 1, empty slots
hold zeros. The backbone runs in the config's dtype (bfloat16 for fast inference); pooling, Dense layers and
normalisation run in float32, as sentence-transformers accumulates its pooling in float32.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.embeddings.config import DenseConfig, PoolingConfig
from bertjax.embeddings.similarity import unit_rows
from bertjax.models.common import ACTIVATIONS, dense
from bertjax.models.model import _Backbone
from bertjax.models.pooling import pool_sentences

# DenseConfig.activation -> function (torch's GELU is the exact erf form, as common.ACTIVATIONS' "gelu").
DENSE_ACTIVATIONS = {
    "identity": lambda x: x,
    "tanh": ACTIVATIONS["tanh"],
    "relu": ACTIVATIONS["relu"],
    "gelu": ACTIVATIONS["gelu"],
    "silu": ACTIVATIONS["silu"],
    "sigmoid": jax.nn.sigmoid,
}
# Logical names of the Dense kernels: not in the mesh rules, so replicated (small projections).
DENSE_AXES = ("sentence_in", "sentence_out")


class SentenceDense(nn.Module):
    """sentence-transformers' Dense module: activation(x W + b), plus the input (projected when the sizes differ)
    with use_residual. Parameters: linear/{kernel [in, out], bias}, residual/kernel."""

    config: object  # EncoderConfig: initialiser range and parameter dtype
    dense_config: DenseConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg, spec = self.config.replace(dtype="float32"), self.dense_config
        if x.shape[-1] != spec.in_features:
            raise ValueError(f"Dense layer expects {spec.in_features} input features, the embedding has "
                             f"{x.shape[-1]}")
        y = DENSE_ACTIVATIONS[spec.activation](
            dense(cfg, spec.out_features, DENSE_AXES, use_bias=spec.bias, name="linear")(x))
        if spec.use_residual:
            y = y + (x if spec.in_features == spec.out_features else
                     dense(cfg, spec.out_features, DENSE_AXES, use_bias=False, name="residual")(x))
        return y


def finish_embedding(x: jax.Array, pooling: PoolingConfig) -> jax.Array:
    """Matryoshka truncation then L2 normalisation (float32), as sentence-transformers' encode does them."""
    if pooling.truncate_dim is not None:
        x = x[..., :pooling.truncate_dim]
    if pooling.normalize:  # torch.nn.functional.normalize; a zero vector (an empty slot) stays zero
        x = unit_rows(x)
    return x


class EncoderForEmbedding(_Backbone):
    """Sentence embeddings of (packed) rows. `pooling` and `dense` are static; the parameters are the backbone's
    (`embeddings/`, `encoder/`) and one `dense_i/` per Dense layer."""

    pooling: PoolingConfig = PoolingConfig()
    dense: tuple[DenseConfig, ...] = ()

    def setup(self):
        super().setup()
        self.dense_layers = [SentenceDense(self.config, spec, name=f"dense_{i}") for i, spec in enumerate(self.dense)]

    def example_input_ids(self, seq_len: int = 1) -> jax.Array:
        return jnp.zeros((1, seq_len), jnp.int32)

    def __call__(self, input_ids, segment_ids=None, max_segments: int = 1, prompt_lengths=None,
                 token_type_ids=None, deterministic: bool = True) -> jax.Array:
        """float32 [batch, max_segments, dim]. `segment_ids` default to one text per row (padding must then be
        marked by segment id 0: pass them). `prompt_lengths` (int or [batch, max_segments]): tokens at the start
        of each text that pooling leaves out when `pooling.include_prompt` is False; ignored otherwise."""
        hidden, inputs = self.encode_with_inputs(input_ids, token_type_ids=token_type_ids, segment_ids=segment_ids,
                                                 deterministic=deterministic)
        excluded = None if self.pooling.include_prompt else prompt_lengths
        x = pool_sentences(hidden, inputs.segment_ids, max_segments, self.pooling.modes, excluded)
        for layer in self.dense_layers:
            x = layer(x)
        present = jnp.any(inputs.segment_ids[..., None] == jnp.arange(1, max_segments + 1), axis=1)[..., None]
        return jnp.where(present, finish_embedding(x, self.pooling), 0.0)
