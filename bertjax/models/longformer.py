"""Longformer's self-attention (attention_kind "longformer"), computed as transformers' LongformerSelfAttention.

Every token attends in its layer's sliding window (|i - j| <= window // 2) and to the global tokens of its
segment, all through the `query`/`key`/`value` projections: one call of bertjax.ops.attention with `global_tokens`
(whose rows for global queries are then replaced). A global token's own row is different: its query comes from
`query_global` and it attends to every token of its segment through `key_global`/`value_global`. Those rows are
computed for at most G gathered global positions per row, a [G, seq] score matrix, never [seq, seq] unless G is
unknown (see LongformerOptions.max_global_tokens).

Parameters: query, key, value, query_global, key_global, value_global, out (transformers: attention.self.* and
attention.output.dense).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import ops
from bertjax.config import EncoderConfig
from bertjax.models.attention import ATTENTION_MODULES
from bertjax.models.common import dense
from bertjax.models.inputs import EncoderInputs
from bertjax.ops.masks import flagged_first, global_slots, scatter_slots
from bertjax.ops.xla_attention import MASKED


class LongformerSelfAttention(nn.Module):
    config: EncoderConfig
    local_window: int | None
    rope_theta: float

    @nn.compact
    def __call__(self, x: jax.Array, inputs: EncoderInputs) -> jax.Array:
        cfg = self.config
        heads, dim = cfg.num_heads, cfg.head_dim
        proj = lambda name: dense(cfg, (heads, dim), ("embed", "heads", "kv"), use_bias=cfg.attention_bias, name=name)
        q, k, v = proj("query")(x), proj("key")(x), proj("value")(x)
        global_tokens = inputs.global_tokens
        out = ops.attention(q, k, v, segment_ids=inputs.segment_ids, local_window=self.local_window,
                            implementation=cfg.attention_implementation, interpret=cfg.attention_interpret,
                            global_tokens=global_tokens, max_global_tokens=cfg.longformer.max_global_tokens)
        query_global, key_global, value_global = proj("query_global"), proj("key_global"), proj("value_global")
        if global_tokens is not None:
            out = self.global_rows(x, out, global_tokens, inputs.segment_ids, query_global, key_global,
                                   value_global)
        elif self.is_initializing():  # the global projections exist in every layer, as in transformers' files
            query_global(x), key_global(x), value_global(x)
        out = nn.with_logical_constraint(out, ("activation_batch", "activation_length", "activation_heads",
                                               "activation_kv"))
        return dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), use_bias=cfg.attention_bias, in_ndim=2,
                     name="out")(out)

    def global_rows(self, x, out, global_tokens, segment_ids, query_global, key_global, value_global):
        """`out` with the rows of global tokens replaced by their global attention over their segment."""
        dim = out.shape[-1]
        slots = global_slots(global_tokens, self.config.longformer.max_global_tokens)
        order, valid = flagged_first(global_tokens, slots)  # [batch, slots]: global positions first, in order
        qg = query_global(jnp.take_along_axis(x, order[..., None], axis=1))  # [batch, slots, heads, dim]
        kg, vg = key_global(x), value_global(x)  # [batch, seq, heads, dim]
        scores = jnp.einsum("bghd,bshd->bhgs", qg * jnp.asarray(dim ** -0.5, qg.dtype), kg,
                            preferred_element_type=jnp.float32)
        q_segments = jnp.take_along_axis(segment_ids, order, axis=1)
        visible = (q_segments[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] != 0)
        scores = jnp.where(visible[:, None], scores, MASKED)
        weights = jax.nn.softmax(scores, axis=-1).astype(vg.dtype)
        rows = jnp.einsum("bhgs,bshd->bghd", weights, vg, preferred_element_type=jnp.float32).astype(out.dtype)
        return scatter_slots(out, order, valid, rows)


ATTENTION_MODULES["longformer"] = LongformerSelfAttention
