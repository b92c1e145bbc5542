"""ELECTRA and EuroBERT against transformers (PyTorch, CPU) on tiny random-weight models.

Shapes are chosen unlike the presets: ELECTRA with embedding_size != hidden_size and a non-GELU hidden activation
(so the generator head's fixed exact GELU and the discriminator head's hidden_act are told apart), EuroBERT with a
head_dim that is not hidden / heads and 2:1 grouped-query attention. Every parameter is moved off its init
(biases and norm scales included), batches are right-padded, outputs are compared at real tokens, float32.
"""

from __future__ import annotations

import json

import chex
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
