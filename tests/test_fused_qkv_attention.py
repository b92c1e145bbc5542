"""Attention on the stacked q/k/v projection (`bertjax.ops.rope_attention`, EncoderConfig.attention_fused_qkv):
pallas_gpu's kernels reading v from the stack and writing its gradient whole, RoPE's backward in their stores
(interpret mode), against RoPE and attention on the split projection with XLA's dense attention. float32
throughout: agreement to 2e-6 (different summation orders), on packed segments with padding and a length that is
not a multiple of the tiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import ops
from bertjax.config import get_config
from bertjax.models import EncoderForMaskedLM, init_params


def packed_inputs(batch=2, seq=100, heads=2, head_dim=16, seed=0):
    rng = np.random.default_rng(seed)
    qkv = jnp.asarray(rng.standard_normal((batch, seq, 3, heads, head_dim)), jnp.float32)
    segments = np.ones((batch, seq), np.int32)
    segments[0, 60:] = 2
    segments[1, 90:] = 0
    positions = np.stack([np.r_[np.arange(60), np.arange(seq - 60)] if seq > 60 else np.arange(seq),
                          np.arange(seq)]).astype(np.int32)
    weight = jnp.asarray(rng.standard_normal((batch, seq, heads, head_dim)) * (segments != 0)[..., None, None],
                         jnp.float32)
    return qkv, positions, segments, weight


def split_reference(qkv, positions, segments, window):
    q, k, v = (part.squeeze(2) for part in jnp.split(qkv, 3, axis=2))
    q, k = ops.apply_rope(q, positions, 10_000.0), ops.apply_rope(k, positions, 10_000.0)
    return ops.attention(q, k, v, segment_ids=segments, local_window=window, implementation="xla")


@pytest.mark.parametrize("window, tiles", [(None, {}), (32, {}),
                                           (32, dict(backward_block_q=32, dkv_block_k=32, dkv_block_q=16))],
                         ids=["global", "local32", "local32_own_backward_tiles"])
def test_stacked_kernels_match_split_attention_and_its_gradient(window, tiles):
    """Third case: dq holds 32 queries and steps through 16 keys, dk/dv holds 32 keys and steps through 16 queries
    (both write slots of the one gradient buffer); the sequence pads to 128."""
    from bertjax.ops.pallas_gpu_attention import pallas_gpu_rope_attention

    qkv, positions, segments, weight = packed_inputs()

    def loss(fn):
        def value(qkv):
            out = fn(qkv)
            return jnp.sum(out * weight), out
        return jax.jit(jax.value_and_grad(value, has_aux=True))  # one compiled program, not op-by-op dispatch

    kernel = lambda qkv: pallas_gpu_rope_attention(qkv, positions, 10_000.0, segment_ids=segments,
                                                   local_window=window, scale=16 ** -0.5, interpret=True,
                                                   **{"block_q": 16, "block_k": 16, **tiles})
    (_, want), want_grad = loss(lambda y: split_reference(y, positions, segments, window))(qkv)
    (_, got), grad = loss(kernel)(qkv)
    real = segments != 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-6)
    np.testing.assert_allclose(grad, want_grad, atol=2e-6)  # q, k (through RoPE) and v slots, padding's zero


def test_implementations_without_a_stacked_path_split_the_stack():
    qkv, positions, segments, _ = packed_inputs(seq=40)
    got = ops.rope_attention(qkv, positions, 10_000.0, segment_ids=segments, local_window=8, implementation="xla")
    np.testing.assert_array_equal(got, split_reference(qkv, positions, segments, 8))
    with pytest.raises(ValueError, match=r"\[batch, seq, 3, heads, head_dim\]"):
        ops.rope_attention(qkv[:, :, :2], positions, 10_000.0, segment_ids=segments)


def test_config_refuses_what_it_cannot_stack():
    assert get_config("modernbert-tiny", attention_fused_qkv=True).attention_fused_qkv
    for preset in ("bert-tiny", "eurobert-tiny"):  # learned positions; grouped-query attention
        with pytest.raises(ValueError, match="attention_fused_qkv"):
            get_config(preset, attention_fused_qkv=True)


def test_modernbert_trains_the_same_with_the_stacked_path():
    """ModernBERT (RoPE with two thetas, global and local layers) with pallas_gpu in interpret mode: the MLM loss
    and every parameter's gradient with the stacked path equal those of the split one. Two layers: layer 0 global
    (theta 160k), layer 1 local (theta 10k); a third, local like the second, would only add compile time."""
    config = get_config("modernbert-tiny", attention_implementation="pallas_gpu", attention_interpret=True,
                        num_layers=2)
    assert config.global_attention_every == 3 and config.local_window == 8  # layer 0 global, layer 1 local
    rng = np.random.default_rng(1)
    ids = rng.integers(1, config.vocab_size, (2, 40)).astype(np.int32)
    segments = np.stack([np.r_[np.ones(25), np.full(10, 2), np.zeros(5)], np.ones(40)]).astype(np.int32)
    params = init_params(EncoderForMaskedLM(config), jax.random.key(0))

    def loss_and_grads(fused):
        model = EncoderForMaskedLM(config.replace(attention_fused_qkv=fused))

        def loss(p):
            logits = model.apply({"params": p}, ids, segment_ids=segments).logits
            return jnp.mean(jnp.where(segments[..., None] > 0, jax.nn.log_softmax(logits), 0.0))

        return jax.jit(jax.value_and_grad(loss))(params)

    (want, want_grads), (got, grads) = loss_and_grads(False), loss_and_grads(True)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
