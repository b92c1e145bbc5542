"""The gated MLP's act(a) * b kernel (bertjax/ops/pallas_gpu_glu.py) in interpret mode against XLA's
(`bertjax.ops.glu.glu_xla`, jax.nn's activations) and a float64 numpy GELU built on math.erf, and the models that
use it.

Tolerances: float32 to 2e-6 relative to the largest value (the kernel's erf is Abramowitz and Stegun's 7.1.26,
absolute error under 1.5e-7; the other activations differ by float32 rounding), 2e-5 for the tanh GELU's gradient
(its cubic argument, rounded in another order, moves tanh near +-1 where 1 - tanh^2 cancels: 8e-6 seen); bfloat16
to one bf16 ulp (2**-7 relative) of the largest value, since the kernel rounds once where XLA may round after each
operation."""

from __future__ import annotations

import math
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_helpers import assert_same_loss_and_gradients

from bertjax.config import GluImplementation, get_config
from bertjax.ops import glu as glu_lib
from bertjax.ops.activations import ACTIVATIONS
from bertjax.ops.pallas_gpu_glu import RULES


def test_config_names_are_the_registry_and_every_activation_has_a_kernel_rule():
    assert set(typing.get_args(GluImplementation)) == set(glu_lib.IMPLEMENTATIONS)
    assert set(RULES) == set(ACTIVATIONS)
    assert get_config("modernbert-tiny", glu_implementation="pallas_gpu").glu_implementation == "pallas_gpu"
    with pytest.raises(ValueError, match="glu_implementation='pallas_gpu' needs mlp='glu'"):
        get_config("bert-tiny", glu_implementation="pallas_gpu")
    with pytest.raises(ValueError, match="unknown; known"):
        glu_lib.glu(jnp.ones((4, 2, 8)), "gelu", implementation="triton")
    with pytest.raises(ValueError, match=r"\[\.\.\., 2, features\]"):
        glu_lib.glu(jnp.ones((4, 3, 8)), "gelu")


def operands(shape, dtype, seed=0):
    """y [..., 2, features] spread over +-9 (GELU's erf tails and its middle), h's cotangent [..., features]."""
    y_key, g_key = jax.random.split(jax.random.key(seed))
    y = 3 * jax.random.normal(y_key, shape, jnp.float32)
    g = jax.random.normal(g_key, shape[:-2] + shape[-1:], jnp.float32)
    return y.astype(dtype), g.astype(dtype)


def value_and_grad(implementation, activation, y, g):
    fn = lambda y: glu_lib.glu(y, activation, implementation=implementation, interpret=True)

    @jax.jit  # one compiled program, not op-by-op dispatch
    def run(y, g):
        out, pullback = jax.vjp(fn, y)
        return out, pullback(g)[0]

    return run(y, g)


def assert_close(got, want, relative):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, atol=relative * np.max(np.abs(want)), rtol=0)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_kernel_matches_xla_in_float32(activation):
    """Rows (3 x 37) and features (200) that are not multiples of the 32 x 128 tiles: masked edges."""
    y, g = operands((3, 37, 2, 200), jnp.float32)
    out, grad = value_and_grad("pallas_gpu", activation, y, g)
    want_out, want_grad = value_and_grad("xla", activation, y, g)
    assert out.shape == (3, 37, 200) and grad.shape == y.shape
    assert_close(out, want_out, 2e-6)
    assert_close(grad, want_grad, 2e-5 if activation == "gelu_tanh" else 2e-6)


def test_gelu_matches_a_float64_reference():
    """Exact GELU from math.erf in float64, and its derivative Phi(a) + a phi(a), independent of XLA's erf."""
    y, g = operands((64, 2, 96), jnp.float32, seed=1)
    a, b = np.asarray(y, np.float64)[:, 0], np.asarray(y, np.float64)[:, 1]
    cdf = 0.5 * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))
    pdf = np.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    g64 = np.asarray(g, np.float64)
    out, grad = value_and_grad("pallas_gpu", "gelu", y, g)
    assert_close(out, a * cdf * b, 1e-6)
    assert_close(grad[:, 0], g64 * b * (cdf + a * pdf), 1e-6)
    assert_close(grad[:, 1], g64 * a * cdf, 1e-6)


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_kernel_matches_xla_in_bfloat16(activation):
    y, g = operands((2, 40, 2, 136), jnp.bfloat16, seed=2)
    out, grad = value_and_grad("pallas_gpu", activation, y, g)
    want_out, want_grad = value_and_grad("xla", activation, y, g)
    assert out.dtype == jnp.bfloat16 and grad.dtype == jnp.bfloat16
    assert_close(out, want_out, 2 ** -7)
    assert_close(grad, want_grad, 2 ** -7)


def test_kernel_rejects_tiles_that_are_not_powers_of_two():
    from bertjax.ops.pallas_gpu_glu import glu

    with pytest.raises(ValueError, match="block_cols must be a power of two, got 96"):
        glu(jnp.ones((4, 2, 8)), "gelu", interpret=True, block_cols=96)


@pytest.mark.parametrize("preset", ["modernbert-tiny", "eurobert-tiny"])
def test_models_match_with_the_kernel_in_every_mlp(preset):
    """GeGLU (ModernBERT) and SwiGLU (EuroBERT, no biases, grouped-query attention): the MLM loss and every
    parameter's gradient agree with XLA's GLU."""
    assert_same_loss_and_gradients(get_config(preset, glu_implementation="xla", glu_interpret=True),
                                   glu_implementation="pallas_gpu")
