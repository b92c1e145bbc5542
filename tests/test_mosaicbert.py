"""MosaicBERT: ALiBi slopes, the model against an independent numpy forward of the same weights (there is no
transformers class), extrapolation from a 128-token model to 1024 tokens, presets and refusals.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from scipy.special import erf

import bertjax
from bertjax.config import alibi_slopes, get_config
from bertjax.models.params import abstract_params
from test_hf_parity import random_bertjax_params


def test_alibi_slopes_follow_press_et_al_for_any_head_count():
    # Powers of two: the geometric sequence starting at 2^(-8/n) with that ratio (Press et al. 2022, section 3).
    np.testing.assert_allclose(alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)], rtol=1e-12)
    np.testing.assert_allclose(alibi_slopes(16), [2.0 ** (-0.5 * (i + 1)) for i in range(16)], rtol=1e-12)
    # Other counts: the 8 slopes of the closest power of two, then every other slope of 16 (the paper's code).
    np.testing.assert_allclose(alibi_slopes(12), [2.0 ** -(i + 1) for i in range(8)]
                               + [2.0 ** (-0.5 * (i + 1)) for i in range(0, 8, 2)], rtol=1e-12)
    for heads in (1, 3, 5, 6, 12, 20, 24):
        slopes = alibi_slopes(heads)
        assert len(slopes) == heads == len(set(slopes)) and all(0 < s < 1 or heads == 1 for s in slopes)


def layer_norm(x, scale, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def numpy_mlm_forward(config, params, ids, token_types, mask):
    """MosaicBERT's forward written from the paper and MosaicML's bert_layers.py, in float64 numpy: word + type
    embeddings (no positions), post-norm layers with ALiBi attention and a GeGLU feed-forward, BERT's MLM head."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    eps, heads, dim = config.norm_eps, config.num_heads, config.head_dim
    e = p["embeddings"]
    x = e["word_embeddings"]["embedding"][ids] + e["token_type_embeddings"]["embedding"][token_types]
    x = layer_norm(x, e["norm"]["scale"], e["norm"]["bias"], eps)
    seq = ids.shape[1]
    distance = np.abs(np.arange(seq)[:, None] - np.arange(seq)[None, :])
    bias = -np.asarray(alibi_slopes(heads))[:, None, None] * distance  # [heads, seq, seq]
    keep = mask[:, None, None, :].astype(bool)
    for i in range(config.num_layers):
        lp = p["encoder"][f"layers_{i}"]
        a = lp["attention"]
        q, k, v = (np.einsum("bse,ehd->bhsd", x, a[n]["kernel"]) + a[n]["bias"].transpose(0, 1)[None, :, None]
                   for n in ("query", "key", "value"))
        scores = np.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(dim) + bias[None]
        scores = np.where(keep, scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        context = np.einsum("bhqk,bhkd->bqhd", weights, v)
        attended = np.einsum("bqhd,hde->bqe", context, a["out"]["kernel"]) + a["out"]["bias"]
        x = layer_norm(x + attended, lp["attention_norm"]["scale"], lp["attention_norm"]["bias"], eps)
        m = lp["mlp"]
        gated = gelu(x @ m["wi_0"]["kernel"]) * (x @ m["wi_1"]["kernel"])  # gated_layers has no bias
        x = layer_norm(x + gated @ m["wo"]["kernel"] + m["wo"]["bias"], lp["mlp_norm"]["scale"],
                       lp["mlp_norm"]["bias"], eps)
    h = p["mlm_head"]
    t = gelu(x @ h["dense"]["kernel"] + h["dense"]["bias"])
    t = layer_norm(t, h["norm"]["scale"], h["norm"]["bias"], eps)
    return x, t @ e["word_embeddings"]["embedding"].T + h["decoder_bias"]


@pytest.fixture(scope="module")
def tiny():
    config = get_config("mosaicbert-tiny", max_position_embeddings=128)  # "trained" at 128
    model = bertjax.EncoderForMaskedLM(config)
    return config, model, random_bertjax_params(model, seed=0)


def batch(rows: int, seq: int, lengths, seed: int):
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = np.where(mask == 1, rng.integers(3, 128, (rows, seq)), 0)
    return ids, rng.integers(0, 2, (rows, seq)), mask


def test_model_matches_an_independent_numpy_forward(tiny):
    config, model, params = tiny
    ids, types, mask = batch(3, 40, (40, 23, 6), seed=1)
    out = jax.jit(model.apply)({"params": params}, ids, attention_mask=mask, token_type_ids=types)
    hidden, logits = numpy_mlm_forward(config, params, ids, types, mask)
    valid = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out.last_hidden_state)[valid], hidden[valid], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(out.logits)[valid], logits[valid], atol=1e-4, rtol=0)


def test_a_model_trained_at_128_runs_at_1024_like_the_dense_reference(tiny):
    config, model, params = tiny
    assert config.max_position_embeddings == 128
    ids, types, mask = batch(1, 1024, (1000,), seed=2)
    out = jax.jit(model.apply)({"params": params}, ids, attention_mask=mask, token_type_ids=types)
    assert np.all(np.isfinite(np.asarray(out.logits)))
    hidden, logits = numpy_mlm_forward(config, params, ids, types, mask)
    valid = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out.last_hidden_state)[valid], hidden[valid], atol=2e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(out.logits)[valid], logits[valid], atol=2e-4, rtol=0)


def test_presets_have_the_published_sizes():
    def count(preset):
        shapes = abstract_params(bertjax.EncoderForMaskedLM(get_config(preset)), seq_len=8)
        return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))

    base = get_config("mosaicbert-base")
    assert (base.position_embedding, base.mlp, base.activation, base.norm_placement) == ("alibi", "glu", "gelu",
                                                                                         "post")
    assert 136e6 < count("mosaicbert-base") < 139e6  # "MosaicBERT-Base (137M)"
    large = get_config("mosaicbert-large")
    assert (large.hidden_size, large.num_layers, large.num_heads) == (1024, 24, 16)


def test_alibi_with_rope_or_another_attention_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="read only with position_embedding='rope', not 'alibi'"):
        get_config("modernbert-tiny", position_embedding="alibi")  # its RoPE thetas would be ignored
    with pytest.raises(ValueError, match="read only with position_embedding='rope', not 'learned'"):
        get_config("bert-tiny", rope_theta_global=160_000.0)  # ModernBERT's long-context step on BERT: a no-op
    with pytest.raises(ValueError, match="position_embedding='alibi' needs attention_kind='standard'"):
        get_config("deberta-v3-tiny", position_embedding="alibi")
    with pytest.raises(ValueError, match="EncoderConfig.position_embedding must be"):
        get_config("mosaicbert-tiny", position_embedding="alibi+rope")


def test_the_bertjax_directory_round_trips(tiny, tmp_path):
    from bertjax.model_dirs import load_model_dir, save_model_dir

    config, model, params = tiny
    save_model_dir(tmp_path / "bj", model, params)
    loaded, loaded_params, _ = load_model_dir(tmp_path / "bj")
    assert loaded.config == config
    for a, b in zip(jax.tree.leaves(loaded_params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
