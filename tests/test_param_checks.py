"""The two checks every model load and save runs: the finiteness of a parameter tree (against numpy's own verdict)
and the parameter shapes traced from a model (kept per model config, never shared between callers or meshes)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

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
