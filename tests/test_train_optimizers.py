"""Optimizers against independent references: StableAdamW vs a plain numpy implementation of the algorithm,
AdamW vs optax's own adamw, LAMB's trust ratio, and the weight-decay mask."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.train.optimizers import OPTIMIZERS, build_optimizer, decay_mask, stable_adamw
from bertjax.train.run_config import OptimizerConfig

PARAMS = {
    "dense": {"kernel": np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4),
              "bias": np.array([0.5, -0.25, 0.1, 0.0], np.float32)},
    "norm": {"scale": np.array([1.0, 0.9, 1.1], np.float32)},
    "embed": {"embedding": np.arange(6, dtype=np.float32).reshape(2, 3) / 7.0},
}


def _grads(step: int):
    rng = np.random.default_rng(step)
    # Gradients of very different scales across steps, so the update clipping of StableAdamW engages.
    scale = 50.0 if step == 3 else 1.0
    return jax.tree.map(lambda p: (scale * rng.normal(size=p.shape)).astype(np.float32), PARAMS)


def _numpy_stable_adamw(params, grads_per_step, lr_of_step, lr_max, b1, b2, eps, wd, decays):
    """StableAdamW written out per tensor in float64."""
    params = {k: {n: v.astype(np.float64) for n, v in d.items()} for k, d in params.items()}
    m = {k: {n: np.zeros_like(v) for n, v in d.items()} for k, d in params.items()}
    v = {k: {n: np.zeros_like(x) for n, x in d.items()} for k, d in params.items()}
    for t, grads in enumerate(grads_per_step, start=1):
        lr = lr_of_step(t - 1)
        for k in params:
            for n in params[k]:
                g = grads[k][n].astype(np.float64)
                m[k][n] = b1 * m[k][n] + (1 - b1) * g
                v[k][n] = b2 * v[k][n] + (1 - b2) * g * g
                m_hat = m[k][n] / (1 - b1**t)
                v_hat = v[k][n] / (1 - b2**t)
                rms = np.sqrt(np.mean(g * g / np.maximum(v_hat, eps * eps)))
                lr_t = lr / max(1.0, rms)
                p = params[k][n]
                new = p - lr_t * m_hat / (np.sqrt(v_hat) + eps)
                if decays[k][n]:
                    new = new - wd * (lr_t / lr_max) * p
                params[k][n] = new
    return params


def _run(optimizer, grads_per_step, params=PARAMS):
    params = jax.tree.map(jnp.asarray, params)
    state = optimizer.init(params)
    update = jax.jit(optimizer.update)
    for grads in grads_per_step:
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


def test_stable_adamw_matches_numpy_over_several_steps():
    grads = [_grads(t) for t in range(6)]
    lr_of_step = lambda step: 1e-2 * min(1.0, (step + 1) / 3)  # a warmup, so lr_t / lr_max varies
    decays = decay_mask(PARAMS)
    optimizer = stable_adamw(lambda step: 1e-2 * jnp.minimum(1.0, (step + 1) / 3), b1=0.9, b2=0.98, eps=1e-6,
                             weight_decay=0.1, mask=lambda p: decay_mask(p), max_learning_rate=1e-2)
    got = _run(optimizer, grads)
    want = _numpy_stable_adamw(PARAMS, grads, lr_of_step, 1e-2, 0.9, 0.98, 1e-6, 0.1, decays)
    for k in PARAMS:
        for n in PARAMS[k]:
            np.testing.assert_allclose(np.asarray(got[k][n]), want[k][n], rtol=1e-5, atol=1e-7,
                                       err_msg=f"{k}/{n}")


def test_stable_adamw_update_clipping_bounds_a_gradient_spike():
    # Three small gradients, then a 1000x spike: g^2 / v_hat > 1, so the learning rate of this tensor is divided
    # by rms = sqrt(mean(g^2 / v_hat)) (values worked out by hand from the moment recursions).
    params = {"w": jnp.ones((4,))}
    optimizer = stable_adamw(1.0, weight_decay=0.0)
    state = optimizer.init(params)
    update = jax.jit(optimizer.update)  # one compile for the four calls, not op by op
    for _ in range(3):
        _, state = update({"w": jnp.full((4,), 1e-3)}, state, params)
    updates, _ = update({"w": jnp.full((4,), 1.0)}, state, params)
    g, v = 1.0, 0.98 * (1 - 0.98**3) / (1 - 0.98**4) * 1e-6 + (1 - 0.98) / (1 - 0.98**4) * 1.0
    rms = np.sqrt(g * g / v)
    assert rms > 1.0
    m_hat = (0.9 * (1 - 0.9**3) * 1e-3 + 0.1 * 1.0) / (1 - 0.9**4)
    np.testing.assert_allclose(np.asarray(updates["w"]), -m_hat / (np.sqrt(v) + 1e-6) / rms, rtol=1e-4)


def test_adamw_matches_optax_reference_with_mask_and_clipping():
    config = OptimizerConfig(name="adamw", learning_rate=1e-2, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.05,
                             clip_global_norm=1.0)
    schedule = optax.linear_schedule(0.0, 1e-2, 4)
    mine = build_optimizer(config, schedule)
    mask = {"dense": {"kernel": True, "bias": False}, "norm": {"scale": False}, "embed": {"embedding": True}}
    reference = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.05, mask=mask))
    grads = [_grads(t) for t in range(5)]
    got, want = _run(mine, grads), _run(reference, grads)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8), got, want)


def test_weight_decay_mask_excludes_norms_and_biases():
    mask = decay_mask({"encoder": {"layers_0": {"attention": {"query": {"kernel": 0, "bias": 0}},
                                                "mlp_norm": {"scale": 0, "bias": 0}}},
                       "mlm_head": {"decoder_bias": 0, "norm": {"scale": 0}, "dense": {"kernel": 0}},
                       "embeddings": {"word_embeddings": {"embedding": 0}}})
    assert mask["encoder"]["layers_0"]["attention"]["query"] == {"kernel": True, "bias": False}
    assert mask["encoder"]["layers_0"]["mlp_norm"] == {"scale": False, "bias": False}
    assert mask["mlm_head"] == {"decoder_bias": False, "norm": {"scale": False}, "dense": {"kernel": True}}
    assert mask["embeddings"]["word_embeddings"]["embedding"] is True


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_decay_only_touches_masked_in_parameters(name):
    # With zero gradients the moments stay zero, so any change is weight decay; excluded tensors never move.
    config = OptimizerConfig(name=name, learning_rate=0.1, weight_decay=0.5)
    params = _run(build_optimizer(config, 0.1), [jax.tree.map(np.zeros_like, PARAMS)] * 2)
    np.testing.assert_array_equal(params["dense"]["bias"], PARAMS["dense"]["bias"])
    np.testing.assert_array_equal(params["norm"]["scale"], PARAMS["norm"]["scale"])
    assert np.all(np.abs(params["dense"]["kernel"]) < np.abs(PARAMS["dense"]["kernel"]) + 1e-9)
    assert not np.allclose(params["dense"]["kernel"], PARAMS["dense"]["kernel"])


def test_lamb_trust_ratio_on_decayed_tensors_only_as_bert_and_albert_trained():
    """LAMB scales each decayed tensor's Adam direction r = u + wd * p by ||p|| / ||r||, so its update has norm
    lr * ||p||; biases and norms, which get no weight decay, are left out of the trust ratio too (ALBERT's and
    BERT's `exclude_from_layer_adaptation`): their update is Adam's, -lr * u. A numpy first step, in float64."""
    lr, wd, eps = 0.01, 0.01, 1e-6
    config = OptimizerConfig(name="lamb", learning_rate=lr, weight_decay=wd, b2=0.999, eps=eps)
    optimizer = build_optimizer(config, lr)
    params = jax.tree.map(jnp.asarray, PARAMS)
    state = jax.jit(optimizer.init)(params)
    grads = _grads(0)
    updates, _ = jax.jit(optimizer.update)(grads, state, params)  # one compile, not op by op
    decays = decay_mask(PARAMS)
    for k in PARAMS:
        for n in PARAMS[k]:
            p, g = PARAMS[k][n].astype(np.float64), grads[k][n].astype(np.float64)
            u = g / (np.abs(g) + eps)  # Adam's bias-corrected first step
            if decays[k][n]:
                r = u + wd * p
                expected = -lr * np.linalg.norm(p) / np.linalg.norm(r) * r
            else:
                expected = -lr * u
            np.testing.assert_allclose(updates[k][n], expected, rtol=1e-4, atol=1e-9, err_msg=f"{k}/{n}")
    assert not decays["dense"]["bias"] and decays["dense"]["kernel"]  # both kinds are exercised
    # The state is optax.lamb's, node for node: a run's LAMB checkpoints from before this exclusion still restore.
    assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(
        optax.lamb(lr, weight_decay=wd, mask=decay_mask).init(params))


def test_unknown_optimizer_is_a_clear_error():
    with pytest.raises(ValueError, match="optimizer.name.*sgdx"):
        build_optimizer(OptimizerConfig(name="sgdx"), 0.1)
