"""A fine-tuning or embedder run's first state: the pretrained parameters where they fit, the rest drawn."""

from __future__ import annotations

import jax
import numpy as np
import optax
from flax import traverse_util

import bertjax
from bertjax.models import MODEL_CLASSES
from bertjax.train import mesh as mesh_lib
from bertjax.train.run_config import MeshConfig
from bertjax.train.state import boxed_initialiser, create_train_state, place, start_or_resume, transplant


def test_a_new_head_is_drawn_alone_with_the_values_the_whole_initialiser_gives_it():
    config = bertjax.get_config("bert-tiny", task=bertjax.TaskConfig(num_labels=3))
    model = MODEL_CLASSES["sequence_classification"](config)
    encoder = MODEL_CLASSES["masked_lm"](config)
    pretrained = bertjax.init_params(encoder, jax.random.key(7))
    optimizer = optax.adamw(1e-3)
    mesh = mesh_lib.build_mesh(MeshConfig())

    state, _, accumulated, fresh = start_or_resume(model, optimizer, mesh, None, 0, 3, pretrained)

    # The reference: every parameter drawn, then the pretrained ones put in their place.
    whole, shardings = create_train_state(boxed_initialiser(model), optimizer, mesh, 3)
    params, expected_fresh = transplant(whole.params, pretrained)
    expected = whole.replace(params=place(params, shardings.params))
    assert fresh == expected_fresh and fresh and all(path.startswith("classifier") for path in fresh)
    assert accumulated == {"loss_sum": 0.0, "count": 0.0}
    flat, reference = (traverse_util.flatten_dict(jax.device_get(s.params)) for s in (state, expected))
    assert flat.keys() == reference.keys()
    for path in flat:
        np.testing.assert_array_equal(flat[path], reference[path], err_msg="/".join(path))
    assert jax.tree.structure(state.opt_state) == jax.tree.structure(expected.opt_state)
    for ours, theirs in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(expected.opt_state)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert int(state.step) == 0
