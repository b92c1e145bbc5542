"""The family's norm (bertjax.ops.normalize, hand-written backward) against Flax's LayerNorm and RMSNorm."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from bertjax.models.common import Norm

CASES = [("layernorm with bias", True, True), ("layernorm", True, False), ("rmsnorm", False, False)]


def _flax(centered: bool, use_bias: bool, dtype) -> nn.Module:
    if centered:
        return nn.LayerNorm(epsilon=1e-5, use_bias=use_bias, dtype=dtype, use_fast_variance=False)
    return nn.RMSNorm(epsilon=1e-5, dtype=dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name,centered,use_bias", CASES, ids=[case[0] for case in CASES])
def test_matches_flax_forward_and_gradients(name, centered, use_bias, dtype):
    # Rows with an offset and a spread, so the mean and the variance both matter.
    x = (jax.random.normal(jax.random.key(0), (3, 5, 48)) * 3 + 1).astype(dtype)
    reference = _flax(centered, use_bias, dtype)
    params = reference.init(jax.random.key(1), x)
    params = jax.tree.map(lambda p: p + 0.3 * jax.random.normal(jax.random.key(2), p.shape), params)
    ours = Norm(1e-5, centered, use_bias, dtype, jnp.float32)
    chex.assert_trees_all_equal_structs(nn.unbox(ours.init(jax.random.key(1), x)), params)
    weights = jax.random.normal(jax.random.key(3), x.shape)

    def loss(module, params, x):
        return jnp.sum(module.apply(params, x).astype(jnp.float32) * weights)

    # Same float32 arithmetic in the forward: equal bit for bit.
    chex.assert_trees_all_equal(ours.apply(params, x), reference.apply(params, x))
    ours_grads = jax.grad(loss, argnums=(1, 2))(ours, params, x)
    reference_grads = jax.grad(loss, argnums=(1, 2))(reference, params, x)
    # The parameter gradients are float32 sums either way; the input gradient is rounded to x's dtype, so in
    # bfloat16 the two formulas may round to neighbouring values (one bf16 step at |dx| < 4 is 1/64).
    chex.assert_trees_all_close(ours_grads[0], reference_grads[0], atol=1e-5, rtol=1e-5)
    tolerance = 1e-5 if dtype == jnp.float32 else 2 ** -6
    chex.assert_trees_all_close(ours_grads[1].astype(jnp.float32), reference_grads[1].astype(jnp.float32),
                                atol=tolerance, rtol=tolerance)


def test_constant_row_has_finite_gradients():
    # A row with zero variance (a padding row of embeddings, say) normalises to the bias; eps keeps it finite.
    x = jnp.ones((2, 16), jnp.float32)
    module = Norm(1e-12, True, True, jnp.float32, jnp.float32)
    params = module.init(jax.random.key(0), x)
    grads = jax.grad(lambda p, x: jnp.sum(module.apply(p, x) * jnp.arange(16.0)), argnums=(0, 1))(params, x)
    chex.assert_tree_all_finite(grads)
