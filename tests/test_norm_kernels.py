"""The residual add + norm kernel (bertjax/ops/pallas_gpu_norm.py) in interpret mode against XLA's add and
`bertjax.ops.normalize` (its own tests compare that with Flax's norms), and the models that use it.

Tolerances: float32 agrees to 1e-5 (the kernel sums rows in another order); bfloat16 to one or two bf16 ulps of
the outputs (2**-7 relative), since a different float32 sum can round the other way."""

from __future__ import annotations

import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_helpers import assert_same_loss_and_gradients

from bertjax.config import NormImplementation, get_config
from bertjax.ops import normalize as normalize_lib
from bertjax.ops.pallas_gpu_norm import add_normalize as kernel_add_normalize


def test_config_names_are_the_registry():
    assert set(typing.get_args(NormImplementation)) == set(normalize_lib.IMPLEMENTATIONS)
    with pytest.raises(ValueError, match="norm_implementation"):
        get_config("bert-tiny", norm_implementation="triton")
    with pytest.raises(ValueError, match="unknown; known"):
        normalize_lib.add_normalize(jnp.ones((2, 4)), None, jnp.ones(4), None, epsilon=1e-5, centered=True,
                                    dtype=jnp.float32, implementation="triton")


def operands(shape, dtype, seed=0):
    keys = jax.random.split(jax.random.key(seed), 6)
    x, delta, g_y, g_s = (jax.random.normal(k, shape, jnp.float32).astype(dtype) for k in keys[:4])
    features = shape[-1:]
    scale = 1 + 0.1 * jax.random.normal(keys[4], features)
    bias = 0.1 * jax.random.normal(keys[5], features)
    return x, delta, scale, bias, g_y, g_s


def outputs_and_grads(fn, x, delta, scale, bias, g_y, g_s):
    (s, y), vjp = jax.vjp(fn, x, delta, scale, bias)
    return jax.tree.map(lambda a: np.asarray(a, np.float32), ((s, y), vjp((g_s, g_y))))


@pytest.mark.parametrize("centered", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("with_delta", [True, False], ids=["add", "norm_only"])
def test_matches_xla_in_float32(centered, with_bias, with_delta):
    # 3 x 7 = 21 rows: the last block of 4 is part padding; 48 features: a row padded to 64 in registers.
    x, delta, scale, bias, g_y, g_s = operands((3, 7, 48), jnp.float32)
    delta, bias = (delta if with_delta else None), (bias if with_bias else None)
    settings = dict(epsilon=1e-5, centered=centered, dtype=jnp.float32)
    expected = outputs_and_grads(lambda *a: normalize_lib.add_normalize_xla(*a, **settings), x, delta, scale, bias,
                                 g_y, g_s)
    got = outputs_and_grads(lambda *a: kernel_add_normalize(*a, interpret=True, block_rows=4, **settings), x,
                            delta, scale, bias, g_y, g_s)
    assert jax.tree.structure(got) == jax.tree.structure(expected)  # None gradients where delta or bias is None
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_matches_xla_in_bfloat16_with_the_kernels_default_tiles():
    # 768 features (ModernBERT-base's width) pad to 1,024 and take 4 rows a program; 37 rows end mid-block.
    x, delta, scale, bias, g_y, g_s = operands((37, 768), jnp.bfloat16, seed=1)
    settings = dict(epsilon=1e-5, centered=True, dtype=jnp.bfloat16)
    expected = outputs_and_grads(lambda *a: normalize_lib.add_normalize_xla(*a, **settings), x, delta, scale, None,
                                 g_y, g_s)
    got = outputs_and_grads(lambda *a: kernel_add_normalize(*a, interpret=True, **settings), x, delta, scale, None,
                            g_y, g_s)
    (s, y), (dx, ddelta, dscale, _) = got
    (s_ref, y_ref), (dx_ref, _, dscale_ref, _) = expected
    np.testing.assert_array_equal(s, s_ref)  # the sum is one rounding of x + delta either way
    np.testing.assert_allclose(y, y_ref, atol=2 ** -6, rtol=2 ** -7)
    # XLA rounds the norm's dx to bfloat16 and then adds g_s; the kernel adds in float32 and rounds once.
    np.testing.assert_allclose(dx, dx_ref, atol=2 ** -5, rtol=2 ** -6)
    np.testing.assert_array_equal(dx, ddelta)
    np.testing.assert_allclose(dscale, dscale_ref, rtol=1e-4, atol=1e-3)  # float32 sums over 37 rows


def test_refuses_mismatched_operands():
    x, delta, scale, _, _, _ = operands((4, 16), jnp.float32)
    settings = dict(epsilon=1e-5, centered=True, dtype=jnp.float32, interpret=True)
    with pytest.raises(ValueError, match="shape and dtype of x"):
        kernel_add_normalize(x, delta.astype(jnp.bfloat16), scale, None, **settings)
    with pytest.raises(ValueError, match="scale and bias"):
        kernel_add_normalize(x, delta, scale[:8], None, **settings)
    with pytest.raises(ValueError, match="power of two"):
        kernel_add_normalize(x, delta, scale, None, block_rows=3, **settings)


@pytest.mark.parametrize("preset", ["modernbert-tiny", "bert-tiny", "eurobert-tiny"])
def test_models_match_with_the_kernel_in_every_norm(preset):
    """Pre-norm (ModernBERT: the MLP output handed to the next layer's norm, a final norm; EuroBERT: the same with
    RMSNorm) and post-norm (BERT: norms with bias after each residual add): the MLM loss and every parameter's
    gradient agree with XLA's norms. (Every other family's tiny preset agreed to 4e-9 when checked by hand.)"""
    assert_same_loss_and_gradients(get_config(preset, norm_implementation="xla", norm_interpret=True),
                                   norm_implementation="pallas_gpu")


def test_the_gpu_benchmark_runs_its_path_on_cpu(capsys):
    """bench/norm_bench.py as a lease runs it, in interpret mode on a tiny shape: a row per implementation and the
    ratio lines (CPU timings of interpret mode mean nothing; the path is what is checked)."""
    from bench import norm_bench

    norm_bench.main(["--rows", "16", "--features", "32", "--dry-run", "--repeats", "1", "--min-seconds", "0"])
    out = capsys.readouterr().out
    assert "| xla | default | " in out and "| pallas_gpu | default | " in out and "failed" not in out
    assert "# forward+backward: the kernel at its defaults runs " in out
