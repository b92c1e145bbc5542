"""ELECTRA and EuroBERT against transformers (PyTorch, CPU) on tiny random-weight models.

Shapes are chosen unlike the presets: ELECTRA with embedding_size != hidden_size and a non-GELU hidden activation
(so the generator head's fixed exact GELU and the discriminator head's hidden_act are told apart), EuroBERT with a
head_dim that is not hidden / heads and 2:1 grouped-query attention. Every parameter is moved off its init
(biases and norm scales included), batches are right-padded, outputs are compared at real tokens, float32.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

import bertjax
from bertjax.hf import electra, eurobert
from bertjax.hf.pretrained import expected_params

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


def params_from_state_dict(family, config, head: str, model, state: dict) -> dict:
    """bertjax params from a transformers state dict through the family's key mapping (every parameter once)."""
    mapping = family.key_mapping(config, head)
    flat = {}
    for rule in mapping.rules:
        key = next(k for k in rule.hf_keys if k in state)
        tensor = state[key]
        assert tuple(tensor.shape) == rule.hf_shape, (key, tensor.shape, rule.hf_shape)
        for path, array in zip(rule.params, rule.layout.load(tensor)):
            flat[path] = jnp.asarray(array)
    assert set(flat) == set(expected_params(model))
    leftover = set(state) - {k for rule in mapping.rules for k in rule.hf_keys} - mapping.ignored
    assert not leftover, leftover
    return traverse_util.unflatten_dict(flat)


def reference(name: str, factory, seed: int):
    hf_config = factory()
    hf_model = getattr(transformers, name)(hf_config).eval()
    perturb_(hf_model, seed)
    if getattr(hf_config, "tie_word_embeddings", False):  # the tie survives the perturbation only if re-tied
        hf_model.tie_weights()
    return hf_config, hf_model


@pytest.mark.parametrize("case_id,name,factory,family", CASES, ids=[c[0] for c in CASES])
def test_forward_matches_transformers(case_id, name, factory, family):
    hf_config, hf_model = reference(name, factory, seed=len(case_id))
    head = family.ARCHITECTURES[name]
    config = family.to_encoder_config(hf_config.to_dict(), head)
    model = bertjax.MODEL_CLASSES[head](config)
    state = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    params = params_from_state_dict(family, config, head, model, state)

    ids, mask = padded_batch(pad_id=hf_config.pad_token_id)
    kwargs = {}
    if family is electra:
        kwargs["token_type_ids"] = np.random.default_rng(1).integers(0, hf_config.type_vocab_size, ids.shape)
    with torch.no_grad():
        expected = hf_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                            **{k: torch.tensor(v) for k, v in kwargs.items()})
    out = model.apply({"params": params}, ids, attention_mask=mask, **kwargs)
    real = mask.astype(bool)
    if head == "encoder":
        np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real],
                                   expected.last_hidden_state.numpy()[real], atol=ATOL, rtol=0)
    else:
        assert out.logits.dtype == jnp.float32
        assert out.logits.shape == tuple(expected.logits.shape)  # [batch, seq] for the discriminator
        np.testing.assert_allclose(np.asarray(out.logits)[real], expected.logits.numpy()[real], atol=ATOL, rtol=0)

