"""Self-attention modules by kind, and the standard one: projections, rotary positions, one call to the attention
entry point (bertjax.ops.attention).

`EncoderConfig.attention_kind` picks the module from `ATTENTION_MODULES`; every module has the constructor
(config, local_window, rope_theta) and the call (x [batch, seq, hidden], inputs: EncoderInputs) -> [batch, seq,
hidden], so the layer, the stack and the heads stay the same for every family.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import ops
from bertjax.config import EncoderConfig, alibi_slopes
from bertjax.models.common import compute_dtype, dense, dense_weights, project
from bertjax.models.inputs import EncoderInputs


class SelfAttention(nn.Module):
    config: EncoderConfig
    local_window: int | None  # None: global layer
    rope_theta: float

    @nn.compact
    def __call__(self, x: jax.Array, inputs: EncoderInputs) -> jax.Array:
        cfg = self.config
        bias = cfg.attention_bias
        # Kernels keep heads as their own axis so tensor parallelism can split heads without reshapes; q, k and v
        # run as one matmul when they have one shape (no GQA).
        weights = lambda heads, axis, name: dense_weights(
            cfg, x.shape[-1], (heads, cfg.head_dim), ("embed", axis, "kv"), use_bias=bias, name=name)()
        projections = [weights(cfg.num_heads, "heads", "query"), weights(cfg.kv_heads, "kv_heads", "key"),
                       weights(cfg.kv_heads, "kv_heads", "value")]
        # ALiBi (MosaicBERT): a per-head distance bias added inside the kernel, never a [seq, seq] tensor here.
        slopes = jnp.asarray(alibi_slopes(cfg.num_heads), jnp.float32) if cfg.position_embedding == "alibi" else None
        if cfg.attention_fused_qkv:  # the stack [batch, seq, 3, heads, head_dim] goes in whole (config.py)
            qkv = project(x, projections, 1, compute_dtype(cfg), stacked=True)
            out = ops.rope_attention(qkv, inputs.positions, self.rope_theta, segment_ids=inputs.segment_ids,
                                     local_window=self.local_window, implementation=cfg.attention_implementation,
                                     interpret=cfg.attention_interpret)
            q = k = None
        else:
            q, k, v = project(x, projections, 1, compute_dtype(cfg))
            if cfg.position_embedding == "rope":
                q = ops.apply_rope(q, inputs.positions, self.rope_theta)
                k = ops.apply_rope(k, inputs.positions, self.rope_theta)
            out = ops.attention(q, k, v, segment_ids=inputs.segment_ids, local_window=self.local_window,
                                implementation=cfg.attention_implementation,
                                interpret=cfg.attention_interpret, alibi_slopes=slopes)
        if self.is_mutable_collection("intermediates"):  # asked for (bertjax.intermediates): costs [seq, seq]
            if q is None:  # the stacked path: the rotated q and k it never materialised
                q, k = (ops.apply_rope(part.squeeze(2), inputs.positions, self.rope_theta)
                        for part in jnp.split(qkv, 3, axis=2)[:2])
            self.sow("intermediates", "attention_probabilities", ops.attention_probabilities(
                q, k, segment_ids=inputs.segment_ids, local_window=self.local_window, scale=cfg.head_dim ** -0.5,
                alibi_slopes=slopes))
        out = nn.with_logical_constraint(out, ("activation_batch", "activation_length", "activation_heads",
                                               "activation_kv"))
        return dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), use_bias=bias, in_ndim=2, name="out")(out)


# attention_kind -> module class. Family modules (DeBERTa, Longformer, ...) register here when their module is
# imported by bertjax.models.
ATTENTION_MODULES: dict[str, type[nn.Module]] = {"standard": SelfAttention}


def attention_module(config: EncoderConfig) -> type[nn.Module]:
    if config.attention_kind not in ATTENTION_MODULES:
        raise ValueError(f"EncoderConfig.attention_kind={config.attention_kind!r} is unknown; known: "
                         f"{sorted(ATTENTION_MODULES)}")
    return ATTENTION_MODULES[config.attention_kind]
