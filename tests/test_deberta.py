"""DeBERTa v1 / v2 / v3: the bucket function, the blockwise path against the dense one, Hugging Face parity and
round trips for every transformers DeBERTa architecture, and bad input.

Parity follows tests/test_hf_parity.py: tiny random transformers models with every parameter perturbed, float32,
outputs compared at real tokens within 1e-4. Sequences (40) are longer than the bucket and clamp ranges, so the
relative distances really clamp.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.config import DisentangledAttentionConfig, get_config
from bertjax.hf.deberta import pos_att_terms
from bertjax.ops.disentangled_attention import disentangled_attention, log_bucket, relative_index
from test_hf_parity import (LENGTHS, SEQ, VOCAB, assert_outputs_close, bertjax_outputs, padded_batch, perturb_,
                            reference_outputs)
from test_hf_task_heads import test_task_head_matches_transformers_and_round_trips as check_task_head

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
            max_position_embeddings=64, relative_attention=True)


def v3_config(**overrides):
    """DeBERTa-v3's layout: buckets (8, resolving up to 20 < SEQ), shared keys, relative LayerNorm, no positions."""
    return transformers.DebertaV2Config(**{**TINY, **dict(
        position_buckets=8, max_relative_positions=20, pos_att_type="p2c|c2p", share_att_key=True,
        norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0), **overrides})


def v2_config(**overrides):
    """v2's other knobs: convolution, separate position projections, factorised embedding, c2p only, new MLM head."""
    return v3_config(**{**dict(conv_kernel_size=3, share_att_key=False, norm_rel_ebd="none",
                               position_biased_input=True, type_vocab_size=2, pos_att_type=["c2p"], legacy=False),
                        **overrides})


def v1_config(**overrides):
    return transformers.DebertaConfig(**{**TINY, **dict(max_relative_positions=12, pos_att_type=["c2p", "p2c"],
                                                        position_biased_input=True, type_vocab_size=2), **overrides})


# (case id, transformers class, config factory)
CASES = [
    ("v3-mlm", "DebertaV2ForMaskedLM", v3_config),
    ("v3-model", "DebertaV2Model", v3_config),
    ("v2-conv-factorised-mlm", "DebertaV2ForMaskedLM", lambda: v2_config(embedding_size=24, legacy=True)),
    ("v2-conv-p2c-model", "DebertaV2Model", lambda: v2_config(pos_att_type=["p2c"])),
    ("v2-new-mlm-head", "DebertaV2ForMaskedLM", v2_config),
    ("v1-mlm", "DebertaForMaskedLM", v1_config),
    ("v1-model-p2c", "DebertaModel", lambda: v1_config(pos_att_type="p2c")),
]


def test_log_bucket_matches_transformers_and_a_plain_reference_including_the_clamped_range():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    distances = np.arange(-300, 301)
    ours = log_bucket(distances, 256, 512)
    theirs = make_log_bucket_position(torch.tensor(distances), 256, 512).numpy()
    np.testing.assert_array_equal(ours, theirs)
    # A plain per-distance reference: exact inside +-mid, else sign * (ceil(log(|d|/mid) / log((max-1)/mid) *
    # (mid-1)) + mid); then clamped into the table of 2 * span rows.
    mid, span = 4, 8
    expected = []
    for d in range(-39, 40):
        bucket = d if abs(d) <= mid else int(np.sign(d)) * (
            int(np.ceil(np.log(abs(d) / mid) / np.log((20 - 1) / mid) * (mid - 1))) + mid)
        expected.append(min(max(bucket + span, 0), 2 * span - 1))
    table = relative_index(40, 40, span, 8, 20)
    np.testing.assert_array_equal(table, expected)
    # The far distances of both signs land on the clamped first and last rows.
    assert (table == 0).sum() > 1 and (table == 2 * span - 1).sum() > 1
    # Without buckets (v1): distances clamp at the span.
    np.testing.assert_array_equal(relative_index(5, 5, 2, 0, 2), [0, 0, 0, 1, 2, 3, 3, 3, 3])


def test_pos_att_type_reads_the_list_and_the_string_form():
    assert pos_att_terms(["c2p", "p2c"]) == ("c2p", "p2c")
    assert pos_att_terms("p2c|c2p") == ("p2c", "c2p")
    assert pos_att_terms("C2P") == ("c2p",)
    with pytest.raises(ValueError, match="p2p"):
        pos_att_terms("c2p|p2p")


def test_blockwise_equals_dense_with_packing_and_padding_in_value_and_gradient():
    rng = np.random.default_rng(0)
    b, s, h, d, span = 2, 45, 2, 8, 8
    q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.float32) for _ in range(3))
    pos_key, pos_query = (jnp.asarray(rng.standard_normal((2 * span, h, d)), jnp.float32) for _ in range(2))
    seg = np.ones((b, s), np.int32)
    seg[0, 20:] = 2
    seg[1, 38:] = 0
    seg = jnp.asarray(seg)

    def run(implementation, q, k, v, pos_key, pos_query):
        out = disentangled_attention(q, k, v, pos_key, pos_query, segment_ids=seg, span=span, buckets=span,
                                     max_position=20, implementation=implementation, block_size=16)
        return jnp.sum(jnp.where(seg[..., None, None] > 0, out, 0.0) ** 2), out

    grad = lambda name: jax.jit(jax.value_and_grad(lambda *a: run(name, *a), argnums=(0, 1, 2, 3, 4),
                                                   has_aux=True))(q, k, v, pos_key, pos_query)
    (_, dense), dense_grads = grad("dense")
    (_, block), block_grads = grad("blockwise")
    real = np.asarray(seg) > 0
    np.testing.assert_allclose(np.asarray(block)[real], np.asarray(dense)[real], atol=1e-5)
    for ours, theirs in zip(block_grads, dense_grads):
        np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_blockwise_memory_grows_linearly_and_dense_quadratically():
    """Compiled temporary memory of one attention call: the blockwise path's grows ~2x per doubling, the dense
    path's ~4x (its [batch, heads, seq, seq] scores)."""
    h, d, span = 2, 8, 16

    def temp_bytes(implementation: str, seq: int) -> int:
        spec = jax.ShapeDtypeStruct((1, seq, h, d), jnp.float32)
        table = jax.ShapeDtypeStruct((2 * span, h, d), jnp.float32)
        fn = lambda q, k, v, pk, pq, seg: disentangled_attention(
            q, k, v, pk, pq, segment_ids=seg, span=span, buckets=span, max_position=64,
            implementation=implementation, block_size=64)
        compiled = jax.jit(fn).lower(spec, spec, spec, table, table,
                                     jax.ShapeDtypeStruct((1, seq), jnp.int32)).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    block = [temp_bytes("blockwise", seq) for seq in (1024, 2048)]
    dense = [temp_bytes("dense", seq) for seq in (1024, 2048)]
    assert block[1] / block[0] < 2.6, block
    assert dense[1] / dense[0] > 3.0, dense  # quadratic (plus linear terms)
    assert block[1] * 8 < dense[1], (block, dense)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    built = {}

    def get(case_id: str):
        if case_id not in built:
            _, class_name, make_config = next(case for case in CASES if case[0] == case_id)
            torch.manual_seed(0)
            model = getattr(transformers, class_name)(make_config()).eval()
            perturb_(model, seed=1)
            directory = str(tmp_path_factory.mktemp(case_id))
            model.save_pretrained(directory)
            built[case_id] = model, directory
        return built[case_id]

    return get


@pytest.mark.parametrize("case_id", [case[0] for case in CASES])
def test_matches_transformers_and_round_trips(case_id, checkpoint, tmp_path):
    reference, directory = checkpoint(case_id)
    model, params = bertjax.from_pretrained(directory, dtype=jnp.float32)
    assert model.config.attention_kind == "disentangled"
    assert SEQ > model.config.disentangled.span  # distances beyond the table: the clamp is exercised
    ids, mask = padded_batch(LENGTHS, SEQ, reference.config.pad_token_id, seed=2)
    types = np.random.default_rng(3).integers(0, 2, ids.shape) if reference.config.type_vocab_size else None
    expected = reference_outputs(reference, ids, mask, types)
    assert_outputs_close(bertjax_outputs(model, params, ids, mask, types), expected, mask)
    if types is None:  # the token_type_ids DeBERTa's tokenizers return: taken and unread, as by transformers
        pair_types = np.random.default_rng(3).integers(0, 2, ids.shape)
        assert_outputs_close(bertjax_outputs(model, params, ids, mask, pair_types),
                             reference_outputs(reference, ids, mask, pair_types), mask)

    # bertjax -> transformers: the same class, every tensor consumed, the same outputs; and back to the same config.
    bertjax.save_pretrained(str(tmp_path), model, params)
    reloaded, info = type(reference).from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    again = reference_outputs(reloaded.eval(), ids, mask, types)
    for name in expected:
        np.testing.assert_allclose(again[name][mask.astype(bool)] if again[name].ndim > 2 else again[name],
                                   expected[name][mask.astype(bool)] if expected[name].ndim > 2 else expected[name],
                                   atol=1e-6, rtol=0)
    assert bertjax.from_pretrained(str(tmp_path))[0].config == model.config


def test_pos_att_type_string_in_config_json_reads_as_the_list(checkpoint, tmp_path):
    _, directory = checkpoint("v3-model")
    listed, _ = bertjax.from_pretrained(directory)
    with open(f"{directory}/config.json") as f:
        values = json.load(f)
    assert isinstance(values["pos_att_type"], list)
    values["pos_att_type"] = "|".join(values["pos_att_type"])
    (tmp_path / "config.json").write_text(json.dumps(values))
    (tmp_path / "model.safetensors").symlink_to(f"{directory}/model.safetensors")
    stringed, _ = bertjax.from_pretrained(str(tmp_path))
    assert stringed.config == listed.config


@pytest.mark.parametrize("prefix,factory,head", [
    ("DebertaV2", v3_config, "sequence_classification"),
    ("DebertaV2", lambda: v3_config(pooler_hidden_act="tanh"), "sequence_classification"),  # ContextPooler's act
    ("DebertaV2", v3_config, "token_classification"),
    ("DebertaV2", v3_config, "question_answering"),
    ("DebertaV2", v2_config, "multiple_choice"),
    ("Deberta", v1_config, "sequence_classification"),
    ("Deberta", v1_config, "token_classification"),
    ("Deberta", v1_config, "question_answering"),
])
def test_task_heads_match_transformers_and_round_trip(prefix, factory, head, tmp_path):
    token_types = factory().type_vocab_size > 0
    check_task_head(prefix.lower(), prefix, factory, head, token_types, tmp_path)


def test_sequence_longer_than_the_model_represents_is_a_clear_error_naming_input_ids():
    v1 = get_config("deberta-base", vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=16,
                    max_position_embeddings=16, position_embedding="learned")
    model = bertjax.EncoderModel(v1)
    with pytest.raises(ValueError, match="input_ids: sequence length 17 exceeds"):
        jax.eval_shape(model.init, jax.random.key(0), jnp.ones((1, 17), jnp.int32))
    # Without absolute positions the relative distances clamp, so DeBERTa-v3 takes any length (as transformers).
    v3 = get_config("deberta-v3-tiny")
    ids = jnp.ones((1, v3.max_position_embeddings + 8), jnp.int32)
    out = jax.eval_shape(bertjax.EncoderModel(v3).init_with_output, jax.random.key(0), ids)[0]
    assert out.last_hidden_state.shape == (1, 72, 32)
    # XLNet's permutation inputs have no meaning here: an error naming the input and the attention kind.
    for name, shape in (("perm_mask", (1, 8, 8)), ("target_mapping", (1, 2, 8))):
        with pytest.raises(ValueError, match=f"{name} is an XLNet input.*attention_kind='disentangled'"):
            jax.eval_shape(bertjax.EncoderModel(v3).init, jax.random.key(0), ids[:, :8], **{name: jnp.zeros(shape)})


def test_config_refuses_impossible_combinations_naming_the_field():
    with pytest.raises(ValueError, match="EncoderConfig.disentangled must be set"):
        get_config("bert-tiny", attention_kind="disentangled")
    with pytest.raises(ValueError, match="pos_att_type"):
        DisentangledAttentionConfig(pos_att_type=("c2p", "c2q"))
    with pytest.raises(ValueError, match="conv_kernel_size"):
        DisentangledAttentionConfig(conv_kernel_size=2)
    with pytest.raises(ValueError, match="position_buckets"):
        DisentangledAttentionConfig(position_buckets=1)
