"""The CPU training step's structure (issue 17): the residual stream computed once per layer, fused projections.

XLA's CPU fusion copies cheap elementwise producers into every consumer. A pre-norm stack's residual stream is a
chain of adds (x_{i+1} = x_i + f(norm(x_i))), and with autodiff's LayerNorm backward each norm's backward and each
transposed copy recomputed the sum of every earlier layer's output: fusions with 300 operands over ModernBERT-base's
22 layers, two thirds of its CPU step (docs/benchmarks.md). The family's norm (bertjax.ops.normalize) saves each
row's statistics and has its own backward, whose consumers of the stream XLA does not duplicate into. The test
guards the property: the widest fusion of a pre-norm training step does not grow with depth.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.models import abstract_params, common

# A narrow, deep pre-norm model: depth is what makes the unstored chain long, width only makes it slow.
DEEP_PRE_NORM = dict(num_layers=8)


def _widest_fusion(config) -> int:
    """The largest operand count of any fusion in the compiled CPU forward+backward of an MLM loss."""
    model = bertjax.EncoderForMaskedLM(config)
    params = abstract_params(model)  # shapes only: lowering needs no values
    ids = jnp.ones((2, 16), jnp.int32)

    def loss(p, ids):
        return model.apply({"params": p}, ids).logits.astype(jnp.float32).mean()

    hlo = jax.jit(jax.grad(loss)).lower(params, ids).compile().as_text()
    return max(args.count(",") + 1 for args in re.findall(r"= \S+ fusion\((.*?)\), kind=", hlo))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the duplication is a property of XLA's CPU fusion")
def test_pre_norm_residual_stream_is_not_recomputed_by_later_layers():
    shallow = _widest_fusion(bertjax.get_config("modernbert-tiny", num_layers=2))
    deep = _widest_fusion(bertjax.get_config("modernbert-tiny", **DEEP_PRE_NORM))
    # Measured under the suite's XLA flags: 15 at 2, 8 and 22 layers. With autodiff's norm backward (and no stored
    # stream) it was 52, 181 and 475: each consumer summing the earlier layers' outputs again.
    assert deep <= shallow + 2 and deep <= 20, (shallow, deep)


@pytest.mark.parametrize("rows", [4, 64])  # below and above the stacking threshold (3 x 8 = 24 output features)
def test_project_equals_separate_matmuls_stacked_or_not(rows):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, 6)).astype(np.float32)
    weights = [(rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32))
               for _ in range(3)]
    outputs = common.project(jnp.asarray(x), [(jnp.asarray(k), jnp.asarray(b)) for k, b in weights], 1, jnp.float32)
    for out, (kernel, bias) in zip(outputs, weights):
        np.testing.assert_allclose(np.asarray(out), x @ kernel + bias, rtol=1e-5, atol=1e-5)
