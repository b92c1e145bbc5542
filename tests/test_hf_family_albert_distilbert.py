"""ALBERT and DistilBERT checkpoints: parity with transformers, round trips, family choice on export, refusals.

Same method as tests/test_hf_parity.py (whose helpers this reuses): random-weight transformers models with shapes
unlike the presets, every parameter perturbed (biases and norm scales included), compared in float32 at the
non-padding positions of a right-padded batch.
"""

from __future__ import annotations

import copy
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from flax import traverse_util

import bertjax
from bertjax.config import PRESETS
from bertjax.hf import FAMILIES
from bertjax.models.embeddings import sinusoidal_table
from test_hf_parity import (LENGTHS, SEQ, TINY, VOCAB, assert_outputs_close, bertjax_outputs, export_to_transformers,
                            padded_batch, perturb_, random_bertjax_params)
from test_hf_parity import reference_outputs as bert_reference_outputs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def albert_config(**overrides):
    values = dict(**TINY, embedding_size=16, num_hidden_layers=3, intermediate_size=48, max_position_embeddings=64,
                  attn_implementation="eager")
    values.update(overrides)
    return transformers.AlbertConfig(**values)


def distilbert_config(**overrides):
    values = dict(vocab_size=VOCAB, dim=32, n_heads=4, n_layers=3, hidden_dim=48, max_position_embeddings=64,
                  attn_implementation="eager")
    values.update(overrides)
    return transformers.DistilBertConfig(**values)


def rewrite_config(directory: str, edit) -> None:
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        values = json.load(f)
    edit(values)
    with open(path, "w") as f:
        json.dump(values, f)


def as_published_albert(values: dict) -> None:
    """The extra keys albert-*-v2's config.json carries from the TensorFlow release; transformers ignores them."""
    values.update(down_scale_factor=1, gap_size=0, net_structure_type=0, num_memory_blocks=0,
                  position_embedding_type="absolute", classifier_dropout_prob=0.1)


def as_aliased_distilbert(values: dict) -> None:
    """DistilBERT sizes under the names transformers' attribute_map accepts, plus published-config leftovers."""
    for name, alias in (("dim", "hidden_size"), ("n_layers", "num_hidden_layers"), ("n_heads", "num_attention_heads")):
        values[alias] = values.pop(name)
    values.update(tie_weights_=True, qa_dropout=0.1, seq_classif_dropout=0.2)


# (case id, transformers class, config factory, config.json rewrite or None, perturb the position table)
CASES = [
    ("albert-model-5steps-2groups-2inner", "AlbertModel",
     lambda: albert_config(num_hidden_layers=5, num_hidden_groups=2, inner_group_num=2), as_published_albert, True),
    ("albert-mlm-gelu-eps6", "AlbertForMaskedLM", lambda: albert_config(hidden_act="gelu", layer_norm_eps=1e-6),
     None, True),
    ("albert-mlm-untied", "AlbertForMaskedLM", lambda: albert_config(tie_word_embeddings=False), None, True),
    # 4 steps over 3 groups: transformers' int(i / (4 / 3)) runs groups 0, 0, 1, 2.
    ("albert-pretraining-4steps-3groups", "AlbertForPreTraining",
     lambda: albert_config(num_hidden_layers=4, num_hidden_groups=3), None, True),
    ("distilbert-model", "DistilBertModel", lambda: distilbert_config(), None, True),
    ("distilbert-model-aliases", "DistilBertModel", lambda: distilbert_config(n_layers=2), as_aliased_distilbert, True),
    ("distilbert-mlm-relu-untied", "DistilBertForMaskedLM",
     lambda: distilbert_config(activation="relu", tie_word_embeddings=False), None, True),
    # The sinusoidal table is a constant: perturbing it would make a checkpoint that breaks its own config.
    ("distilbert-mlm-sinusoidal", "DistilBertForMaskedLM", lambda: distilbert_config(sinusoidal_pos_embds=True),
     None, False),
]
CASE_IDS = [case[0] for case in CASES]
POSITION_TABLES = ("embeddings.position_embeddings.weight",)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(case_id) -> (transformers model, checkpoint directory), built once per module."""
    built = {}

    def get(case_id: str):
        if case_id not in built:
            _, class_name, make_config, rewrite, perturb_positions = next(c for c in CASES if c[0] == case_id)
            torch.manual_seed(0)
            model = getattr(transformers, class_name)(make_config()).eval()
            table = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith(POSITION_TABLES)}
            perturb_(model, seed=1)
            if not perturb_positions:
                with torch.no_grad():
                    for name, parameter in model.named_parameters():
                        if name in table:
                            parameter.copy_(table[name])
            directory = str(tmp_path_factory.mktemp(case_id))
            model.save_pretrained(directory)
            if rewrite is not None:
                rewrite_config(directory, rewrite)
                reread = transformers.AutoConfig.from_pretrained(directory)  # transformers reads the same model
                assert (reread.hidden_size, reread.num_hidden_layers) == (model.config.hidden_size,
                                                                          model.config.num_hidden_layers)
            built[case_id] = model, directory
        return built[case_id]

    return get


def reference_outputs(model, ids, mask, token_type_ids=None) -> dict[str, np.ndarray]:
    """transformers' outputs under bertjax's names: AlbertForPreTraining's sop_logits are `nsp_logits`."""
    if isinstance(model, transformers.AlbertForPreTraining):
        kwargs = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
                  "token_type_ids": torch.tensor(token_type_ids)}
        with torch.no_grad():
            out = model(**kwargs)
            base = model.albert(**kwargs)
        return {"last_hidden_state": base.last_hidden_state.numpy(), "logits": out.prediction_logits.numpy(),
                "nsp_logits": out.sop_logits.numpy()}
    return bert_reference_outputs(model, ids, mask, token_type_ids)


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_matches_transformers_on_padded_batch(case_id, checkpoint):
    reference, directory = checkpoint(case_id)
    model, params = bertjax.from_pretrained(directory, dtype=jnp.float32)
    assert model.config.family == reference.config.model_type
    ids, mask = padded_batch(LENGTHS, SEQ, reference.config.pad_token_id, seed=2)
    token_types = None
    if case_id.startswith("albert"):
        token_types = np.random.default_rng(3).integers(0, 2, ids.shape)
    assert_outputs_close(bertjax_outputs(model, params, ids, mask, token_types),
                         reference_outputs(reference, ids, mask, token_types), mask)


def test_albert_sharing_and_sinusoidal_configs_are_read():
    """The knobs the parity cases exercise really are the ones read (not a coincidence of defaults)."""
    config = FAMILIES["albert"].to_encoder_config(albert_config(
        num_hidden_layers=5, num_hidden_groups=2, inner_group_num=2).to_dict(), "encoder")
    assert (config.num_layers, config.layer_groups, config.layers_per_group, config.embed_dim) == (5, 2, 2, 16)
    assert [config.layer_group(i) for i in range(5)] == [int(i / (5 / 2)) for i in range(5)] == [0, 0, 0, 1, 1]
    config = FAMILIES["distilbert"].to_encoder_config(
        distilbert_config(sinusoidal_pos_embds=True).to_dict(), "masked_lm")
    assert (config.position_embedding, config.type_vocab_size, config.norm_eps) == ("sinusoidal", 0, 1e-12)


def test_sinusoidal_table_is_transformers_table():
    from transformers.models.distilbert.modeling_distilbert import _create_sinusoidal_embeddings

    expected = _create_sinusoidal_embeddings(70, 24, torch.empty(70, 24)).numpy()
    np.testing.assert_array_equal(sinusoidal_table(70, 24), expected)


def test_sinusoidal_table_trained_away_from_the_formula_is_a_clear_error(checkpoint, tmp_path):
    reference, _ = checkpoint("distilbert-mlm-sinusoidal")
    with torch.no_grad():
        reference.distilbert.embeddings.position_embeddings.weight.add_(0.01)
    try:
        reference.save_pretrained(str(tmp_path))
    finally:
        with torch.no_grad():
            reference.distilbert.embeddings.position_embeddings.weight.sub_(0.01)
    with pytest.raises(ValueError, match="position_embeddings.weight.*sinusoidal_pos_embds"):
        bertjax.from_pretrained(str(tmp_path))
    rewrite_config(str(tmp_path), lambda values: values.update(sinusoidal_pos_embds=False))
    model, _ = bertjax.from_pretrained(str(tmp_path))
    assert model.config.position_embedding == "learned"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_a_sinusoidal_table_saved_in_half_precision_says_it_is_computed_exactly(checkpoint, dtype, tmp_path, caplog):
    """transformers reads the rounded table back from a half-precision file; bertjax computes the formula in
    float32, so the load says the outputs differ by that rounding (a float32 file says nothing)."""
    reference, _ = checkpoint("distilbert-mlm-sinusoidal")
    copy.deepcopy(reference).to(dtype).save_pretrained(str(tmp_path / "half"))
    reference.save_pretrained(str(tmp_path / "full"))
    with caplog.at_level("WARNING", logger="bertjax.hf.distilbert"):
        bertjax.from_pretrained(str(tmp_path / "full"))
        assert "sinusoidal table" not in caplog.text
        bertjax.from_pretrained(str(tmp_path / "half"))
    assert f"holds the sinusoidal table in {str(dtype).removeprefix('torch.')}; bertjax computes it in float32" \
        in caplog.text


def test_albert_without_factorised_embedding_is_a_clear_error(tmp_path):
    model = transformers.AlbertModel(albert_config(embedding_size=32))
    model.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="embedding_size == hidden_size"):
        bertjax.from_pretrained(str(tmp_path))


# --------------------------------------------------------------------------------------------------------------
# bertjax -> save_pretrained -> transformers, and back

# (preset, bertjax head, transformers auto class, config overrides)
ROUND_TRIPS = [
    ("albert-tiny", "encoder", "AutoModel", {"num_layers": 5, "num_layer_groups": 2, "layers_per_group": 2}),
    ("albert-tiny", "masked_lm", "AutoModelForMaskedLM", {"tie_word_embeddings": False}),
    ("albert-tiny", "pretraining", "AutoModelForPreTraining", {}),
    ("distilbert-tiny", "encoder", "AutoModel", {"num_layers": 3, "activation": "gelu_tanh",
                                                  "head_activation": "gelu_tanh"}),
    ("distilbert-tiny", "masked_lm", "AutoModelForMaskedLM", {"position_embedding": "sinusoidal"}),
]


@pytest.mark.parametrize("preset,head,auto_class,overrides", ROUND_TRIPS,
                         ids=[f"{p}-{h}-{i}" for i, (p, h, _, _) in enumerate(ROUND_TRIPS)])
def test_saved_checkpoint_loads_in_transformers_with_same_outputs_and_back(preset, head, auto_class, overrides,
                                                                           tmp_path):
    config, model, params, reference = export_to_transformers(preset, head, auto_class, overrides, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == config.family
    ids, mask = padded_batch(LENGTHS, SEQ, config.pad_token_id, seed=5)
    token_types = np.random.default_rng(6).integers(0, 2, ids.shape) if config.type_vocab_size else None
    ours = bertjax_outputs(model, params, ids, mask, token_types)
    assert_outputs_close(ours, reference_outputs(reference, ids, mask, token_types), mask)

    # ... and back: the same config and the same parameters, bit for bit.
    loaded_model, loaded = bertjax.from_pretrained(str(tmp_path))
    assert loaded_model.config == config
    flat, loaded_flat = traverse_util.flatten_dict(params), traverse_util.flatten_dict(loaded)
    assert flat.keys() == loaded_flat.keys()
    for path, value in flat.items():
        np.testing.assert_array_equal(np.asarray(loaded_flat[path]), np.asarray(value), str(path))


# --------------------------------------------------------------------------------------------------------------
# Export picks the family from the model, and refuses what that family cannot express


def tiny(preset: str, head: str, **overrides):
    model = bertjax.MODEL_CLASSES[head](bertjax.get_config(preset, vocab_size=VOCAB, **overrides))
    return model, random_bertjax_params(model, seed=0)


def test_export_writes_the_models_own_family(tmp_path):
    model, params = tiny("distilbert-tiny", "masked_lm")
    bertjax.save_pretrained(str(tmp_path), model, params)
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["model_type"], written["architectures"]) == ("distilbert", ["DistilBertForMaskedLM"])
    names = set(safetensors.numpy.load_file(str(tmp_path / "model.safetensors")))
    assert "distilbert.transformer.layer.0.attention.q_lin.weight" in names
    assert not any(name.startswith("bert.") for name in names)


@pytest.mark.parametrize("preset,overrides,family,fields", [
    # A BERT-shaped model marked DistilBERT is refused as DistilBERT, listing every field DistilBERT lacks ...
    ("bert-tiny", {"family": "distilbert"}, "distilbert", ["type_vocab_size=2", "pooler=True"]),
    # ... and a DistilBERT model marked BERT is refused as BERT, never written as the other family.
    ("distilbert-tiny", {"family": "bert"}, "bert", ["type_vocab_size=0", "pooler=False"]),
    ("albert-tiny", {"family": "bert"}, "bert", ["embedding_size=16", "num_layer_groups=1"]),
    ("albert-tiny", {"embedding_size": None, "mlp": "glu"}, "albert", ["embedding_size=None", "mlp='glu'"]),
    ("distilbert-tiny", {"norm_eps": 1e-5, "head_activation": "relu"}, "distilbert",
     ["norm_eps=1e-05", "head_activation='relu'"]),
    ("distilbert-tiny", {"position_embedding": "rope"}, "distilbert", ["position_embedding='rope'"]),
])
def test_export_refuses_what_the_family_cannot_express_naming_every_field(preset, overrides, family, fields,
                                                                           tmp_path):
    model, params = tiny(preset, "encoder", **overrides)
    with pytest.raises(ValueError, match=f"Hugging Face {family} checkpoint") as error:
        bertjax.save_pretrained(str(tmp_path), model, params)
    for field in fields:
        assert field in str(error.value)
    assert not list(tmp_path.iterdir())


def test_export_of_an_unknown_family_or_head_is_a_clear_error(tmp_path):
    model, params = tiny("bert-tiny", "masked_lm", family="bort")
    with pytest.raises(ValueError, match="EncoderConfig.family: unknown model_type 'bort'"):
        bertjax.save_pretrained(str(tmp_path), model, params)
    model, params = tiny("distilbert-tiny", "pretraining")
    with pytest.raises(ValueError, match="no distilbert architecture for the bertjax head 'pretraining'"):
        bertjax.save_pretrained(str(tmp_path), model, params)


# --------------------------------------------------------------------------------------------------------------
# The config fields this family work added


@pytest.mark.parametrize("overrides,match", [
    ({"layers_per_group": 0}, "layers_per_group"),
    ({"family": ""}, "EncoderConfig.family"),
    ({"position_embedding": "sinusoidal", "embedding_size": 16}, "sinusoidal"),
    ({"layers_per_group": 2, "global_attention_every": 2, "local_window": 8}, "num_layer_groups"),
])
def test_new_config_fields_are_checked(overrides, match):
    with pytest.raises(ValueError, match=match):
        bertjax.get_config("bert-tiny", **overrides)


def test_presets_name_their_family_and_published_sizes():
    sizes = {name: (c.family, c.hidden_size, c.num_layers, c.num_heads, c.intermediate_size, c.embed_dim)
             for name, c in PRESETS.items()}
    assert sizes["albert-base-v2"] == ("albert", 768, 12, 12, 3072, 128)
    assert sizes["albert-large-v2"] == ("albert", 1024, 24, 16, 4096, 128)
    assert sizes["albert-xlarge-v2"] == ("albert", 2048, 24, 16, 8192, 128)
    assert sizes["albert-xxlarge-v2"] == ("albert", 4096, 12, 64, 16384, 128)
    assert sizes["distilbert-base"] == ("distilbert", 768, 6, 12, 3072, 768)
    assert {c.family for c in PRESETS.values()} <= set(FAMILIES)
    for config in PRESETS.values():  # every preset's own family can write it (raises otherwise)
        written = FAMILIES[config.family].to_hf_config(config, "masked_lm")["model_type"]
        # MosaicML's checkpoints say "bert" and name their remote code in auto_map.
        assert written == ("bert" if config.family == "mosaicbert" else config.family)


def test_convert_round_trip_keeps_the_family_and_sharing(checkpoint, tmp_path):
    """`bertjax convert` through a bertjax model directory and back writes the same ALBERT checkpoint."""
    from bertjax.cli import main as cli_main

    _, directory = checkpoint("albert-model-5steps-2groups-2inner")
    native, back = str(tmp_path / "native"), str(tmp_path / "hf")
    assert cli_main(["convert", "--from-hf", directory, "--out", native]) == 0
    assert cli_main(["convert", "--to-hf", native, "--out", back]) == 0
    original = safetensors.numpy.load_file(os.path.join(directory, "model.safetensors"))
    converted = safetensors.numpy.load_file(os.path.join(back, "model.safetensors"))
    assert original.keys() == converted.keys()
    for name in original:
        np.testing.assert_array_equal(original[name], converted[name], name)
    written = json.loads(open(os.path.join(back, "config.json")).read())
    assert (written["model_type"], written["num_hidden_groups"], written["inner_group_num"]) == ("albert", 2, 2)
