"""A fine-tuning or embedder run's first state: the pretrained parameters where they fit, the rest drawn."""

from __future__ import annotations

import subprocess
import sys

import jax
import numpy as np
import optax
from flax import traverse_util

import bertjax
from bertjax.models import MODEL_CLASSES
from bertjax.train import mesh as mesh_lib
from bertjax.train.run_config import MeshConfig
from bertjax.train.state import boxed_initialiser, create_train_state, place, start_or_resume, transplant

# (data, fsdp, tensor) meshes the 4-device run checks, as `python tests/test_train_state.py` in a fresh interpreter
MESHES = ((1, 4, 1), (2, 1, 2), (1, 2, 2))


def check_head_only_start(mesh_shape: tuple[int, int, int]) -> None:
    """start_or_resume's state equals the whole initialiser's with the pretrained parameters put in: every value,
    and every leaf on the same sharding."""
    config = bertjax.get_config("bert-tiny", task=bertjax.TaskConfig(num_labels=3))
    model = MODEL_CLASSES["sequence_classification"](config)
    pretrained = bertjax.init_params(MODEL_CLASSES["masked_lm"](config), jax.random.key(7))
    optimizer = optax.adamw(1e-3)
    mesh = mesh_lib.build_mesh(MeshConfig(*mesh_shape))

    state, _, accumulated, fresh = start_or_resume(model, optimizer, mesh, None, 0, 3, pretrained)

    whole, shardings = create_train_state(boxed_initialiser(model), optimizer, mesh, 3)
    params, expected_fresh = transplant(whole.params, pretrained)
    expected = whole.replace(params=place(params, shardings.params))
    assert fresh == expected_fresh and fresh and all(path.startswith("classifier") for path in fresh)
    assert accumulated == {"loss_sum": 0.0, "count": 0.0} and int(state.step) == 0
    ours, theirs = (traverse_util.flatten_dict(s.params) for s in (state, expected))
    assert ours.keys() == theirs.keys()
    for path in ours:
        np.testing.assert_array_equal(np.asarray(ours[path]), np.asarray(theirs[path]), err_msg="/".join(path))
        assert ours[path].sharding.is_equivalent_to(theirs[path].sharding, ours[path].ndim), path
    assert jax.tree.structure(state.opt_state) == jax.tree.structure(expected.opt_state)
    for a, b in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(expected.opt_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)


def test_a_new_head_is_drawn_alone_with_the_values_the_whole_initialiser_gives_it():
    check_head_only_start((1, 1, 1))


def test_and_on_the_shards_of_a_mesh():
    from train_helpers import REPO, cpu_env

    run = subprocess.run([sys.executable, __file__], env=cpu_env(devices=4), cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr[-3000:]


if __name__ == "__main__":
    assert jax.device_count() == 4, jax.devices()
    for shape in MESHES:
        check_head_only_start(shape)
    print("ok")
