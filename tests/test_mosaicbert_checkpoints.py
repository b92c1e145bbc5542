"""MosaicML's checkpoint layout (bert_layers.py remote code: mosaic-bert-base, DNABERT-2) in and out of bertjax.

transformers has no class to build a reference from and MosaicML's code needs network access, so each test writes a
directory the way MosaicML's code saves it (its tensor names and torch layouts, its config.json with `auto_map`)
from random weights, and compares bertjax with a float64 numpy forward written over those tensor names from the
published model: word + token-type embeddings, post-norm layers with a fused Wqkv, ALiBi with Press et al.'s slopes
and -10000 on padded keys, a bias-free gated_layers whose first half goes through the exact GELU, and BERT's heads.
"""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest
import safetensors.numpy
from scipy.special import erf

import bertjax
from bertjax.hf import special_token_ids

VOCAB, HIDDEN, HEADS, LAYERS, INTERMEDIATE, TYPES = 64, 32, 4, 2, 48, 2


def mosaicml_config(architecture: str, **overrides) -> dict:
    """config.json as mosaicml/mosaic-bert-base ships it (its keys; small sizes)."""
    values = {
        "_name_or_path": "mosaicml/mosaic-bert", "alibi_starting_size": 512, "architectures": [architecture],
        "attention_probs_dropout_prob": 0.0,
        "auto_map": {"AutoConfig": "configuration_bert.BertConfig",
                     "AutoModelForMaskedLM": "bert_layers.BertForMaskedLM"},
        "classifier_dropout": None, "gradient_checkpointing": False, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "hidden_size": HIDDEN, "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
        "model_type": "bert", "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "pad_token_id": 0,
        "position_embedding_type": "absolute", "torch_dtype": "float32", "transformers_version": "4.26.0",
        "type_vocab_size": TYPES, "use_cache": False, "vocab_size": VOCAB,
    }
    return {**values, **overrides}


def mosaicml_tensors(head: str, seed: int = 0, num_labels: int = 2) -> dict[str, np.ndarray]:
    """Random weights under MosaicML's names, torch layout ([out, in]); scale 0.2 so every part moves the output."""
    rng = np.random.default_rng(seed)
    t = {}

    def add(name, *shape):
        t[name] = rng.normal(0.0, 0.2, shape).astype(np.float32)

    base = "" if head == "BertModel" else "bert."
    add(f"{base}embeddings.word_embeddings.weight", VOCAB, HIDDEN)
    add(f"{base}embeddings.token_type_embeddings.weight", TYPES, HIDDEN)
    for i in range(LAYERS):
        p = f"{base}encoder.layer.{i}."
        add(p + "attention.self.Wqkv.weight", 3 * HIDDEN, HIDDEN)
        add(p + "attention.self.Wqkv.bias", 3 * HIDDEN)
        add(p + "attention.output.dense.weight", HIDDEN, HIDDEN)
        add(p + "attention.output.dense.bias", HIDDEN)
        add(p + "mlp.gated_layers.weight", 2 * INTERMEDIATE, HIDDEN)
        add(p + "mlp.wo.weight", HIDDEN, INTERMEDIATE)
        add(p + "mlp.wo.bias", HIDDEN)
        for norm in ("attention.output.LayerNorm", "mlp.layernorm"):
            t[p + norm + ".weight"] = (1.0 + rng.normal(0.0, 0.2, HIDDEN)).astype(np.float32)
            add(p + norm + ".bias", HIDDEN)
    t[f"{base}embeddings.LayerNorm.weight"] = (1.0 + rng.normal(0.0, 0.2, HIDDEN)).astype(np.float32)
    add(f"{base}embeddings.LayerNorm.bias", HIDDEN)
    # The code registers its precomputed ALiBi bias as a buffer, so state dicts carry it.
    t[f"{base}encoder.alibi"] = np.zeros((1, HEADS, 8, 8), np.float32)
    if head in ("BertModel", "BertForSequenceClassification"):
        add(f"{base}pooler.dense.weight", HIDDEN, HIDDEN)
        add(f"{base}pooler.dense.bias", HIDDEN)
    if head == "BertForSequenceClassification":
        add("classifier.weight", num_labels, HIDDEN)
        add("classifier.bias", num_labels)
    if head == "BertForMaskedLM":  # the decoder weight is the word embeddings: left out of the file
        add("cls.predictions.transform.dense.weight", HIDDEN, HIDDEN)
        add("cls.predictions.transform.dense.bias", HIDDEN)
        t["cls.predictions.transform.LayerNorm.weight"] = (1.0 + rng.normal(0.0, 0.2, HIDDEN)).astype(np.float32)
        add("cls.predictions.transform.LayerNorm.bias", HIDDEN)
        add("cls.predictions.decoder.bias", VOCAB)
    return t


def write_dir(path, config: dict, tensors: dict) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    safetensors.numpy.save_file(tensors, str(path / "model.safetensors"))
    return str(path)


def press_slopes(heads: int) -> np.ndarray:
    """ALiBi slopes for a power-of-two head count: 2^(-8/n), 2^(-16/n), ... (Press et al. 2022)."""
    assert math.log2(heads).is_integer()
    return np.array([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)])


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def reference(tensors, ids, types, mask, base="bert.", eps=1e-12):
    """(last hidden state, tensors as float64) of MosaicML's encoder, over its own tensor names."""
    s = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    e = f"{base}embeddings."
    x = s[e + "word_embeddings.weight"][ids] + s[e + "token_type_embeddings.weight"][types]
    x = layer_norm(x, s[e + "LayerNorm.weight"], s[e + "LayerNorm.bias"], eps)
    b, n = ids.shape
    d = HIDDEN // HEADS
    distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    bias = -press_slopes(HEADS)[None, :, None, None] * distance + (1.0 - mask[:, None, None, :]) * -10000.0
    for i in range(LAYERS):
        p = f"{base}encoder.layer.{i}."
        qkv = x @ s[p + "attention.self.Wqkv.weight"].T + s[p + "attention.self.Wqkv.bias"]
        q, k, v = (part.reshape(b, n, HEADS, d) for part in np.split(qkv, 3, axis=-1))
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d) + bias
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        context = np.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, n, HIDDEN)
        attended = context @ s[p + "attention.output.dense.weight"].T + s[p + "attention.output.dense.bias"]
        x = layer_norm(x + attended, s[p + "attention.output.LayerNorm.weight"],
                       s[p + "attention.output.LayerNorm.bias"], eps)
        up = x @ s[p + "mlp.gated_layers.weight"].T
        hidden = gelu(up[..., :INTERMEDIATE]) * up[..., INTERMEDIATE:]
        x = layer_norm(x + hidden @ s[p + "mlp.wo.weight"].T + s[p + "mlp.wo.bias"], s[p + "mlp.layernorm.weight"],
                       s[p + "mlp.layernorm.bias"], eps)
    return x, s


def batch(seed=1):
    rng = np.random.default_rng(seed)
    lengths = np.array([12, 7, 3])
    mask = (np.arange(12)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask == 1, rng.integers(1, VOCAB, (3, 12)), 0)
    return ids, rng.integers(0, TYPES, (3, 12)), mask


def test_a_mosaicml_mlm_checkpoint_loads_and_matches_its_forward(tmp_path):
    tensors = mosaicml_tensors("BertForMaskedLM")
    path = write_dir(tmp_path / "mosaic", mosaicml_config("BertForMaskedLM"), tensors)
    model, params = bertjax.from_pretrained(path)
    assert type(model) is bertjax.EncoderForMaskedLM
    config = model.config
    assert (config.family, config.position_embedding, config.mlp, config.mlp_up_bias) == ("mosaicbert", "alibi",
                                                                                          "glu", False)
    ids, types, mask = batch()
    out = jax.jit(model.apply)({"params": params}, ids, attention_mask=mask, token_type_ids=types)
    hidden, s = reference(tensors, ids, types, mask)
    t = gelu(hidden @ s["cls.predictions.transform.dense.weight"].T + s["cls.predictions.transform.dense.bias"])
    t = layer_norm(t, s["cls.predictions.transform.LayerNorm.weight"], s["cls.predictions.transform.LayerNorm.bias"],
                   1e-12)
    logits = t @ s["bert.embeddings.word_embeddings.weight"].T + s["cls.predictions.decoder.bias"]
    valid = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out.last_hidden_state)[valid], hidden[valid], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(out.logits)[valid], logits[valid], atol=1e-4, rtol=0)


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", "BertModel", "BertForSequenceClassification"])
def test_export_writes_mosaicmls_layout_back(architecture, tmp_path):
    """Every tensor (but the ALiBi buffer, which is not a weight) comes back under its name with its values; the
    config names MosaicML's code in auto_map, and bertjax reads the export as the same model."""
    tensors = mosaicml_tensors(architecture)
    config = mosaicml_config(architecture, bos_token_id=None, cls_token_id=2)
    path = write_dir(tmp_path / "mosaic", config, tensors)
    model, params = bertjax.from_pretrained(path)
    bertjax.save_pretrained(str(tmp_path / "out"), model, params, token_ids=special_token_ids(path))
    written = safetensors.numpy.load_file(str(tmp_path / "out" / "model.safetensors"))
    kept = {k: v for k, v in tensors.items() if not k.endswith("encoder.alibi")}
    assert written.keys() == kept.keys()
    for key, value in kept.items():
        np.testing.assert_array_equal(written[key], value, err_msg=key)
    values = json.loads((tmp_path / "out" / "config.json").read_text())
    assert values["model_type"] == "bert" and values["architectures"] == [architecture]
    assert values["auto_map"]["AutoModelForMaskedLM"] == "mosaicml/mosaic-bert-base--bert_layers.BertForMaskedLM"
    assert values["cls_token_id"] == 2
    again, again_params = bertjax.from_pretrained(str(tmp_path / "out"))
    assert again.config == model.config
    for a, b in zip(jax.tree.leaves(again_params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_sequence_classifier_reads_the_pooled_first_token(tmp_path):
    tensors = mosaicml_tensors("BertForSequenceClassification", num_labels=3)
    config = mosaicml_config("BertForSequenceClassification", id2label={"0": "a", "1": "b", "2": "c"})
    model, params = bertjax.from_pretrained(write_dir(tmp_path / "mosaic", config, tensors))
    assert model.config.task.label_names == ("a", "b", "c")
    ids, types, mask = batch(seed=2)
    logits = np.asarray(model.apply({"params": params}, ids, attention_mask=mask, token_type_ids=types).logits)
    hidden, s = reference(tensors, ids, types, mask)
    pooled = np.tanh(hidden[:, 0] @ s["bert.pooler.dense.weight"].T + s["bert.pooler.dense.bias"])
    np.testing.assert_allclose(logits, pooled @ s["classifier.weight"].T + s["classifier.bias"], atol=1e-4, rtol=0)


def test_bert_checkpoints_stay_bert_and_unmodelled_settings_are_refused(tmp_path):
    from bertjax.hf import registry

    plain = mosaicml_config("BertForMaskedLM")
    del plain["auto_map"]
    family, head = registry.architecture(plain)
    assert (family.model_type, head) == ("bert", "masked_lm")
    tensors = mosaicml_tensors("BertForMaskedLM")
    odd_eps = write_dir(tmp_path / "eps", mosaicml_config("BertForMaskedLM", layer_norm_eps=1e-5), tensors)
    with pytest.raises(ValueError, match="layer_norm_eps=1e-05 with MosaicML's MLM head"):
        bertjax.from_pretrained(odd_eps)
    model, _ = bertjax.from_pretrained(odd_eps, head="encoder")  # the encoder alone has one eps
    assert model.config.norm_eps == 1e-5
    with pytest.raises(ValueError, match="mlp_up_bias=True"):
        bertjax.save_pretrained(str(tmp_path / "x"), *_with(model, mlp_up_bias=True))


def _with(model, **changes):
    changed = type(model)(model.config.replace(**changes))
    return changed, bertjax.init_params(changed, jax.random.key(0))
