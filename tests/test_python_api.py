"""The Python API as a notebook user or a serving engineer calls it (audit of the API, findings F1-F8): boxed
parameters saved as a model directory, `bertjax.checked` under outer transformations, dropout's key, errors that
name the argument, the inference compile cache."""

from __future__ import annotations

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.model_dirs import load_model_dir, save_model_dir


@pytest.fixture(scope="module")
def bert():
    model = bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny"))
    return model, bertjax.init_params(model, jax.random.key(0))


def test_save_model_dir_takes_boxed_params_and_loads_them_back(bert, tmp_path):
    model, _ = bert
    boxed = model.init(jax.random.key(1), jnp.zeros((1, 8), jnp.int32))["params"]  # LogicallyPartitioned leaves
    save_model_dir(tmp_path / "boxed", model, boxed)
    loaded_model, loaded, _ = load_model_dir(tmp_path / "boxed")
    assert loaded_model.config == model.config
    unboxed = jax.tree.leaves(nn.meta.unbox(boxed))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(loaded), unboxed))


def test_save_model_dir_refuses_another_models_params_before_writing(bert, tmp_path):
    model, params = bert
    wider = bertjax.EncoderForMaskedLM(model.config.replace(hidden_size=64, intermediate_size=128))
    with pytest.raises(ValueError, match=r"params/embeddings/norm/bias is \(32,\), the model's is \(64,\)"):
        save_model_dir(tmp_path / "wider", wider, params)
    missing = {**params, "mlm_head": {}}
    with pytest.raises(ValueError, match=r"params/mlm_head/\S+ is absent"):
        save_model_dir(tmp_path / "missing", model, missing)
    assert not os.path.exists(tmp_path / "wider") and not os.path.exists(tmp_path / "missing")
