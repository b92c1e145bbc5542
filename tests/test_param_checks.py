"""The two checks every model load and save runs: the finiteness of a parameter tree (against numpy's own verdict)
and the parameter shapes traced from a model (kept per model config, never shared between callers or meshes)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import bertjax
from bertjax.models.params import _trace_shapes, abstract_params
from bertjax.train.guards import _all_finite_on_host, nonfinite_leaves


def _tree(rng):
    return {"a": {"kernel": rng.normal(size=(3, 4)).astype(np.float32), "steps": np.arange(4)},
            "b": jnp.asarray(rng.normal(size=(5,)), jnp.float32),
            "c": jnp.asarray(rng.normal(size=(2, 2)), jnp.bfloat16),
            "d": rng.normal(size=(6,)).astype(np.float16)}


def test_nonfinite_leaves_names_each_bad_array_wherever_it_lives():
    rng = np.random.default_rng(0)
    assert nonfinite_leaves(_tree(rng)) == []
    tree = _tree(rng)
    tree["a"]["kernel"][2, 3] = np.nan                      # numpy, the last element
    tree["c"] = tree["c"].at[0, 1].set(jnp.inf)             # a JAX array on the CPU device, bfloat16
    tree["d"][0] = -np.inf                                  # float16
    expected = sorted(path for path, leaf in [("a/kernel", tree["a"]["kernel"]), ("c", tree["c"]), ("d", tree["d"])]
                      if not np.isfinite(np.asarray(leaf).astype(np.float64)).all())
    assert nonfinite_leaves(tree) == expected == ["a/kernel", "c", "d"]


def test_host_check_reads_every_chunk():
    values = np.ones(10, ml_dtypes.bfloat16)
    assert _all_finite_on_host(values, chunk=3)
    for position in range(10):  # whichever chunk holds it, first, middle or the short last one
        bad = values.copy()
        bad[position] = np.nan
        assert not _all_finite_on_host(bad, chunk=3), position


def test_abstract_params_are_the_traced_shapes_and_each_caller_gets_its_own():
    model = bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny"))
    first = abstract_params(model)
    assert first == _trace_shapes(model, 8)
    first["encoder"].clear()  # a caller editing its copy
    again = abstract_params(bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny")))  # an equal model
    assert again == _trace_shapes(model, 8) and again["encoder"]
    other = abstract_params(bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny", num_layers=3)))
    assert "layers_2" in other["encoder"] and "layers_2" not in again["encoder"]


def test_abstract_params_under_a_mesh_carry_its_shardings():
    model = bertjax.EncoderModel(bertjax.get_config("bert-tiny"))
    plain = abstract_params(model)
    with jax.set_mesh(jax.make_mesh((1,), ("data",))):
        meshed = abstract_params(model)
    assert all(leaf.sharding is not None for leaf in jax.tree.leaves(meshed))
    assert all(getattr(leaf, "sharding", None) is None for leaf in jax.tree.leaves(abstract_params(model)))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), meshed) == jax.tree.map(lambda x: (x.shape, x.dtype), plain)


@pytest.mark.parametrize("name", ["adamw", "lamb", "stable_adamw"])
def test_a_skipped_update_keeps_the_state_but_the_schedule_moves_on(name):
    """train.nonfinite=skip kept the optimizer's counts too, and the schedule reads them: every later update ran at
    schedule(step - skipped) while the step, the logged learning rate and the phases moved on."""
    import jax.numpy as jnp
    import numpy as np
    import optax

    from bertjax.train.guards import keep_finite_update
    from bertjax.train.optimizers import OPTIMIZERS
    from bertjax.train.run_config import OptimizerConfig
    from bertjax.train.state import TrainState

    schedule = optax.linear_schedule(1e-2, 0.0, 10)
    optimizer = OPTIMIZERS[name](OptimizerConfig(name=name, learning_rate=1e-2), schedule, lambda p: {"w": True})
    params = {"w": jnp.ones(3)}
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params))

    def step(state, grad):
        updates, opt_state = optimizer.update({"w": grad}, state.opt_state, state.params)
        new = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state)
        loss = jnp.sum(grad)
        return keep_finite_update(state, new, {"loss": loss, "grad_norm": jnp.abs(loss)})[0]

    state = step(state, jnp.full(3, 0.5))
    skipped = step(state, jnp.full(3, jnp.nan))
    np.testing.assert_array_equal(skipped.params["w"], state.params["w"])  # nothing moved ...
    counts = [leaf for leaf in jax.tree.leaves(skipped.opt_state) if jnp.ndim(leaf) == 0]
    assert int(skipped.step) == 2 and counts and all(int(count) == 2 for count in counts)  # ... but the counts
    moments = [leaf for leaf in jax.tree.leaves(skipped.opt_state) if jnp.ndim(leaf) > 0]
    before = [leaf for leaf in jax.tree.leaves(state.opt_state) if jnp.ndim(leaf) > 0]
    assert all(np.array_equal(a, b) for a, b in zip(moments, before))
