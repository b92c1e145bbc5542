"""`bertjax init-from`: a larger model grown from a trained smaller one (ModernBERT-large from ModernBERT-base):
every weight centre-tiled (checked against numpy's wrap padding), layers mapped proportionally in depth, the result
a model directory that runs and that `model.init_from` reads unchanged."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import traverse_util

from bertjax.config import get_config
from bertjax.train.init_from import centre_tile, layer_map

SOURCE = dict(hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48, max_position_embeddings=64)
TARGET = dict(hidden_size=48, num_layers=5, num_heads=6, intermediate_size=80, max_position_embeddings=64)


def wrap_reference(source: np.ndarray, shape) -> np.ndarray:
    """Centre tiling by numpy: pad each axis by (new - old) // 2 before and the rest after, wrapping around."""
    widths = [((new - old) // 2, new - old - (new - old) // 2) for old, new in zip(source.shape, shape)]
    return np.pad(source, widths, mode="wrap")


@pytest.mark.parametrize("old, new", [((5,), (12,)), ((3, 4), (7, 4)), ((2, 3, 4), (5, 9, 4)), ((4, 6), (4, 6))])
def test_centre_tile_is_wrap_padding_with_the_source_in_the_middle(old, new):
    source = np.random.default_rng(0).normal(size=old)
    tiled = centre_tile(source, new)
    np.testing.assert_array_equal(tiled, wrap_reference(source, new))
    centre = tuple(slice((n - o) // 2, (n - o) // 2 + o) for o, n in zip(old, new))
    np.testing.assert_array_equal(tiled[centre], source)


def test_centre_tile_refuses_to_shrink_or_change_rank():
    with pytest.raises(ValueError, match="w/x .* axis 1: tiling only grows"):
        centre_tile(np.zeros((4, 6)), (4, 5), "w/x")
    with pytest.raises(ValueError, match="w/x has 2 axes"):
        centre_tile(np.zeros((4, 6)), (4, 6, 1), "w/x")


def test_layer_map_is_proportional_in_depth():
    assert layer_map(3, 5) == [0, 0, 1, 1, 2]
    assert layer_map(22, 28) == [0, 0, 1, 2, 3, 3, 4, 5, 6, 7, 7, 8, 9, 10, 11, 11, 12, 13, 14, 14, 15, 16, 17, 18,
                                 18, 19, 20, 21]
    assert layer_map(4, 4) == [0, 1, 2, 3]


def test_a_longer_position_table_keeps_its_rows_in_place_and_shallower_targets_are_refused():
    """Centre-tiled like the other weights, a position table grown from 64 to 128 rows started target position 0 as
    source position 32 (BERT's logits 0.073 off where copying the rows gives none); and a target with fewer layers
    silently dropped some."""
    from bertjax.models import EncoderForMaskedLM, abstract_params
    from bertjax.train.init_from import grow_params

    rng = np.random.default_rng(0)
    small = EncoderForMaskedLM(get_config("bert-tiny", max_position_embeddings=64))
    source = jax.tree.map(lambda spec: rng.normal(0, 0.2, spec.shape).astype(np.float32), abstract_params(small))
    longer = EncoderForMaskedLM(get_config("bert-tiny", max_position_embeddings=128))
    grown, _ = grow_params(source, abstract_params(longer))
    table = grown["embeddings"]["position_embeddings"]["embedding"]
    np.testing.assert_array_equal(table[:64], source["embeddings"]["position_embeddings"]["embedding"])
    ids = jnp.arange(5, 45)[None]
    np.testing.assert_array_equal(longer.apply({"params": grown}, ids).logits, small.apply({"params": source},
                                                                                           ids).logits)
    shallow = EncoderForMaskedLM(get_config("bert-tiny", max_position_embeddings=64, num_layers=1))
    with pytest.raises(ValueError, match="the target needs at least as many"):
        grow_params(source, abstract_params(shallow))


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    from bertjax.cli import main
    from bertjax.model_dirs import load_model_dir, save_model_dir
    from bertjax.models import EncoderForMaskedLM, abstract_params

    root = tmp_path_factory.mktemp("init-from")
    source_model = EncoderForMaskedLM(get_config("modernbert-tiny", **SOURCE))
    # Random values everywhere (norm scales too), so that every tiled element is told apart from its neighbours.
    rng = np.random.default_rng(1)
    source_params = jax.tree.map(lambda spec: (0.2 * rng.normal(size=spec.shape)).astype(spec.dtype),
                                 abstract_params(source_model))
    save_model_dir(root / "base", source_model, source_params)
    config = {"model": {"preset": "modernbert-tiny", "overrides": TARGET},
              "data": {"input": "default", "seq_len": 32, "global_batch_size": 8},
              "train": {"phases": [{"tokens": 2048, "model": {"rope_theta_global": 10000.0}},
                                   {"tokens": 1024, "data": {"seq_len": 64}}]}}
    (root / "large.yaml").write_text(yaml.safe_dump(config))
    args = ["init-from", "--source", str(root / "base"), "--config", str(root / "large.yaml"), "--out"]
    assert main([*args, str(root / "large")]) == 0
    model, params, _ = load_model_dir(root / "large")
    return root, args, jax.device_get(source_params), model, jax.device_get(params)


def test_every_weight_is_the_mapped_source_weight_centre_tiled(grown):
    _, _, source, model, params = grown
    assert (model.config.hidden_size, model.config.num_layers, model.config.num_heads) == (48, 5, 6)
    flat_source = traverse_util.flatten_dict(source)
    flat = traverse_util.flatten_dict(params)
    assert {"/".join(p) for p in flat if "layers_4" in p} >= {"encoder/layers_4/attention/query/kernel"}
    fresh_norms = 0
    for path, value in flat.items():
        source_path = tuple(f"layers_{[0, 0, 1, 1, 2][int(part[7:])]}" if part.startswith("layers_") else part
                            for part in path)
        if source_path not in flat_source:  # source layer 0 has no attention norm (ModernBERT's first layer)
            assert path[-2:] == ("attention_norm", "scale") and source_path[1] == "layers_0", path
            np.testing.assert_array_equal(value, np.ones(value.shape))
            fresh_norms += 1
            continue
        np.testing.assert_array_equal(value, wrap_reference(flat_source[source_path], value.shape),
                                      err_msg="/".join(path))
    assert fresh_norms == 1  # target layer 1 (from source layer 0); target layer 0 has no attention norm either


def test_grown_model_runs_and_init_from_reads_it_unchanged(grown):
    from bertjax.models import abstract_params
    from bertjax.train.init_from import adapt_params

    root, _, _, model, params = grown
    assert json.loads((root / "large" / "init_from.json").read_text())["layer_map"] == [0, 0, 1, 1, 2]
    ids = jnp.asarray(np.random.default_rng(0).integers(5, 128, size=(2, 24)), jnp.int32)
    logits = jax.jit(lambda p, i: model.apply({"params": p}, i, jnp.ones_like(i)).logits)(params, ids)
    assert logits.shape == (2, 24, 128) and bool(jnp.isfinite(logits).all())
    read = adapt_params(params, model.config, abstract_params(model))
    jax.tree.map(np.testing.assert_array_equal, read, params)


def test_the_printed_next_command_keeps_the_overrides_given(grown, capsys):
    """Copied as printed, the run builds the model init-from grew (its overrides included) and loads it as is."""
    from bertjax.cli import main

    root, args, *_ = grown
    assert main([*args, str(root / "with-overrides"), "model.overrides.dropout_rate=0.0"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("start the run from it"))
    assert line.endswith(f"model.overrides.dropout_rate=0.0 model.init_from={root / 'with-overrides'}")


def test_notes_for_a_grown_rotary_head_dim_and_a_source_without_tokenizer(grown, capsys):
    """Both were silent: a head_dim grown under RoPE tiles its rotary pairs apart, and without a tokenizer the
    printed command started a run that failed some 20 s later on the vocabulary size."""
    from bertjax.cli import main

    root, args, *_ = grown
    capsys.readouterr()  # what came before
    assert main([*args, str(root / "wide-heads"), "model.overrides.num_heads=4"]) == 0  # 48 / 4: head_dim 12
    out = capsys.readouterr().out
    assert "note: head_dim grows 8 -> 12 in a rotary-position model" in out
    assert f"note: {root / 'base'} holds no tokenizer; add tokenizer.path=" in out
    assert main([*args, str(root / "same-heads")]) == 0
    assert "head_dim grows" not in capsys.readouterr().out


def test_vocabulary_change_is_an_error_naming_the_field(grown, capsys):
    from bertjax.cli import main

    root, args, *_ = grown
    assert main([*args, str(root / "bad"), "model.overrides.vocab_size=256"]) == 2
    assert "model.overrides.vocab_size (256) differs from the source model's (128)" in capsys.readouterr().err
