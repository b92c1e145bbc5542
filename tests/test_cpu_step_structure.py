"""The CPU training step's structure (issue 17): the residual stream stored once per layer, fused projections.

`materialise` stores the pre-norm residual stream once per layer on CPU and changes no number. The regression it
guards against is structural: without a stored residual stream, XLA's CPU fusion recomputes the sum of every
earlier layer's output inside each consumer, so the widest fusion of a pre-norm training step grows with depth.
The test counts fusion operands in the compiled step, with `materialise` and with it replaced by the
identity, on the same tiny deep model.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.models import common, layer

# A narrow, deep pre-norm model: depth is what makes the unstored chain long, width only makes it slow.
DEEP_PRE_NORM = dict(num_layers=8)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_materialise_is_the_identity_bit_for_bit_with_identity_gradient(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 16)) * 10.0 ** rng.integers(-30, 30, (3, 5, 16))
    x[0, 0, :2] = [0.0, -0.0]
    x = jnp.asarray(x, dtype)
    stored = jax.jit(common.materialise)(x)
    np.testing.assert_array_equal(np.asarray(stored).view(np.uint8), np.asarray(x).view(np.uint8))
    # The one documented exception: XLA's CPU division flushes subnormals (below 1.2e-38) to zero.
    subnormal = jnp.asarray([np.finfo(np.float32).tiny / 4], dtype)
    assert float(jax.jit(common.materialise)(subnormal)[0]) in (0.0, float(subnormal[0]))
    cotangent = jnp.asarray(rng.standard_normal(x.shape), dtype)
    _, vjp = jax.vjp(common.materialise, x)
    np.testing.assert_array_equal(np.asarray(vjp(cotangent)[0]), np.asarray(cotangent))


def _widest_fusion(config) -> int:
    """The largest operand count of any fusion in the compiled CPU forward+backward of an MLM loss."""
    model = bertjax.EncoderForMaskedLM(config)
    params = bertjax.init_params(model, jax.random.key(0))
    ids = jnp.ones((2, 16), jnp.int32)

    def loss(p, ids):
        return model.apply({"params": p}, ids).logits.astype(jnp.float32).mean()

    hlo = jax.jit(jax.grad(loss)).lower(params, ids).compile().as_text()
    return max(args.count(",") + 1 for args in re.findall(r"= \S+ fusion\((.*?)\), kind=", hlo))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the duplication is a property of XLA's CPU fusion")
def test_pre_norm_residual_stream_is_stored_once_per_layer(monkeypatch):
    config = bertjax.get_config("modernbert-tiny", **DEEP_PRE_NORM)
    stored = _widest_fusion(config)
    monkeypatch.setattr(layer, "materialise", lambda x: x)
    recomputed = _widest_fusion(config)
    # Measured: 12 with the stored stream; 157 when each consumer recomputes the sum of the earlier layers'
    # outputs (300+ for ModernBERT-base's 22 layers). The stored width does not grow with depth.
    assert stored <= 16, stored
    assert recomputed > 4 * stored, (stored, recomputed)


@pytest.mark.parametrize("rows", [4, 64])  # below and above the stacking threshold (3 x 8 = 24 output features)
def test_project_equals_separate_matmuls_stacked_or_not(rows):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, 6)).astype(np.float32)
    weights = [(rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32))
               for _ in range(3)]
    outputs = common.project(jnp.asarray(x), [(jnp.asarray(k), jnp.asarray(b)) for k, b in weights], 1, jnp.float32)
    for out, (kernel, bias) in zip(outputs, weights):
        np.testing.assert_allclose(np.asarray(out), x @ kernel + bias, rtol=1e-5, atol=1e-5)
