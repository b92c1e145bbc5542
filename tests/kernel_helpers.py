"""Shared by the tests of kernels that never change a model's math (the norm and GLU kernels): the same model with
one implementation and another must give the same MLM loss and every parameter's gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import EncoderForMaskedLM, init_params


def assert_same_loss_and_gradients(config, **changes):
    """config and config.replace(**changes), same parameters, on two rows (one packed with two documents and
    padding): loss to 1e-6 relative, every gradient to 2e-6 absolute / 1e-4 relative."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, config.vocab_size, (2, 24)).astype(np.int32)
    segments = np.stack([np.r_[np.ones(15), np.full(6, 2), np.zeros(3)], np.ones(24)]).astype(np.int32)
    params = init_params(EncoderForMaskedLM(config), jax.random.key(0))

    def loss_and_grads(model_config):
        model = EncoderForMaskedLM(model_config)

        def loss(p):
            logits = model.apply({"params": p}, ids, segment_ids=segments).logits.astype(jnp.float32)
            return jnp.mean(jnp.where(segments[..., None] > 0, jax.nn.log_softmax(logits), 0.0))

        return jax.jit(jax.value_and_grad(loss))(params)

    loss_want, grads_want = loss_and_grads(config)
    loss_got, grads_got = loss_and_grads(config.replace(**changes))
    np.testing.assert_allclose(loss_got, loss_want, rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads_got), jax.tree.leaves(grads_want)):
        np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
