"""The Pallas GPU kernels compiled by Triton on a real GPU, at model sizes, against the dense XLA reference (and the
norm and GLU kernels against XLA's).

Skipped without a GPU (CI has none). The interpret-mode tests (test_attention_kernels.py, test_attention_features.py,
test_deberta_pallas_gpu.py) check the kernels' logic on CPU with tiny tiles; this file checks what only a GPU can:
Triton's compilation at the default tiles and warps, the padded head dimension, memory indexing at real lengths.

    JAX_PLATFORMS=cuda python3 -m pytest -q tests/test_gpu_kernels.py

Inputs are fresh random normals (never zeros: they hide unwritten outputs). The reference is the dense XLA
attention on the same inputs upcast to float32 with full-precision matmuls; the error is the relative Frobenius norm
‖got − ref‖ / ‖ref‖ over real (non-padding) tokens, for the output and the gradients of a random linear function of
the output. Bounds: float32 inputs 2e-3 (Triton may run float32 dots on tensor cores at tf32, about 3e-4),
bfloat16 inputs 2e-2 (bf16 operands land between 1e-3 and 1e-2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (JAX_PLATFORMS=cuda)")

from bertjax import ops  # noqa: E402
from bertjax.config import alibi_slopes, get_config  # noqa: E402

BOUND = {jnp.float32: 2e-3, jnp.bfloat16: 2e-2}


def relative_error(got, want, real) -> float:
    got, want = (np.asarray(jnp.asarray(x, jnp.float32))[real] for x in (got, want))
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def packed_segments(batch: int, seq: int, rng) -> np.ndarray:
    """Row 0: six documents of random lengths (one of a single token), then 37 padding tokens; other rows: one
    document filling the row."""
    segments = np.ones((batch, seq), np.int32)
    cuts = np.sort(rng.choice(np.arange(2, seq - 40), 4, replace=False))
    bounds = [0, cuts[0], cuts[0] + 1, *cuts[1:], seq - 37]  # cuts[0] is the one-token document
    segments[0] = 0
    for doc, (start, end) in enumerate(zip(bounds[:-1], bounds[1:]), start=1):
        segments[0, start:end] = doc
    return segments


# (name, batch, seq, heads, kv_heads, head_dim, window, dtype, alibi, global tokens); seqs not a tile multiple.
CASES = [
    ("global_bf16", 2, 1000, 12, 12, 64, None, jnp.bfloat16, False, False),
    ("local128_bf16", 2, 2050, 12, 12, 64, 128, jnp.bfloat16, False, False),
    ("global_f32_gqa", 2, 777, 8, 2, 128, None, jnp.float32, False, False),
    ("local_f32_dim96", 1, 1500, 4, 4, 96, 256, jnp.float32, False, False),
    ("alibi_bf16", 2, 1024, 12, 12, 64, None, jnp.bfloat16, True, False),
    ("global_tokens_bf16", 2, 1100, 12, 12, 64, 256, jnp.bfloat16, False, True),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_norm_kernel_matches_xla_forward_and_gradients(dtype):
    """The residual add + norm kernel (pallas_gpu_norm) at ModernBERT-base's width with a row count that ends
    mid-block, against XLA's add and norm on the same inputs in float32; gradients of a random linear function of
    both outputs (the sum and the norm), the scale's included. First in the file: the kernel is new (a lease's
    check stage may stop before the end)."""
    from bertjax.ops.normalize import add_normalize

    rng = np.random.default_rng(5)
    rows, features = 4099, 768
    x, delta, g_s, g_y = (jnp.asarray(rng.standard_normal((rows, features)), dtype) for _ in range(4))
    scale = jnp.asarray(1 + 0.1 * rng.standard_normal(features), jnp.float32)
    bias = jnp.asarray(0.1 * rng.standard_normal(features), jnp.float32)

    def value_and_grads(implementation, x, delta):
        def loss(x, delta, scale, bias):
            s, y = add_normalize(x, delta, scale, bias, epsilon=1e-5, centered=True, dtype=x.dtype,
                                 implementation=implementation)
            return jnp.sum(s.astype(jnp.float32) * g_s) + jnp.sum(y.astype(jnp.float32) * g_y), y
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(x, delta, scale, bias)

    (_, y), grads = value_and_grads("pallas_gpu", x, delta)
    (_, want), want_grads = value_and_grads("xla", x.astype(jnp.float32), delta.astype(jnp.float32))
    everything = np.ones((rows,), bool)
    errors = {"y": relative_error(y, want, everything)}
    for name, got, ref in zip(("dx", "ddelta", "dscale", "dbias"), grads, want_grads):
        errors[name] = relative_error(got, ref, everything if got.ndim == 2 else slice(None))
    assert max(errors.values()) < BOUND[dtype], errors


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_glu_kernel_matches_xla_forward_and_gradient(activation):
    """The gated MLP's kernel (pallas_gpu_glu) at ModernBERT-base's width (1,152, 9 tiles across) with a row count
    that ends mid-tile, bf16, against XLA's GLU in float32 on the same inputs; the gradient of a random linear
    function of the output. Early in the file: the kernel is new."""
    from bertjax.ops.glu import glu

    rng = np.random.default_rng(6)
    rows, features = 4099, 1152
    y = jnp.asarray(3 * rng.standard_normal((rows, 2, features)), jnp.bfloat16)
    g = jnp.asarray(rng.standard_normal((rows, features)), jnp.float32)

    def value_and_grad(implementation, y):
        loss = lambda y: (jnp.sum(glu(y, activation, implementation=implementation).astype(jnp.float32) * g),
                          glu(y, activation, implementation=implementation))
        return jax.jit(jax.value_and_grad(loss, has_aux=True))(y)

    (_, out), grad = value_and_grad("pallas_gpu", y)
    (_, want), want_grad = value_and_grad("xla", y.astype(jnp.float32))
    everything = np.ones((rows,), bool)
    errors = {"h": relative_error(out, want, everything), "dy": relative_error(grad, want_grad, everything)}
    assert max(errors.values()) < BOUND[jnp.bfloat16], errors


@pytest.mark.parametrize("backward_kernel", ["triton", "triton_atomic"], ids=["pallas_gpu", "pallas_gpu_atomic"])
@pytest.mark.parametrize("window", [None, 128], ids=["global", "local128"])
def test_stacked_qkv_attention_matches_dense_forward_and_gradient(window, backward_kernel):
    """Attention on the stacked q/k/v projection (pallas_gpu_rope_attention: v read from the stack, the stack's
    gradient written by the dq and dk/dv kernels with RoPE's backward, or by the one-pass kernel and XLA) at
    ModernBERT-base's heads in bfloat16, packed documents with per-document positions, against RoPE and dense XLA
    attention in float32."""
    from bertjax.ops.pallas_gpu_attention import pallas_gpu_rope_attention

    rng = np.random.default_rng(7)
    batch, seq, heads, dim = 2, 1000, 12, 64
    qkv = jnp.asarray(rng.standard_normal((batch, seq, 3, heads, dim)), jnp.bfloat16)
    segments = packed_segments(batch, seq, rng)
    real = segments != 0
    positions = np.zeros((batch, seq), np.int32)
    for row in range(batch):  # positions restart at each document, as packed pretraining rows have them
        starts = np.r_[0, np.flatnonzero(np.diff(segments[row])) + 1]
        for start, end in zip(starts, np.r_[starts[1:], seq]):
            positions[row, start:end] = np.arange(end - start)
    weight = jnp.asarray(rng.standard_normal((batch, seq, heads, dim)) * real[..., None, None], jnp.float32)

    def value_and_grad(fn, qkv):
        def loss(qkv):
            out = fn(qkv)
            return jnp.sum(out.astype(jnp.float32) * weight), out
        return jax.jit(jax.value_and_grad(loss, has_aux=True))(qkv)

    def split(qkv):
        q, k, v = (part.squeeze(2) for part in jnp.split(qkv, 3, axis=2))
        q, k = ops.apply_rope(q, positions, 10_000.0), ops.apply_rope(k, positions, 10_000.0)
        return ops.attention(q, k, v, segment_ids=segments, local_window=window, implementation="xla")

    (_, out), grad = value_and_grad(lambda y: pallas_gpu_rope_attention(
        y, positions, 10_000.0, segment_ids=segments, local_window=window, scale=dim ** -0.5,
        backward_kernel=backward_kernel), qkv)
    with jax.default_matmul_precision("highest"):
        (_, want), want_grad = value_and_grad(split, qkv.astype(jnp.float32))
    errors = {"out": relative_error(out, want, real)}
    for slot, name in enumerate("qkv"):
        errors[f"d{name}"] = relative_error(grad[:, :, slot], want_grad[:, :, slot], np.ones(real.shape, bool))
    assert max(errors.values()) < BOUND[jnp.bfloat16], errors


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_pallas_gpu_matches_dense_forward_and_gradients(case):
    assert_matches_dense(case, "pallas_gpu")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_pallas_gpu_atomic_matches_dense_forward_and_gradients(case):
    """The one-pass backward (dq added across programs with relaxed atomics) on the card: the atomics' sum and
    their addressing at real lengths, which interpret mode runs one program at a time."""
    assert_matches_dense(case, "pallas_gpu_atomic")


# The Mosaic GPU kernels (bfloat16, no ALiBi; sm_90 and later): forward, dq and dk/dv.
MOSAIC_CASES = [case for case in CASES if case[7] == jnp.bfloat16 and not case[8]]


@pytest.mark.parametrize("case", MOSAIC_CASES, ids=[c[0] for c in MOSAIC_CASES])
def test_pallas_gpu_mosaic_matches_dense_forward_and_gradients(case):
    if float(jax.devices()[0].compute_capability) < 9.0:
        pytest.skip("the Mosaic GPU kernels use Hopper's TMA and wgmma")
    assert_matches_dense(case, "pallas_gpu_mosaic")


def assert_matches_dense(case, implementation: str):
    _, batch, seq, heads, kv_heads, dim, window, dtype, alibi, glob = case
    rng = np.random.default_rng(abs(hash(case[0])) % 2**32)
    q = jnp.asarray(rng.standard_normal((batch, seq, heads, dim)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((batch, seq, kv_heads, dim)), dtype) for _ in range(2))
    segments = packed_segments(batch, seq, rng)
    real = segments != 0
    weight = jnp.asarray(rng.standard_normal((batch, seq, heads, dim)) * real[..., None, None], jnp.float32)
    slopes = jnp.asarray(alibi_slopes(heads), jnp.float32) if alibi else None
    global_tokens = None
    if glob:
        global_tokens = np.zeros((batch, seq), bool)
        global_tokens[:, [0, 5, seq // 2]] = True

    def value_and_grads(implementation, q, k, v):
        def loss(q, k, v):
            out = ops.attention(q, k, v, segment_ids=segments, local_window=window, implementation=implementation,
                                alibi_slopes=slopes, global_tokens=global_tokens)
            return jnp.sum(out.astype(jnp.float32) * weight), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, out), grads = value_and_grads(implementation, q, k, v)
    with jax.default_matmul_precision("highest"):
        (_, want), want_grads = value_and_grads("xla", *(x.astype(jnp.float32) for x in (q, k, v)))
    assert out.dtype == dtype
    assert np.isfinite(np.asarray(out, np.float32)).all()
    errors = {"out": relative_error(out, want, real)}
    for name, got, ref in zip("qkv", grads, want_grads):
        errors[f"d{name}"] = relative_error(got, ref, real if name == "q" else np.ones(real.shape, bool))
    assert max(errors.values()) < BOUND[dtype], errors


def test_modernbert_masked_lm_logits_match_xla_on_gpu():
    from bertjax.models import EncoderForMaskedLM, init_params

    config = get_config("modernbert-base", num_layers=4, dtype="bfloat16")
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(5, config.vocab_size, (2, 1024)), jnp.int32)
    logits = {}
    for implementation in ("pallas_gpu", "xla"):
        model = EncoderForMaskedLM(config.replace(attention_implementation=implementation))
        params = init_params(model, jax.random.key(0))
        logits[implementation] = jax.jit(model.apply)({"params": params}, ids).logits
    error = relative_error(logits["pallas_gpu"], logits["xla"], np.ones((2, 1024), bool))
    assert error < 2e-2, error


def test_deberta_disentangled_kernel_matches_dense_on_gpu():
    from bertjax.ops import disentangled_attention as da

    rng = np.random.default_rng(2)
    batch, seq, heads, dim, span = 2, 700, 12, 64, 256
    q, k, v = (jnp.asarray(rng.standard_normal((batch, seq, heads, dim)), jnp.bfloat16) for _ in range(3))
    pos_key, pos_query = (jnp.asarray(rng.standard_normal((2 * span, heads, dim)), jnp.bfloat16) for _ in range(2))
    segments = np.ones((batch, seq), np.int32)
    segments[0, 300:], segments[1, 650:] = 2, 0
    real = segments != 0
    weight = jnp.asarray(rng.standard_normal((batch, seq, heads, dim)) * real[..., None, None], jnp.float32)

    def value_and_grads(implementation, *args):
        def loss(*args):
            out = da.disentangled_attention(*args, segment_ids=segments, span=span, buckets=span, max_position=512,
                                            implementation=implementation)
            return jnp.sum(out.astype(jnp.float32) * weight), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))(*args)

    args = (q, k, v, pos_key, pos_query)
    (_, out), grads = value_and_grads("pallas_gpu", *args)
    with jax.default_matmul_precision("highest"):
        (_, want), want_grads = value_and_grads("dense", *(x.astype(jnp.float32) for x in args))
    errors = {"out": relative_error(out, want, real)}
    everything = lambda x: np.ones(np.shape(x), bool)
    for name, got, ref in zip(("dq", "dk", "dv", "dpos_key", "dpos_query"), grads, want_grads):
        errors[name] = relative_error(got, ref, real if name == "dq" else everything(ref))
    assert max(errors.values()) < BOUND[jnp.bfloat16], errors
