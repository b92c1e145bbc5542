"""DeBERTa's pieces: the disentangled attention module (attention_kind "disentangled"), the relative embedding
table the stack builds once per forward and hands to every layer (as transformers' DeBERTa does), and v2's
convolution after the first layer. The math is bertjax.ops.disentangled_attention's.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from bertjax.config import EncoderConfig
from bertjax.models.attention import ATTENTION_MODULES
from bertjax.models.common import ACTIVATIONS, compute_dtype, dense, kernel_init, norm, param_dtype, zeros_init
from bertjax.models.inputs import EncoderInputs
from bertjax.ops.disentangled_attention import disentangled_attention


class RelativeEmbeddings(nn.Module):
    """The [2 * span, hidden] relative embedding table, LayerNorm'd when norm_rel_ebd (v3). Shared by all layers."""

    config: EncoderConfig

    @nn.compact
    def __call__(self) -> jax.Array:
        cfg = self.config
        table = self.param("embedding", kernel_init(cfg, ("relative", "embed")),
                           (2 * cfg.disentangled.span, cfg.hidden_size), param_dtype(cfg)).astype(compute_dtype(cfg))
        return norm(cfg, "norm")(table) if cfg.disentangled.norm_rel_ebd else table


class DisentangledSelfAttention(nn.Module):
    """q/k/v projections (v1: bias-free plus query_bias/value_bias), the relative table projected by the key/query
    kernels (share_att_key) or by pos_key/pos_query, then bertjax.ops.disentangled_attention."""

    config: EncoderConfig
    local_window: int | None
    rope_theta: float

    @nn.compact
    def __call__(self, x: jax.Array, inputs: EncoderInputs) -> jax.Array:
        cfg, dis = self.config, self.config.disentangled
        heads, dim = cfg.num_heads, cfg.head_dim
        proj = lambda name, bias: dense(cfg, (heads, dim), ("embed", "heads", "kv"), use_bias=bias, name=name)
        query, key = proj("query", not dis.fused_qkv), proj("key", not dis.fused_qkv)
        q, k, v = query(x), key(x), proj("value", not dis.fused_qkv)(x)
        if dis.fused_qkv:  # v1's in_proj has no bias; its q_bias and v_bias are separate parameters
            bias = lambda name: self.param(name, zeros_init(("heads", "kv")), (heads, dim), param_dtype(cfg))
            q = q + bias("query_bias").astype(q.dtype)
            v = v + bias("value_bias").astype(v.dtype)
        rel = inputs.relative_embeddings
        if rel is None:
            raise ValueError("disentangled attention needs the relative embedding table (EncoderStack builds it)")
        span = dis.span
        if not dis.position_buckets and x.shape[1] < span:
            # v1 clamps distances at the span, so a row of seq tokens reads only the 2 * seq rows around the centre:
            # project those alone (transformers trims the table the same way). Same outputs, less work.
            rel, span = rel[span - x.shape[1]:span + x.shape[1]], x.shape[1]
        pos_key = pos_query = None
        if "c2p" in dis.pos_att_type:  # v1's pos_proj has no bias
            pos_key = (key if dis.share_att_key else proj("pos_key", not dis.fused_qkv))(rel)
        if "p2c" in dis.pos_att_type:
            pos_query = (query if dis.share_att_key else proj("pos_query", True))(rel)
        out = disentangled_attention(q, k, v, pos_key, pos_query, segment_ids=inputs.segment_ids, span=span,
                                     buckets=dis.position_buckets, max_position=dis.max_relative_positions,
                                     implementation=dis.implementation, block_size=dis.block_size,
                                     interpret=cfg.attention_interpret)
        out = nn.with_logical_constraint(out, ("activation_batch", "activation_length", "activation_heads",
                                               "activation_kv"))
        return dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), use_bias=True, in_ndim=2, name="out")(out)


class EmbeddingConvolution(nn.Module):
    """v2's ConvLayer after the first layer: norm(layer_out + act(conv(embeddings))), padding rows zeroed.

    The convolution runs over the embedding output (not the layer's), same length, `conv_groups` groups."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, embeddings: jax.Array, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        cfg, dis = self.config, self.config.disentangled
        size, h = dis.conv_kernel_size, cfg.hidden_size
        kernel = self.param("kernel", kernel_init(cfg, ("conv_width", "embed", "mlp")),
                            (size, h // dis.conv_groups, h), param_dtype(cfg))
        bias = self.param("bias", zeros_init(("mlp",)), (h,), param_dtype(cfg))
        dtype = compute_dtype(cfg)
        out = jax.lax.conv_general_dilated(embeddings.astype(dtype), kernel.astype(dtype), (1,),
                                           [((size - 1) // 2, (size - 1) // 2)], dimension_numbers=("NWC", "WIO", "NWC"),
                                           feature_group_count=dis.conv_groups) + bias.astype(dtype)
        keep = (segment_ids != 0)[..., None].astype(dtype)
        out = ACTIVATIONS[dis.conv_act](out * keep)
        return norm(cfg, "norm")(x + out) * keep


ATTENTION_MODULES["disentangled"] = DisentangledSelfAttention
