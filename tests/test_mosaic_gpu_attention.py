"""The Pallas Mosaic GPU kernels (bertjax/ops/mosaic_gpu_attention.py: forward; mosaic_gpu_attention_backward.py: dq
and dk/dv) on CPU, in JAX's Mosaic GPU interpret mode, which simulates their TMA copies, barriers and wgmma
products: against the dense XLA reference (outputs, numpy's log-sum-exp, gradients) and the Triton kernels they
stand in for (the same residuals and gradients, so either backward reads either forward's).

Interpret mode runs these kernels from JAX 0.11 (the GPU machines' version; 0.10's cannot simulate a transposed
shared-memory operand), so the numerical tests skip under older JAX, CI's among them (JAX 0.11 needs Python 3.12);
the refusals run everywhere. Compiling the
kernel for an H100 is tests/test_gpu_aot.py's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import ops
from bertjax.ops import mosaic_gpu_attention as mosaic
from bertjax.ops.mosaic_gpu_attention_backward import backward as mosaic_backward
from bertjax.ops.pallas_gpu_attention import _Static, _triton_backward, _triton_forward, pallas_gpu_attention
from bertjax.ops.xla_attention import dense_attention

INTERPRETS = tuple(int(part) for part in jax.__version__.split(".")[:2]) >= mosaic.INTERPRET_FROM_JAX
needs_interpret = pytest.mark.skipif(
    not INTERPRETS,
    reason=f"JAX's Mosaic GPU interpret mode runs these kernels from JAX 0.11 (this is {jax.__version__})")


@pytest.mark.skipif(INTERPRETS, reason="this JAX interprets the kernels")
def test_interpret_mode_on_an_older_jax_is_an_error_naming_the_settings():
    q, k, v, segments = inputs(seq=128)
    with pytest.raises(ValueError, match=r"attention_interpret=True\) from JAX 0.11; this is .*'pallas_gpu'"):
        ops.attention(q, k, v, segment_ids=segments, implementation="pallas_gpu_mosaic", interpret=True)


def inputs(seq=256, heads=4, kv_heads=2, head_dim=64, seed=0):
    """bfloat16 q, k, v; row 0 packs documents of 100, 1 and 99 tokens then padding, row 1 is one document."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((2, seq, heads, head_dim)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((2, seq, kv_heads, head_dim)), jnp.bfloat16) for _ in range(2))
    segments = np.ones((2, seq), np.int32)
    segments[0, 100], segments[0, 101:200], segments[0, 200:] = 2, 3, 0
    return q, k, v, jnp.asarray(segments)


def natural_lse(q, k, segments, window, scale):
    """float32 numpy log-sum-exp [batch, heads, seq] of the visible scores (0 where a row sees nothing)."""
    q, k = np.asarray(q, np.float32), np.asarray(k, np.float32)
    k = np.repeat(k, q.shape[2] // k.shape[2], axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    seg = np.asarray(segments)
    visible = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0)
    if window is not None:
        pos = np.arange(seg.shape[1])
        visible &= np.abs(pos[:, None] - pos[None, :]) <= window // 2
    s = np.where(visible[:, None], s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    total = np.sum(np.exp(s - safe), axis=-1)
    return np.where(total > 0, np.log(np.where(total > 0, total, 1.0)) + safe[..., 0], 0.0)


@needs_interpret
@pytest.mark.parametrize("window, block_q, block_k, num_stages", [(None, 64, 64, 2), (64, 64, 64, 3),
                                                                  (None, 64, 128, 2), (None, 128, 64, 2),
                                                                  (64, 128, 128, 3)])
def test_forward_matches_dense_attention_and_its_log_sum_exp(window, block_q, block_k, num_stages):
    """Packed documents (one of a single token), padding, GQA 2, several key blocks with block skipping, one
    warpgroup (block_q 64) or two consumers and a producer (128); bfloat16 inputs against float32 dense attention
    on the same (rounded) inputs: 2e-2 on outputs of size ~1, 1e-3 relative on the log-sum-exp."""
    q, k, v, segments = inputs()
    out, lse = jax.jit(lambda q, k, v, s: mosaic.mosaic_forward(
        q, k, v, s, scale=0.125, half=None if window is None else window // 2, block_k=block_k,
        num_stages=num_stages, interpret=True, block_q=block_q))(q, k, v, segments)
    want = dense_attention(*(x.astype(jnp.float32) for x in (q, k, v)), segment_ids=segments,
                           local_window=window, scale=0.125)
    real = np.asarray(segments) != 0
    np.testing.assert_allclose(np.asarray(out, np.float32)[real], np.asarray(want)[real], atol=2e-2)
    assert not np.asarray(out, np.float32)[~real].any()  # padding rows: zeros, as the Triton forward writes
    np.testing.assert_allclose(np.asarray(lse), natural_lse(q, k, segments, window, 0.125), rtol=1e-3, atol=1e-3)


@needs_interpret
def test_forward_gives_the_triton_forwards_residuals():
    """Same _Static, same inputs: the Mosaic and Triton forwards agree on output and log-sum-exp, which is all the
    backward reads from a forward."""
    q, k, v, segments = inputs(heads=2, kv_heads=1)
    st = _Static(scale=0.125, half=48, block_q=64, block_k=64, interpret=True, num_warps=4, num_stages=2)
    slopes = jnp.zeros((16,), jnp.float32)
    out_m, lse_m = jax.jit(lambda *a: mosaic.forward(*a, st))(q, k, v, segments, slopes)
    out_t, lse_t = jax.jit(lambda *a: _triton_forward(*a, st))(q, k, v, segments, slopes)
    np.testing.assert_allclose(np.asarray(out_m, np.float32), np.asarray(out_t, np.float32), atol=1e-2)
    np.testing.assert_allclose(np.asarray(lse_m), np.asarray(lse_t), rtol=1e-4, atol=1e-4)


@needs_interpret
def test_two_warpgroup_forward_gives_the_one_warpgroup_result_exactly():
    """The two consumer warpgroups (block_q 128) compute each 64-row tile as the one-warpgroup kernel does, only
    sharing the key and value tiles: the same output and log-sum-exp, bit for bit."""
    q, k, v, segments = inputs()
    run = jax.jit(lambda q, k, v, s, block_q: mosaic.mosaic_forward(
        q, k, v, s, scale=0.125, half=32, block_k=64, num_stages=2, interpret=True, block_q=block_q),
        static_argnums=4)
    (out_2, lse_2), (out_1, lse_1) = run(q, k, v, segments, 128), run(q, k, v, segments, 64)
    np.testing.assert_array_equal(np.asarray(out_2, np.float32), np.asarray(out_1, np.float32))
    np.testing.assert_array_equal(np.asarray(lse_2), np.asarray(lse_1))


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@needs_interpret
@pytest.mark.parametrize("window, dq_block, dkv_block, num_stages", [(None, 64, 64, 2), (64, 128, 64, 3),
                                                                     (None, 64, 128, 2)])
def test_backward_matches_dense_gradients(window, dq_block, dkv_block, num_stages):
    """dq, dk and dv from the Mosaic kernels (on the Mosaic forward's residuals) against the vjp of float32 dense
    attention on the same bfloat16 inputs, with GQA 2 (the dk/dv kernel walks both query heads of its kv head):
    relative Frobenius error under 5e-3 (bfloat16 rounding of p and ds lands near 2.4e-3; a 2% error in one
    gradient fails it)."""
    q, k, v, segments = inputs()
    real = np.asarray(segments) != 0
    do = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape) * real[..., None, None], jnp.bfloat16)
    st = _Static(scale=0.125, half=None if window is None else window // 2, block_q=64, block_k=64, interpret=True,
                 num_warps=4, num_stages=num_stages,
                 dq=_Static(scale=0.125, half=None if window is None else window // 2, block_q=64, block_k=dq_block,
                            interpret=True, num_warps=4, num_stages=num_stages),
                 dkv=_Static(scale=0.125, half=None if window is None else window // 2, block_q=dkv_block, block_k=64,
                             interpret=True, num_warps=4, num_stages=num_stages))
    slopes = jnp.zeros((16,), jnp.float32)

    @jax.jit
    def grads(q, k, v, segments, do):
        out, lse = mosaic.forward(q, k, v, segments, slopes, st)
        return mosaic_backward(q, k, v, segments, slopes, out, lse, do, st)

    got = grads(q, k, v, segments, do)
    _, vjp = jax.vjp(lambda q, k, v: dense_attention(q, k, v, segment_ids=segments, local_window=window, scale=0.125),
                     *(x.astype(jnp.float32) for x in (q, k, v)))
    errors = {name: relative_error(g, w) for name, g, w in zip("qkv", got, vjp(do.astype(jnp.float32)))}
    assert max(errors.values()) < 5e-3, errors


@needs_interpret
def test_backward_gives_the_triton_backwards_gradients_with_a_log_sum_exp_cotangent():
    """Same residuals, same _Static, a log-sum-exp cotangent (what the global-token merge sends back): the Mosaic and
    Triton backward kernels agree to 1e-4 relative (measured: 7e-6 and below; both round p and ds to bfloat16 the
    same way)."""
    q, k, v, segments = inputs(heads=2, kv_heads=1)
    rng = np.random.default_rng(2)
    do = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16)
    dlse = jnp.asarray(rng.standard_normal((2, 2, 256)), jnp.float32)
    st = _Static(scale=0.125, half=48, block_q=64, block_k=64, interpret=True, num_warps=4, num_stages=2)
    slopes = jnp.zeros((16,), jnp.float32)
    out, lse = jax.jit(lambda *a: _triton_forward(*a, st))(q, k, v, segments, slopes)
    got = jax.jit(lambda *a: mosaic_backward(*a, st, dlse=dlse))(q, k, v, segments, slopes, out, lse, do)
    want = jax.jit(lambda *a: _triton_backward(*a, st, dlse=dlse))(q, k, v, segments, slopes, out, lse, do)
    errors = {name: relative_error(g, w) for name, g, w in zip("qkv", got, want)}
    assert max(errors.values()) < 1e-4, errors


@needs_interpret
def test_registry_name_runs_forward_and_gradients_like_pallas_gpu():
    """"pallas_gpu_mosaic" (every kernel Mosaic GPU) through the attention entry point: a head_dim of 32 (padded to
    64), a sequence of 200 (padded to 256), a window with global tokens (merged through the forward's log-sum-exp,
    whose cotangent the backward takes); outputs and dq/dk/dv against pallas_gpu's Triton kernels."""
    q, k, v, segments = inputs(seq=200, head_dim=32)
    glob = np.zeros((2, 200), bool)
    glob[0, [5, 150]] = glob[1, 120] = True
    real = np.asarray(segments) != 0

    def run(implementation):
        def loss(q, k, v):
            out = ops.attention(q, k, v, segment_ids=segments, local_window=64, implementation=implementation,
                                global_tokens=glob, max_global_tokens=2, interpret=True)
            return jnp.sum(jnp.where(real[..., None, None], out.astype(jnp.float32), 0.0) ** 2), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, out), grads = run("pallas_gpu_mosaic")
    (_, want), want_grads = run("pallas_gpu")
    np.testing.assert_allclose(np.asarray(out, np.float32)[real], np.asarray(want, np.float32)[real], atol=1e-2)
    for got, expected in zip(grads, want_grads):
        got, expected = np.asarray(got, np.float32), np.asarray(expected, np.float32)
        np.testing.assert_allclose(got, expected, atol=2e-2 * np.abs(expected).max())


@pytest.mark.parametrize("kernel, arguments, message", [
    ("forward", dict(dtype=jnp.float32), "forward multiplies bfloat16 or float16"),
    ("forward", dict(held=256), "holds 64 or 128 rows .* got block_q 256"),
    ("dq", dict(held=128), "holds 64 rows .* got backward_block_q 128"),
    ("dkv", dict(held=128), "holds 64 rows .* got dkv_block_k 128"),
    ("dkv", dict(block=96), "dkv_block_q must be 64, 128"),
    ("dq", dict(num_warps=8), "one warpgroup \\(backward_num_warps 4\\)"),
    ("forward", dict(alibi=True), "no ALiBi"),
    ("forward", dict(padded_head_dim=256, block=256, num_stages=3), "of shared memory"),
    ("dkv", dict(padded_head_dim=128, block=128, num_stages=3), "dk/dv kernel's tiles need 262,208 B"),
])
def test_what_the_kernels_cannot_compute_is_refused_by_name(kernel, arguments, message):
    supported = dict(dtype=jnp.bfloat16, padded_head_dim=64, alibi=False, held=64, block=64)
    mosaic.check_supported("here", kernel, **supported)  # the defaults are fine
    with pytest.raises(ValueError, match=message):
        mosaic.check_supported("here", kernel, **{**supported, **arguments})


def test_refusals_come_before_tracing_through_the_public_functions():
    x = jnp.zeros((1, 64, 2, 64), jnp.float32)
    segments = jnp.ones((1, 64), jnp.int32)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        ops.attention(x, x, x, segment_ids=segments, implementation="pallas_gpu_mosaic", interpret=True)
    with pytest.raises(ValueError, match="forward_kernel must be one of"):
        pallas_gpu_attention(x, x, x, segment_ids=segments, local_window=None, scale=1.0, forward_kernel="cuda")
    with pytest.raises(ValueError, match="backward_kernel must be one of"):
        pallas_gpu_attention(x, x, x, segment_ids=segments, local_window=None, scale=1.0, backward_kernel="cuda")
    with pytest.raises(ValueError, match="got dkv_block_k 128"):
        pallas_gpu_attention(x.astype(jnp.bfloat16), x, x, segment_ids=segments, local_window=None, scale=1.0,
                             backward_kernel="mosaic", dkv_block_k=128)
    with pytest.raises(ValueError, match="does not support alibi"):
        ops.attention(x, x, x, implementation="pallas_gpu_mosaic", alibi_slopes=np.ones(2, np.float32))


@needs_interpret
def test_two_warpgroup_forward_with_the_mosaic_backward_through_pallas_gpu_attention():
    """block_q 128 (two consumer warpgroups) for the forward with the backward kernels at their 64 held rows, GQA 2,
    a window, 200 tokens (padded to 256): outputs and gradients match the Triton kernels'; without the backward
    tiles the dq kernel would inherit 128 held rows, which is refused by name."""
    q, k, v, segments = inputs(seq=200)
    real = np.asarray(segments) != 0

    def run(**options):
        def loss(q, k, v):
            out = pallas_gpu_attention(q, k, v, segment_ids=segments, local_window=64, scale=0.125, interpret=True,
                                       **options)
            return jnp.sum(jnp.where(real[..., None, None], out.astype(jnp.float32), 0.0) ** 2), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, out), grads = run(forward_kernel="mosaic", backward_kernel="mosaic", block_q=128, backward_block_q=64,
                          dkv_block_k=64)
    (_, want), want_grads = run()
    np.testing.assert_allclose(np.asarray(out, np.float32)[real], np.asarray(want, np.float32)[real], atol=1e-2)
    for got, expected in zip(grads, want_grads):
        assert relative_error(got, expected) < 5e-3
    with pytest.raises(ValueError, match="got backward_block_q 128"):
        run(forward_kernel="mosaic", backward_kernel="mosaic", block_q=128)
