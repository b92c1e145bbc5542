"""ELECTRA and EuroBERT against transformers (PyTorch, CPU) on tiny random-weight models.

Shapes are chosen unlike the presets: ELECTRA with embedding_size != hidden_size and a non-GELU hidden activation
(so the generator head's fixed exact GELU and the discriminator head's hidden_act are told apart), EuroBERT with a
head_dim that is not hidden / heads and 2:1 grouped-query attention. Every parameter is moved off its init
(biases and norm scales included), batches are right-padded, outputs are compared at real tokens, float32.
"""

from __future__ import annotations

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.hf import electra, eurobert

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4
VOCAB = 100
LENGTHS, SEQ = (12, 9, 4), 12


def perturb_(model, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.2)


def padded_batch(pad_id: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, (len(LENGTHS), SEQ))
    mask = (np.arange(SEQ)[None, :] < np.asarray(LENGTHS)[:, None]).astype(np.int64)
    return np.where(mask == 1, ids, pad_id), mask


def electra_config(**overrides):
    values = dict(vocab_size=VOCAB, embedding_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=48, hidden_act="gelu_new", max_position_embeddings=40, type_vocab_size=3,
                  attn_implementation="eager")
    return transformers.ElectraConfig(**{**values, **overrides})


def eurobert_config(**overrides):
    values = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=12, intermediate_size=40, max_position_embeddings=64,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0}, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, mask_token_id=3, attn_implementation="eager")
    return transformers.EuroBertConfig(**{**values, **overrides})


# (id, transformers class, config factory, family module)
CASES = [
    ("electra-discriminator", "ElectraForPreTraining", electra_config, electra),
    ("electra-generator", "ElectraForMaskedLM", lambda: electra_config(hidden_size=16, num_attention_heads=2,
                                                                          intermediate_size=32), electra),
    ("electra-generator-untied", "ElectraForMaskedLM", lambda: electra_config(tie_word_embeddings=False), electra),
    ("electra-model-unfactorised", "ElectraModel", lambda: electra_config(embedding_size=32), electra),
    ("eurobert-mlm", "EuroBertForMaskedLM", eurobert_config, eurobert),
    ("eurobert-mlm-biases-tied", "EuroBertForMaskedLM",
     lambda: eurobert_config(attention_bias=True, mlp_bias=True, tie_word_embeddings=True, head_dim=None,
                             num_key_value_heads=4, hidden_act="gelu"), eurobert),
    ("eurobert-model", "EuroBertModel", eurobert_config, eurobert),
]


def reference(name: str, factory, seed: int, directory: str):
    """A perturbed random transformers model, saved to `directory` with transformers' own save_pretrained."""
    hf_config = factory()
    torch.manual_seed(seed)
    hf_model = getattr(transformers, name)(hf_config).eval()
    perturb_(hf_model, seed)
    hf_model.save_pretrained(directory)
    return hf_model


def outputs(hf_model, ids, mask, extra) -> np.ndarray:
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                       **{k: torch.tensor(v) for k, v in extra.items()})
    return (out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits).numpy()


@pytest.mark.parametrize("case_id,name,factory,family", CASES, ids=[c[0] for c in CASES])
def test_parity_and_round_trip(case_id, name, factory, family, tmp_path):
    """transformers -> bertjax: equal outputs; bertjax -> transformers: equal outputs; and back: equal params."""
    hf_model = reference(name, factory, seed=len(case_id), directory=str(tmp_path / "hf"))
    model, params = bertjax.from_pretrained(str(tmp_path / "hf"))
    head = family.FAMILY.architectures[name]
    assert type(model) is bertjax.MODEL_CLASSES[head] and model.config.family == family.MODEL_TYPE

    ids, mask = padded_batch(pad_id=hf_model.config.pad_token_id)
    extra = {}
    if family is electra:
        extra["token_type_ids"] = np.random.default_rng(1).integers(0, hf_model.config.type_vocab_size, ids.shape)
    expected = outputs(hf_model, ids, mask, extra)
    out = model.apply({"params": params}, ids, attention_mask=mask, **extra)
    got = out.last_hidden_state if head == "encoder" else out.logits
    assert got.shape == expected.shape  # the discriminator's logits are [batch, seq]
    if head != "encoder":
        assert got.dtype == jnp.float32
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(got)[real], expected[real], atol=ATOL, rtol=0)

    # bertjax writes the same family and architecture back, and transformers reads it as the same model.
    bertjax.save_pretrained(str(tmp_path / "bj"), model, params)
    with open(tmp_path / "bj" / "config.json") as f:
        written = json.load(f)
    assert written["model_type"] == family.MODEL_TYPE and written["architectures"] == [name]
    reloaded = getattr(transformers, name).from_pretrained(str(tmp_path / "bj")).eval()
    original, back = hf_model.state_dict(), reloaded.state_dict()
    assert original.keys() == back.keys()
    for key in original:
        np.testing.assert_array_equal(back[key].numpy(), original[key].numpy(), err_msg=key)
    # transformers picks its default attention kernel on reload, hence a tolerance rather than equality.
    np.testing.assert_allclose(outputs(reloaded, ids, mask, extra)[real], expected[real], atol=ATOL, rtol=0)
    again_model, again = bertjax.from_pretrained(str(tmp_path / "bj"))
    assert again_model.config == model.config
    chex.assert_trees_all_equal(again, params)


def test_published_eurobert_config_layout_means_the_same():
    """EuroBERT's published config.json (top-level rope_theta, rope_scaling: null) reads as transformers 5's."""
    current = eurobert_config(rope_parameters={"rope_type": "default", "rope_theta": 250_000.0}).to_dict()
    legacy = {k: v for k, v in current.items() if k != "rope_parameters"}
    legacy.update(rope_theta=250_000.0, rope_scaling=None)
    assert transformers.EuroBertConfig(**legacy).rope_parameters == current["rope_parameters"]
    config = eurobert.to_encoder_config(current, "masked_lm")
    assert eurobert.to_encoder_config(legacy, "masked_lm") == config
    assert config.rope_theta_global == config.rope_theta_local == 250_000.0
    assert (config.head_dim, config.kv_heads, config.num_heads) == (12, 2, 4)


@pytest.mark.parametrize("changes,match", [
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type='linear'"),
    ({"rope_parameters": None, "rope_theta": 1e4, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     "rope_scaling"),
    ({"hidden_act": "mish"}, "hidden_act='mish'"),
])
def test_eurobert_config_refusals_name_the_key(changes, match):
    values = {**eurobert_config().to_dict(), **changes}
    with pytest.raises(ValueError, match=match):
        eurobert.to_encoder_config(values, "masked_lm")


def test_electra_relative_positions_are_refused():
    values = {**electra_config().to_dict(), "position_embedding_type": "relative_key"}
    with pytest.raises(ValueError, match="position_embedding_type"):
        electra.FAMILY.to_encoder_config(values, "masked_lm")


@pytest.mark.parametrize("preset,head,overrides,match", [
    ("electra-tiny-discriminator", "replaced_token_detection", {"pooler": True}, "pooler=True"),
    ("electra-tiny-generator", "masked_lm", {"head_activation": "gelu_tanh"}, "head_activation='gelu_tanh'"),
    ("electra-tiny-discriminator", "pretraining", {}, "no electra architecture"),
    ("eurobert-tiny", "masked_lm", {"rope_theta_local": 10.0}, "rope_theta_local=10.0"),
    ("eurobert-tiny", "masked_lm", {"mlm_head_transform": True}, "mlm_head_transform=True"),
    ("eurobert-tiny", "replaced_token_detection", {}, "no eurobert architecture"),
    ("bert-tiny", "replaced_token_detection", {}, "no bert architecture"),
    ("bert-tiny", "masked_lm", {"attention_head_dim": 16}, "attention_head_dim=16"),
    ("electra-tiny-generator", "masked_lm", {"mlm_head_transform": False, "tie_word_embeddings": False},
     "mlm_head_transform=False"),
])
def test_save_refuses_what_the_family_cannot_express(preset, head, overrides, match, tmp_path):
    model = bertjax.MODEL_CLASSES[head](bertjax.get_config(preset, **overrides))
    with pytest.raises(ValueError, match=match):
        bertjax.save_pretrained(str(tmp_path), model, {})  # refused before the params are looked at
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize("preset,head,architecture", [
    ("electra-tiny-discriminator", "replaced_token_detection", "ElectraForPreTraining"),
    ("electra-tiny-generator", "masked_lm", "ElectraForMaskedLM"),
    ("eurobert-tiny", "masked_lm", "EuroBertForMaskedLM"),
])
def test_presets_export_as_their_family(preset, head, architecture, tmp_path):
    """A preset-built model (the ELECTRA generator/discriminator pretraining writes) loads in transformers whole."""
    model = bertjax.MODEL_CLASSES[head](bertjax.get_config(preset))
    # Zeros of every expected shape: what is checked is which tensors are written, not their values, and no
    # initialiser has to run op by op.
    params = jax.tree_util.tree_map(lambda spec: np.zeros(spec.shape, spec.dtype), expected_tree(model))
    bertjax.save_pretrained(str(tmp_path), model, params)
    hf_model, info = getattr(transformers, architecture).from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert hf_model.config.model_type == bertjax.get_config(preset).family
    model_back, _ = bertjax.from_pretrained(str(tmp_path))
    assert model_back.config == bertjax.get_config(preset)


@pytest.mark.parametrize("size", ["tiny", "small", "base", "large"])
def test_electra_generator_and_discriminator_embeddings_have_one_shape(size):
    """The ELECTRA objective shares word/position/type embeddings and their norm: the shapes must agree."""
    generator = bertjax.EncoderForMaskedLM(bertjax.get_config(f"electra-{size}-generator"))
    discriminator = bertjax.EncoderForReplacedTokenDetection(bertjax.get_config(f"electra-{size}-discriminator"))
    shared = ("word_embeddings", "position_embeddings", "token_type_embeddings", "norm")
    shapes = [{k: jax.tree_util.tree_map(lambda x: x.shape, v) for k, v in params["embeddings"].items() if k in shared}
              for params in (expected_tree(generator), expected_tree(discriminator))]
    assert shapes[0] == shapes[1] and set(shapes[0]) == set(shared)


def expected_tree(model) -> dict:
    from flax import traverse_util

    from bertjax.hf.pretrained import expected_params
    return traverse_util.unflatten_dict(expected_params(model))


def test_head_dim_and_mlm_transform_knobs_are_validated():
    base = bertjax.get_config("eurobert-tiny")
    assert base.replace(attention_head_dim=12, hidden_size=30).head_dim == 12  # hidden need not divide by heads
    with pytest.raises(ValueError, match="attention_head_dim"):
        base.replace(attention_head_dim=0)
    with pytest.raises(ValueError, match="num_heads"):
        base.replace(hidden_size=30)
    with pytest.raises(ValueError, match="mlm_head_transform"):
        base.replace(tie_word_embeddings=True, embedding_size=16)
