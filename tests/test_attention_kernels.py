"""Every attention implementation against the dense XLA reference, forward and dq/dk/dv, on CPU.

Pallas kernels run in interpret mode with small tiles, so each case covers several query and key blocks, block
skipping, sequence padding, packed documents (one of a single token), a padding tail, and GQA.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import ops
from bertjax.config import get_config
from bertjax.models import EncoderForMaskedLM, init_params
from bertjax.ops.attention import IMPLEMENTATIONS
from bertjax.ops.blockwise_attention import blockwise_local_attention, xla_auto_attention
from bertjax.ops.pallas_gpu_attention import full_block_ranges, key_block_ranges, pallas_gpu_attention
from bertjax.ops.pallas_tpu_attention import pallas_tpu_attention
from bertjax.ops.xla_attention import dense_attention

# The implementations under test, with small tiles (kernel parameters) so that tiny shapes span many blocks.
IMPLEMENTATIONS_UNDER_TEST = {
    "xla_blockwise": functools.partial(blockwise_local_attention, chunk=8),
    "xla_auto": xla_auto_attention,
    "pallas_tpu": functools.partial(pallas_tpu_attention, interpret=True),  # 128 is splash's smallest tile
    "pallas_gpu": functools.partial(pallas_gpu_attention, interpret=True, block_q=16, block_k=32),
    # the one-pass backward (dq by atomic adds), on tiles of its own
    "pallas_gpu_atomic": functools.partial(pallas_gpu_attention, interpret=True, block_q=16, block_k=32,
                                           dkv_block_q=32, dkv_block_k=16, backward_kernel="triton_atomic"),
}

# (seq, heads, kv_heads, head_dim, window, dtype); no seq is a multiple of 8, 16, 32 or 128.
CASES = {
    "global": (37, 4, 4, 16, None, jnp.float32),
    "local_gqa2": (77, 4, 2, 8, 16, jnp.float32),
    "local_wider_than_seq_gqa4": (29, 4, 1, 24, 200, jnp.float32),
    "local_bf16_gqa4": (61, 4, 1, 32, 10, jnp.bfloat16),
    "global_bf16_gqa2": (45, 4, 2, 64, None, jnp.bfloat16),
}
# Forward and gradients; bfloat16 is compared with a float32 reference on the same (rounded) inputs.
TOLERANCE = {jnp.float32: 5e-5, jnp.bfloat16: 5e-2}


def packed_segments(seq: int) -> np.ndarray:
    """Row 0: documents of 9, 1 (a single token), 13 and the rest but 5 tokens, then 5 padding tokens.
    Row 1: one document filling the row."""
    row = np.zeros(seq, np.int32)
    row[:9], row[9], row[10:23], row[23:seq - 5] = 1, 2, 3, 4
    return np.stack([row, np.ones(seq, np.int32)])


def make_inputs(seq, heads, kv_heads, head_dim, dtype, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, seq, heads, head_dim))
    k = rng.standard_normal((2, seq, kv_heads, head_dim))
    v = rng.standard_normal((2, seq, kv_heads, head_dim))
    seg = packed_segments(seq)
    # The loss ignores padding positions, so their cotangent is zero; `wild` also fills them, to check for NaN.
    cotangent = rng.standard_normal((2, seq, heads, head_dim))
    wild = cotangent.copy()
    cotangent *= (seg != 0)[:, :, None, None]
    as_dtype = lambda x: jnp.asarray(x, dtype)
    return as_dtype(q), as_dtype(k), as_dtype(v), jnp.asarray(seg), as_dtype(cotangent), as_dtype(wild)


def forward_and_grads(fn, q, k, v, seg, cotangent, wild, window, scale):
    def attend(q, k, v):
        return fn(q, k, v, segment_ids=seg, local_window=window, scale=scale)

    out, vjp = jax.vjp(attend, q, k, v)
    return out, vjp(cotangent), vjp(wild)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(IMPLEMENTATIONS_UNDER_TEST))
def test_matches_dense_reference_forward_and_backward(name, case):
    seq, heads, kv_heads, head_dim, window, dtype = CASES[case]
    q, k, v, seg, cotangent, wild = make_inputs(seq, heads, kv_heads, head_dim, dtype)
    scale = 1 / np.sqrt(head_dim)
    out, grads, wild_grads = jax.jit(functools.partial(
        forward_and_grads, IMPLEMENTATIONS_UNDER_TEST[name], window=window, scale=scale))(q, k, v, seg, cotangent,
                                                                                           wild)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    ref_out, ref_grads, _ = jax.jit(functools.partial(forward_and_grads, dense_attention, window=window, scale=scale))(
        f32(q), f32(k), f32(v), seg, f32(cotangent), f32(wild))

    for x in (out, *grads, *wild_grads):  # padding rows included
        assert np.isfinite(np.asarray(f32(x))).all(), f"{name}: non-finite values"
    valid = np.asarray(seg) != 0
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(f32(out)[valid], ref_out[valid], atol=tol, rtol=tol, err_msg=f"{name} output")
    for label, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        np.testing.assert_allclose(f32(got), want, atol=tol, rtol=tol, err_msg=f"{name} {label}")
    if name.startswith("pallas_gpu"):  # a query with no visible key gives exactly zero, not an average of padding
        assert not np.asarray(f32(out))[~valid].any()


def test_registry_and_auto():
    for name in ("xla", "xla_blockwise", "xla_auto", "pallas_tpu", "pallas_gpu"):
        assert name in IMPLEMENTATIONS
    assert ops.resolve_implementation("auto", platform="tpu") == "pallas_tpu"
    assert ops.resolve_implementation("auto", platform="gpu") == "pallas_gpu"
    assert ops.resolve_implementation("auto") == "xla_auto"  # tests run on CPU
    # The public entry point reaches a Pallas kernel (default tiles) in interpret mode.
    q, k, v, seg, _, _ = make_inputs(21, 2, 1, 8, jnp.float32)
    got = ops.attention(q, k, v, segment_ids=seg, local_window=6, implementation="pallas_gpu", interpret=True)
    want = ops.attention(q, k, v, segment_ids=seg, local_window=6, implementation="xla")
    valid = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=1e-5, rtol=1e-5)


def test_pallas_gpu_rejects_bad_block_size():
    q, k, v, seg, _, _ = make_inputs(21, 2, 1, 8, jnp.float32)
    with pytest.raises(ValueError, match="block_q must be a power of two"):
        pallas_gpu_attention(q, k, v, segment_ids=seg, local_window=None, scale=1.0, interpret=True, block_q=24)
    with pytest.raises(ValueError, match="block_k must be a power of two >= 16"):  # Triton's smallest dot side
        pallas_gpu_attention(q, k, v, segment_ids=seg, local_window=None, scale=1.0, interpret=True, block_k=8)


@pytest.mark.parametrize("tiles", [dict(block_q=16, block_k=32, backward_block_q=32, backward_block_k=16),
                                   dict(block_q=16, block_k=16, backward_block_q=32, backward_block_k=64),
                                   dict(block_q=16, block_k=16, backward_block_q=32, backward_block_k=16,
                                        dkv_block_q=16, dkv_block_k=32, dkv_num_warps=8)],
                         ids=["transposed", "backward_larger", "each_backward_kernel_holds_32"])
def test_pallas_gpu_backward_tiles_differ_from_the_forward(tiles):
    """The backward kernels recompute their block ranges for their own tiles and reuse the forward's per-row
    log-sum-exp; the sequence (45) pads to the largest tile (64 in the second case: padding only the forward's 16
    would leave a partial backward block). In the third, dq holds 32 queries and steps through 16 keys while dk/dv
    holds 32 keys and steps through 16 queries. Packed segments, a local window, GQA."""
    seq, heads, kv_heads, head_dim, window, dtype = 45, 4, 2, 16, 20, jnp.float32
    q, k, v, seg, cotangent, wild = make_inputs(seq, heads, kv_heads, head_dim, dtype)
    scale = 1 / np.sqrt(head_dim)
    run = lambda fn: jax.jit(functools.partial(forward_and_grads, fn, window=window, scale=scale))(
        q, k, v, seg, cotangent, wild)
    out, grads, wild_grads = run(functools.partial(pallas_gpu_attention, interpret=True, **tiles))
    ref_out, ref_grads, _ = run(dense_attention)
    valid = np.asarray(seg) != 0
    tol = TOLERANCE[dtype]
    for x in (out, *grads, *wild_grads):
        assert np.isfinite(np.asarray(x)).all()
    np.testing.assert_allclose(np.asarray(out)[valid], np.asarray(ref_out)[valid], atol=tol, rtol=tol)
    for label, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        np.testing.assert_allclose(got, want, atol=tol, rtol=tol, err_msg=label)


def test_pallas_gpu_rejects_bad_backward_block_size():
    q, k, v, seg, _, _ = make_inputs(21, 2, 1, 8, jnp.float32)
    for name, size in (("backward_block_q", 48), ("backward_block_k", 8), ("dkv_block_k", 24)):
        with pytest.raises(ValueError, match=f"{name} must be a power of two >= 16, got {size}"):
            pallas_gpu_attention(q, k, v, segment_ids=seg, local_window=None, scale=1.0, interpret=True,
                                 **{name: size})
    with pytest.raises(TypeError, match=r"unknown tile argument\(s\) \['dk_block_q'\]"):
        pallas_gpu_attention(q, k, v, segment_ids=seg, local_window=None, scale=1.0, interpret=True, dk_block_q=32)


def test_pallas_gpu_tiles_inherit_forward_then_backward():
    """Unset backward_* take the forward's values and unset dkv_* the backward_* ones; the kernels' statics carry
    only what differs."""
    from bertjax.ops.pallas_gpu_attention import _resolve_tiles, _statics

    tiles = _resolve_tiles("t", dict(block_k=32, num_warps=8, backward_block_q=128, dkv_num_stages=2))
    assert tiles == dict(block_q=64, block_k=32, num_warps=8, num_stages=None,
                         backward_block_q=128, backward_block_k=32, backward_num_warps=8, backward_num_stages=None,
                         dkv_block_q=128, dkv_block_k=32, dkv_num_warps=8, dkv_num_stages=2)
    st = _statics(tiles, 64, scale=1.0, half=None, interpret=True)
    dq, dkv = st.backward_kernels()
    assert (st.block_q, st.block_k, st.num_warps, st.num_stages) == (64, 32, 8, 3)  # 3 stages: head_dim 64
    assert (dq.block_q, dq.block_k, dq.num_stages) == (128, 32, 3)
    assert (dkv.block_q, dkv.block_k, dkv.num_stages) == (128, 32, 2)
    same = _statics(_resolve_tiles("t", {}), 64, scale=1.0, half=None, interpret=True)
    assert same.dq is None and same.dkv is None and same.backward_kernels() == (same, same)


def visited_key_blocks(seq: int, window: int | None, segment_ids=None, block: int = 64) -> int:
    segment_ids = np.ones((1, seq), np.int32) if segment_ids is None else segment_ids
    lo, hi = key_block_ranges(segment_ids, window, block, block)
    return int(np.sum(np.asarray(hi) - np.asarray(lo)))


def test_local_attention_work_grows_linearly():
    lengths = [1024, 2048, 4096, 8192]
    local = [visited_key_blocks(n, 128) for n in lengths]
    dense = [visited_key_blocks(n, None) for n in lengths]
    # Window 128 (|i - j| <= 64) with 64-token tiles: each query block needs itself and one neighbour per side.
    assert local == [3 * (n // 64) - 2 for n in lengths]
    for previous, current in zip(local, local[1:]):
        assert 1.95 < current / previous < 2.05  # linear in seq
    for previous, current in zip(dense, dense[1:]):
        assert current / previous == 4.0  # quadratic in seq


def test_packing_and_padding_skip_blocks():
    # Global attention over packed 128-token documents touches only each document's own blocks, and a query block
    # made only of padding touches none.
    seq = 1024
    seg = np.repeat(np.arange(1, seq // 128 + 1), 128)[None].astype(np.int32)
    assert visited_key_blocks(seq, None, seg) == (seq // 64) * 2
    seg[:, 512:] = 0
    lo, hi = key_block_ranges(seg, None, 64, 64)
    assert (np.asarray(hi - lo)[0, 8:] == 0).all() and (np.asarray(hi - lo)[0, :8] == 2).all()


@pytest.mark.parametrize("window", [None, 7, 40, 128])
@pytest.mark.parametrize("blocks", [(16, 16), (16, 32), (32, 16)])
def test_full_block_ranges_hold_exactly_the_fully_visible_tiles(window, blocks):
    """Against a brute force over every tile and token pair: [full_lo, full_hi) lies inside [lo, hi), holds only
    tiles whose every pair is visible (the kernels drop the mask there) and, for packed rows (non-decreasing ids,
    padding at the end), every such tile; a row whose ids come back keeps only masked tiles."""
    block_q, block_k = blocks
    rng = np.random.default_rng(window or 0)
    seq = 128
    rows = [np.sort(rng.integers(1, 4, seq)), np.ones(seq, int), np.repeat([1, 2], seq // 2)]
    rows[1][100:] = 0  # a padding tail
    rows.append(np.tile(np.repeat([1, 2], 16), seq // 32))  # ids that come back: documents split in pieces
    seg = np.stack(rows).astype(np.int32)
    lo, hi = key_block_ranges(seg, window, block_q, block_k)
    full_lo, full_hi = full_block_ranges(seg, window, block_q, block_k, lo)
    lo, hi, full_lo, full_hi = (np.asarray(x) for x in (lo, hi, full_lo, full_hi))
    positions = np.arange(seq)
    visible = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0)
    if window is not None:
        visible &= np.abs(positions[:, None] - positions[None, :]) <= window // 2
    for b in range(len(rows)):
        for i in range(seq // block_q):
            full = [visible[b, i * block_q:(i + 1) * block_q, j * block_k:(j + 1) * block_k].all()
                    for j in range(seq // block_k)]
            assert lo[b, i] <= full_lo[b, i] <= full_hi[b, i] <= hi[b, i]
            assert all(full[full_lo[b, i]:full_hi[b, i]])
            if b < 3:  # packed rows: the fully visible tiles are contiguous, so all of them are in the range
                assert sum(full) == full_hi[b, i] - full_lo[b, i]
    # The long single document of row 1 has fully visible tiles for every window above a tile's reach.
    assert (full_hi - full_lo)[1].sum() > 0 or (window or seq) // 2 < block_q + block_k - 1


def test_modernbert_logits_match_with_every_implementation():
    # Window 8 in the tiny preset; 40 tokens span several windows. Layer 0 is global, layers 1 and 2 local.
    config = get_config("modernbert-tiny")
    rng = np.random.default_rng(3)
    seq = 40
    ids = rng.integers(1, config.vocab_size, (2, seq)).astype(np.int32)
    seg = np.stack([np.r_[np.full(25, 1), np.full(10, 2), np.zeros(5)], np.ones(seq)]).astype(np.int32)
    params = init_params(EncoderForMaskedLM(config), jax.random.key(0))

    def logits(implementation):
        model = EncoderForMaskedLM(config.replace(attention_implementation=implementation, attention_interpret=True))
        return np.asarray(jax.jit(lambda p: model.apply({"params": p}, ids, segment_ids=seg).logits)(params))

    reference = logits("xla")
    valid = seg != 0
    for implementation in ("xla_blockwise", "xla_auto", "pallas_tpu", "pallas_gpu"):
        got = logits(implementation)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got[valid], reference[valid], atol=1e-4, rtol=1e-4, err_msg=implementation)


def test_pallas_shard_map_axes_follow_rules_and_divisibility():
    import flax.linen as nn
    from jax.sharding import AbstractMesh, AxisType

    from bertjax.ops.per_device import mesh_axes as _mesh_axes

    mesh = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    # No rules: the batch goes over as many mesh axes (in order) as divide it; nothing divides 3.
    assert _mesh_axes(mesh, "activation_batch", 8, default=mesh.axis_names) == ("data", "fsdp", "tensor")
    assert _mesh_axes(mesh, "activation_batch", 4, default=mesh.axis_names) == ("data", "fsdp")
    assert _mesh_axes(mesh, "activation_batch", 3, default=mesh.axis_names) is None
    with nn.logical_axis_rules([("activation_batch", ("data", "fsdp")), ("activation_heads", "tensor")]):
        batch_axes = _mesh_axes(mesh, "activation_batch", 8, default=mesh.axis_names)
        assert batch_axes == ("data", "fsdp")
        assert _mesh_axes(mesh, "activation_heads", 4, default=(), taken=batch_axes) == ("tensor",)
        assert _mesh_axes(mesh, "activation_heads", 3, default=(), taken=batch_axes) is None  # 3 kv heads
