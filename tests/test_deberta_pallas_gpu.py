"""The Pallas GPU disentangled-attention kernel (bertjax.ops.pallas_gpu_disentangled), run in interpret mode on CPU
against the dense XLA reference (`implementation="dense"`): forward and gradients with respect to q, k, v and both
position projections, for each subset of relative terms, log buckets that clamp, packing and padding, a length that
is not a block multiple and bfloat16; how "auto" and an explicit request select it; and that all three kernels
lower to Triton for CUDA (jax.export on this CPU machine; compiling the Triton IR needs a GPU).

Shapes are tiny (seq <= 64, blocks of 16) so each case compiles once in a few seconds.
"""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.config import get_config
from bertjax.models import EncoderForMaskedLM, init_params
from bertjax.ops import disentangled_attention as da
from gpu_export_helpers import export_for_cuda, triton_kernels

BATCH, HEADS, DIM, SPAN = 2, 2, 8, 8  # buckets = SPAN = 8 resolve distances up to MAX_POSITION = 20 < seq
MAX_POSITION = 20


def inputs(seq: int, dtype, seed: int = 0, span: int = SPAN):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((BATCH, seq, HEADS, DIM)), dtype) for _ in range(3))
    pos_key, pos_query = (jnp.asarray(rng.standard_normal((2 * span, HEADS, DIM)), dtype) for _ in range(2))
    seg = np.ones((BATCH, seq), np.int32)
    seg[0, seq // 2:] = 2  # two packed documents
    seg[1, seq - 7:] = 0  # padding at the end
    return (q, k, v, pos_key, pos_query), jnp.asarray(seg)


def value_and_grads(implementation, args, seg, terms, buckets, max_position=MAX_POSITION, block_size=16):
    """Output and d/d(q, k, v, pos_key, pos_query) of sum(out * w) over real tokens, w a fixed random weight."""
    seq = seg.shape[1]
    w = jnp.asarray(np.random.default_rng(9).standard_normal((BATCH, seq, HEADS, DIM)), jnp.float32)

    def loss(q, k, v, pos_key, pos_query):
        out = da.disentangled_attention(
            q, k, v, pos_key if "c2p" in terms else None, pos_query if "p2c" in terms else None, segment_ids=seg,
            span=args[3].shape[0] // 2, buckets=buckets, max_position=max_position, implementation=implementation,
            block_size=block_size, interpret=True)
        return jnp.sum(jnp.where(seg[..., None, None] > 0, out.astype(jnp.float32), 0.0) * w), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))(*args)
    return np.asarray(out.astype(jnp.float32)), [np.asarray(g.astype(jnp.float32)) for g in grads]


# (case, terms, seq, buckets, dtype, atol, span, max_position): seq 45 is not a multiple of the block (16), 64 is;
# buckets 0 = plain clamping at SPAN; 64 buckets reaching only 34 step by up to 31 rows per distance, so a tile's
# 31 distances reach 64 rows (the kernel widens its band). float32 runs full-precision matmuls in the kernel, so it
# matches to float32 rounding; bfloat16 inputs multiply in bfloat16 on both sides, but in a different order (online
# softmax, per-block sums).
CASES = [
    ("both-float32-unaligned", ("c2p", "p2c"), 45, SPAN, jnp.float32, 2e-5),
    ("c2p-only", ("c2p",), 45, SPAN, jnp.float32, 2e-5),
    ("p2c-only-aligned", ("p2c",), 64, SPAN, jnp.float32, 2e-5),
    ("both-clamped-no-log-buckets", ("c2p", "p2c"), 45, 0, jnp.float32, 2e-5),
    ("both-bfloat16", ("c2p", "p2c"), 45, SPAN, jnp.bfloat16, 6e-2),
    ("content-only", (), 45, SPAN, jnp.float32, 2e-5),  # pos_att_type empty: plain flash attention
    ("both-steep-log-buckets", ("c2p", "p2c"), 64, 64, jnp.float32, 2e-5, 64, 34),
]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_kernel_matches_dense_reference_forward_and_gradients(case):
    _, terms, seq, buckets, dtype, atol, *layout = case
    span, max_position = layout or (SPAN, MAX_POSITION)
    args, seg = inputs(seq, dtype, span=span)
    ref_out, ref_grads = value_and_grads("dense", args, seg, terms, buckets, max_position)
    out, grads = value_and_grads("pallas_gpu", args, seg, terms, buckets, max_position)
    real = np.asarray(seg) > 0
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[real], ref_out[real], atol=atol, rtol=atol)
    assert np.all(out[~real] == 0)  # padding rows: nothing visible, output 0
    names = ["q", "k", "v", "pos_key", "pos_query"]
    for name, got, want in zip(names, grads, ref_grads):
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, atol=atol * scale, rtol=atol, err_msg=name)
    # A term that is off gets no gradient on either side.
    for name, term in (("pos_key", "c2p"), ("pos_query", "p2c")):
        if term not in terms:
            assert not np.any(grads[names.index(name)]), name


def test_wide_tables_backward_uses_smaller_tiles_and_matches():
    """The backward kernels take 16-row tiles (BACKWARD_BLOCK: fewer registers than the forward's 32), and relative
    tables 2048 wide (span 1024) keep 16 within shared memory (which grows with tile x width:
    pallas_gpu_disentangled.BACKWARD_TILE_AREA); the gradients match the dense reference there. A table 4096 wide
    has no tile that fits: its gradient is a clear error, its forward still runs."""
    from bertjax.ops.pallas_gpu_disentangled import backward_tile

    assert [backward_tile(32, width) for width in (16, 512, 1024, 2048, 4096)] == [16, 16, 16, 16, 0]
    args, seg = inputs(64, jnp.float32, span=1024)
    ref_out, ref_grads = value_and_grads("dense", args, seg, ("c2p", "p2c"), 1024, 2048)
    out, grads = value_and_grads("pallas_gpu", args, seg, ("c2p", "p2c"), 1024, 2048, block_size=32)
    real = np.asarray(seg) > 0
    np.testing.assert_allclose(out[real], ref_out[real], atol=2e-5, rtol=2e-5)
    for name, got, want in zip(["q", "k", "v", "pos_key", "pos_query"], grads, ref_grads):
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, atol=2e-5 * scale, rtol=2e-5, err_msg=name)

    wide, seg = inputs(32, jnp.float32, span=2048)

    def loss(*a):
        return jnp.sum(da.disentangled_attention(*a, segment_ids=seg, span=2048, buckets=2048, max_position=4096,
                                                 implementation="pallas_gpu", block_size=32, interpret=True))

    assert np.isfinite(float(jax.jit(loss)(*wide)))
    with pytest.raises(ValueError, match="implementation='blockwise'"):
        jax.grad(loss)(*wide)


def test_buckets_really_clamp_and_step_in_these_cases():
    """The cases above are only meaningful if distances of 45 tokens hit the log range and the last bucket, and the
    steep case's rows really outrun its distances."""
    from bertjax.ops.pallas_gpu_disentangled import _row_band

    table = da.relative_index(45, 45, SPAN, SPAN, MAX_POSITION)
    assert table.min() == 0 and table.max() == 2 * SPAN - 1
    assert len(np.unique(table)) < len(table)  # several distances share a bucket: the gradients really scatter-add
    steep = da.relative_index(64, 64, 64, 64, 34)
    assert np.diff(steep).max() > 1 and _row_band(steep, 31) == 64 > 31


def test_auto_picks_the_kernel_on_gpu_only_and_explicit_requests_are_checked():
    assert da.resolve_implementation("auto", 512, 128, platform="gpu") == "pallas_gpu"
    assert da.resolve_implementation("auto", 512, 128, platform="cpu") == "dense"
    assert da.resolve_implementation("auto", 1024, 128, platform="cpu") == "blockwise"
    assert da.resolve_implementation("auto", 1024, 128, platform="tpu") == "blockwise"
    assert da.resolve_implementation("pallas_gpu", 64, 128, platform="cpu") == "pallas_gpu"
    with pytest.raises(ValueError, match="pallas_gpux"):
        da.resolve_implementation("pallas_gpux", 64, 128)
    args, seg = inputs(32, jnp.float32)
    with pytest.raises(ValueError, match="block_size"):
        da.disentangled_attention(*args, segment_ids=seg, span=SPAN, buckets=SPAN, max_position=MAX_POSITION,
                                  implementation="pallas_gpu", block_size=24, interpret=True)


def test_model_with_pallas_gpu_matches_the_dense_model():
    """The config knob reaches the kernel: a 1-layer DeBERTa-v3 (buckets that clamp at 40 tokens) gives the same
    logits with implementation="pallas_gpu" (interpret mode) as with "dense"."""
    base = get_config("deberta-v3-base").replace(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                                 vocab_size=97, max_position_embeddings=64, dropout_rate=0.0)
    base = base.replace(disentangled=base.disentangled.replace(position_buckets=8, max_relative_positions=20,
                                                               block_size=16))
    rng = np.random.default_rng(3)
    ids = rng.integers(1, base.vocab_size, (2, 40)).astype(np.int32)
    seg = np.stack([np.r_[np.full(25, 1), np.full(10, 2), np.zeros(5)], np.ones(40)]).astype(np.int32)
    params = init_params(EncoderForMaskedLM(base), jax.random.key(0))

    def logits(implementation):
        config = base.replace(disentangled=base.disentangled.replace(implementation=implementation),
                              attention_interpret=True)
        model = EncoderForMaskedLM(config)
        return np.asarray(jax.jit(lambda p: model.apply({"params": p}, ids, segment_ids=seg).logits)(params))

    valid = seg != 0
    np.testing.assert_allclose(logits("pallas_gpu")[valid], logits("dense")[valid], atol=1e-4, rtol=1e-4)


def test_kernels_lower_to_triton_for_cuda():
    """deberta-v3-base's attention shapes (64-wide heads, 256 buckets = a 512-row table, bfloat16): the forward
    and both backward kernels lower to Triton IR for CUDA from this CPU machine (no GPU needed to lower)."""
    seq, span = 128, 256
    q = jax.ShapeDtypeStruct((1, seq, 2, 64), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((2 * span, 2, 64), jnp.bfloat16)
    seg = jnp.ones((1, seq), jnp.int32)

    def loss(q, k, v, pos_key, pos_query):
        out = da.disentangled_attention(q, k, v, pos_key, pos_query, segment_ids=seg, span=span, buckets=256,
                                        max_position=512, implementation="pallas_gpu")
        return jnp.sum(out.astype(jnp.float32))

    exported = export_for_cuda(jax.grad(loss, argnums=(0, 1, 2, 3, 4)), q, q, q, pos, pos)
    assert triton_kernels(exported) == ["bertjax_disentangled_dkv", "bertjax_disentangled_dq",
                                        "bertjax_disentangled_forward"]


def _shapes(jaxpr):
    """Every value shape in a jaxpr, sub-jaxprs (custom_vjp rules, pallas kernel bodies, loops) included."""
    for eqn in jaxpr.eqns:
        for var in (*eqn.invars, *eqn.outvars):
            if hasattr(var.aval, "shape"):
                yield tuple(var.aval.shape)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _shapes(sub)


def test_no_seq_by_seq_value_forward_or_backward():
    """The whole value-and-gradient program of the kernel path (traced for GPU, not interpreted) holds no value with
    two sequence-long axes; the dense reference does (so the check can see one)."""
    seq = 256
    args, seg = inputs(seq, jnp.float32)

    def program(implementation):
        def loss(*a):
            out = da.disentangled_attention(*a, segment_ids=seg, span=SPAN, buckets=SPAN, max_position=MAX_POSITION,
                                            implementation=implementation, block_size=32)
            return jnp.sum(out)
        return jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))(*args).jaxpr

    quadratic = lambda jaxpr: [s for s in _shapes(jaxpr) if sum(d >= seq for d in s) >= 2]
    assert quadratic(program("dense"))
    assert not quadratic(program("pallas_gpu"))
