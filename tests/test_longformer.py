"""Longformer: parity with transformers' Longformer classes, round trips, global tokens in packed rows, errors.

The reference is transformers on tiny random-weight models with every parameter perturbed, windows (8 and 16)
shorter than the sequence (37, not a multiple of either), right padding, per-row global tokens, and a row whose
only global token is padding. Outputs are compared in float32 at real tokens (ATOL from test_hf_parity).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.config import LongformerOptions, get_config
from test_hf_parity import ATOL, VOCAB, perturb_, random_bertjax_params

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SEQ, LENGTHS, WINDOWS = 37, (37, 30, 11), [8, 16]


def longformer_config(**overrides):
    values = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                  max_position_embeddings=SEQ + 16 + 2, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
                  attention_window=WINDOWS, attn_implementation="eager")
    return transformers.LongformerConfig(**{**values, **overrides})


def batch(seed: int = 2, rows=LENGTHS):
    """ids, attention mask and global mask: row 0 has globals at 0 and 20, row 1 at 3 (inside its windows' reach
    of real tokens), row 2's only global token (15) is padding."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(SEQ)[None] < np.asarray(rows)[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(3, VOCAB, mask.shape), 1)
    glob = np.zeros_like(mask)
    glob[0, [0, 20]] = 1
    glob[1, 3] = 1
    glob[2, 15] = 1
    return ids, mask, glob


def torch_outputs(model, **inputs) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model(**{name: torch.tensor(value) for name, value in inputs.items() if value is not None})
    names = ("last_hidden_state", "pooler_output", "logits", "start_logits", "end_logits")
    return {name: getattr(out, name).numpy() for name in names if getattr(out, name, None) is not None}


def assert_close(ours, theirs: dict[str, np.ndarray], mask: np.ndarray, atol: float = ATOL) -> None:
    for name, expected in theirs.items():
        actual = np.asarray(getattr(ours, name))
        assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
        if actual.shape[:mask.ndim] == mask.shape:  # per token: real tokens only
            actual, expected = actual[mask.astype(bool)], expected[mask.astype(bool)]
        assert np.all(np.isfinite(actual)), name
        diff = float(np.max(np.abs(actual - expected)))
        assert diff <= atol, f"{name}: max abs diff {diff:.3g} > {atol}"


def load_dense(directory):
    """The checkpoint as a bertjax model on the dense `xla` attention, run eagerly: the parity tests check the model's
    math (every implementation is held to the dense one in test_attention_features.py), and op-by-op dispatch of the
    dense path reuses its compiled kernels across these tests ([3, 37] batches everywhere)."""
    model, params = bertjax.from_pretrained(str(directory), dtype=jnp.float32)
    return type(model)(model.config.replace(attention_implementation="xla")), params


def reference(class_name: str, directory, **overrides):
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(longformer_config(**overrides)).eval()
    perturb_(model, seed=1)
    model.save_pretrained(str(directory))
    return model


def assert_exports_with_the_same_outputs(model, params, ref, tmp_path, expected, ids, mask, glob):
    """bertjax -> transformers: the reference's class loads the export with every tensor consumed and gives the
    same outputs (1e-6)."""
    bertjax.save_pretrained(str(tmp_path / "bj"), model, params)
    reloaded, info = type(ref).from_pretrained(str(tmp_path / "bj"), output_loading_info=True,
                                               attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    again = torch_outputs(reloaded.eval(), input_ids=ids, attention_mask=mask, global_attention_mask=glob)
    for name in expected:
        np.testing.assert_allclose(again[name], expected[name], atol=1e-6, rtol=0)


@pytest.mark.parametrize("class_name", ["LongformerModel", "LongformerForMaskedLM"])
def test_matches_transformers_and_round_trips(class_name, tmp_path):
    ref = reference(class_name, tmp_path / "hf")
    model, params = load_dense(tmp_path / "hf")
    assert model.config.attention_kind == "longformer"
    assert model.config.longformer.attention_window == tuple(WINDOWS)
    assert SEQ > max(WINDOWS) and SEQ % 8 and SEQ % 16  # the windows mask; transformers pads to 48 inside
    ids, mask, glob = batch()
    expected = torch_outputs(ref, input_ids=ids, attention_mask=mask, global_attention_mask=glob)
    apply = model.apply
    ours = apply({"params": params}, ids, attention_mask=mask, global_attention_mask=glob)
    assert_close(ours, expected, mask)
    # Without global tokens the model is purely local, in both.
    assert_close(apply({"params": params}, ids, attention_mask=mask),
                 torch_outputs(ref, input_ids=ids, attention_mask=mask), mask)

    # bertjax -> transformers: the same class, every tensor consumed, the same outputs; back to the same config.
    assert_exports_with_the_same_outputs(model, params, ref, tmp_path, expected, ids, mask, glob)
    assert bertjax.from_pretrained(str(tmp_path / "bj"))[0].config == model.config.replace(
        attention_implementation="auto")


HEADS = {"sequence_classification": "LongformerForSequenceClassification",
         "token_classification": "LongformerForTokenClassification",
         "question_answering": "LongformerForQuestionAnswering",
         "multiple_choice": "LongformerForMultipleChoice"}


@pytest.mark.parametrize("head", sorted(HEADS))
def test_task_heads_match_transformers_and_round_trip(head, tmp_path):
    ref = reference(HEADS[head], tmp_path / "hf", num_labels=2 if head == "question_answering" else 3)
    model, params = load_dense(tmp_path / "hf")
    assert type(model) is bertjax.MODEL_CLASSES[head]
    ids, mask, glob = batch()
    if head in ("sequence_classification", "question_answering", "multiple_choice"):
        # No mask: both put global attention on the first token (classification), on the question before the
        # first separator (QA) or on the answer after the separator pair (multiple choice). transformers wants
        # exactly three separators per row: <s> question </s></s> answer </s>.
        glob = None
        for row, length in enumerate(LENGTHS):
            ids[row, [4, 5, length - 1]] = 2
    if head == "multiple_choice":  # [batch=1, choices=3, seq]: the same [3, seq] rows inside
        ids, mask = ids[None], mask[None]
    expected = torch_outputs(ref, input_ids=ids, attention_mask=mask, global_attention_mask=glob)
    ours = model.apply({"params": params}, ids, attention_mask=mask, global_attention_mask=glob)
    assert_close(ours, expected, mask)
    assert_exports_with_the_same_outputs(model, params, ref, tmp_path, expected, ids, mask, glob)


@pytest.fixture(scope="module")
def tiny():
    model = bertjax.EncoderModel(get_config("longformer-tiny", vocab_size=VOCAB))
    return model, random_bertjax_params(model, seed=3)


def test_global_tokens_in_several_packed_segments_equal_the_documents_alone(tiny):
    model, params = tiny
    rng = np.random.default_rng(5)
    docs = [rng.integers(3, VOCAB, n) for n in (19, 14)]
    doc_globals = [[0, 9], [2]]
    # Row 0 packs both documents (and 4 padding tokens); rows 1 and 2 hold each document alone, right-padded.
    ids = np.ones((3, SEQ), np.int64)
    segments = np.zeros((3, SEQ), np.int32)
    glob = np.zeros((3, SEQ), np.int64)
    start = 0
    for d, (doc, positions) in enumerate(zip(docs, doc_globals)):
        ids[0, start:start + len(doc)], segments[0, start:start + len(doc)] = doc, d + 1
        glob[0, [start + p for p in positions]] = 1
        ids[d + 1, :len(doc)], segments[d + 1, :len(doc)], glob[d + 1, positions] = doc, 1, 1
        start += len(doc)
    out = np.asarray(jax.jit(model.apply)({"params": params}, ids, segment_ids=segments,
                                          global_attention_mask=glob).last_hidden_state)
    start = 0
    for d, doc in enumerate(docs):
        np.testing.assert_allclose(out[0, start:start + len(doc)], out[d + 1, :len(doc)], atol=2e-5)
        start += len(doc)


def test_blockwise_with_a_bound_on_global_tokens_under_jit_equals_the_dense_model(tiny):
    model, params = tiny
    ids, mask, glob = batch()
    dense = bertjax.EncoderModel(model.config.replace(attention_implementation="xla"))  # eager, few kernels
    expected = dense.apply({"params": params}, ids, attention_mask=mask, global_attention_mask=glob)
    bounded = bertjax.EncoderModel(model.config.replace(longformer={"max_global_tokens": 2}))
    assert bounded.config.attention_implementation == "auto"  # xla_blockwise here: windows <= half the length
    jitted = jax.jit(bounded.apply)({"params": params}, ids, attention_mask=mask, global_attention_mask=glob)
    valid = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(jitted.last_hidden_state)[valid],
                               np.asarray(expected.last_hidden_state)[valid], atol=2e-5)
    too_few = bertjax.EncoderModel(model.config.replace(longformer={"max_global_tokens": 1}))
    with pytest.raises(ValueError, match="max_global_tokens=1"):  # checked on a concrete mask
        too_few.apply({"params": params}, ids, attention_mask=mask, global_attention_mask=glob)
    # and on a traced one by bertjax.checked (a plain jit drops the global tokens past the bound)
    checked = bertjax.checked(lambda p, i, m, g: too_few.apply({"params": p}, i, attention_mask=m,
                                                              global_attention_mask=g).last_hidden_state)
    with pytest.raises(ValueError, match=r"global_attention_mask: a row has more global tokens than "
                                         r"max_global_tokens=1 .*; got 2"):
        checked(params, ids, mask, glob)
    assert np.isfinite(checked(params, ids, mask, glob * (np.cumsum(glob, 1) <= 1))).all()  # within the bound


def test_bad_inputs_are_clear_errors_naming_the_field(tiny):
    bert = bertjax.EncoderModel(get_config("bert-tiny"))
    with pytest.raises(ValueError, match="global_attention_mask is a Longformer input"):
        bert.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32), global_attention_mask=jnp.ones((1, 4)))
    with pytest.raises(ValueError, match=r"attention_window\[1\]=7 must be positive and even"):
        LongformerOptions(attention_window=(8, 7))
    with pytest.raises(ValueError, match="attention_window=5 must be positive and even"):
        get_config("longformer-tiny", longformer={"attention_window": 5})
    with pytest.raises(ValueError, match="3 windows for num_layers=2"):
        get_config("longformer-tiny", longformer=LongformerOptions(attention_window=(8, 8, 8)))
    values = longformer_config(attention_window=[8, 7]).to_dict() | {"architectures": ["LongformerModel"]}
    with pytest.raises(ValueError, match="attention_window"):
        bertjax.hf.registry.architecture(values)[0].encoder_config(values, "encoder")
    model, params = tiny
    with pytest.raises(ValueError, match="global_attention_mask must have the shape of input_ids"):
        model.apply({"params": params}, np.ones((1, 6), np.int32), global_attention_mask=np.ones((1, 5)))


def test_init_from_roberta_tiles_positions_and_copies_global_projections(tmp_path):
    from bertjax.models.params import abstract_params
    from bertjax.train.init_from import initial_params

    roberta = bertjax.EncoderForMaskedLM(get_config("roberta-tiny", vocab_size=VOCAB))  # 66 = 2 + 64 positions
    source = random_bertjax_params(roberta, seed=7)
    bertjax.save_pretrained(str(tmp_path), roberta, source)
    target_config = get_config("longformer-tiny", vocab_size=VOCAB)  # 258 = 2 + 4 * 64 positions
    target = bertjax.EncoderForMaskedLM(target_config)
    params = initial_params(str(tmp_path), target_config, abstract_params(target), None)
    table, old = np.asarray(params["embeddings"]["position_embeddings"]["embedding"]), np.asarray(
        source["embeddings"]["position_embeddings"]["embedding"])
    assert table.shape == (258, 32)
    np.testing.assert_array_equal(table[:66], old)
    for k in range(1, 4):  # position 2 + 64 k + i starts as position 2 + i
        np.testing.assert_array_equal(table[2 + 64 * k:2 + 64 * (k + 1)], old[2:])
    for layer in ("layers_0", "layers_1"):
        attention = params["encoder"][layer]["attention"]
        for name in ("query", "key", "value"):
            np.testing.assert_array_equal(attention[f"{name}_global"]["kernel"], attention[name]["kernel"])
            np.testing.assert_array_equal(attention[name]["bias"],
                                          source["encoder"][layer]["attention"][name]["bias"])
    np.testing.assert_array_equal(params["mlm_head"]["decoder_bias"], source["mlm_head"]["decoder_bias"])
    with pytest.raises(ValueError, match="model.init_from: parameter embeddings/word_embeddings/embedding"):
        wider = get_config("longformer-tiny", vocab_size=VOCAB + 1)
        initial_params(str(tmp_path), wider, abstract_params(bertjax.EncoderForMaskedLM(wider)), None)


# ---------------------------------------------------------------------------------------------------------------
# The global-token bound fine-tuning and predict give their steps


def _task_model(head, **config):
    model = bertjax.MODEL_CLASSES[head](get_config("longformer-tiny", vocab_size=VOCAB, **config).replace(
        task=bertjax.TaskConfig(num_labels=2)))
    return model, random_bertjax_params(model, seed=4)


def _separated_rows(question_lengths, seq=SEQ):
    """<s> question </s></s> answer </s> rows, right-padded: the question holds question_lengths[i] tokens."""
    ids = np.full((len(question_lengths), seq), 1)
    segments = np.zeros((len(question_lengths), seq), np.int32)
    for row, q in enumerate(question_lengths):
        length = q + 12
        ids[row, :length] = np.arange(3, 3 + length) % (VOCAB - 3) + 3
        ids[row, [0, q + 1, q + 2, length - 1]] = [0, 2, 2, 2]
        segments[row, :length] = 1
    return ids, segments


@pytest.mark.parametrize("head, bound", [("sequence_classification", 1), ("question_answering", 9),
                                         ("multiple_choice", 9)])
def test_a_task_heads_default_global_tokens_are_bounded_by_the_data(head, bound):
    from bertjax.models.task_models import with_global_token_bound

    model, params = _task_model(head)
    ids, segments = _separated_rows([4, 8, 2])  # questions of 4, 8 and 2 tokens after <s>
    if head == "multiple_choice":  # 3 choices of one question; each answer (9 tokens after </s></s>) is global
        ids, segments = ids[None], segments[None]
    bounded = with_global_token_bound(model, {"input_ids": ids, "segment_ids": segments})
    assert bounded.config.longformer.max_global_tokens == bound
    assert model.config.longformer.max_global_tokens is None  # the saved model keeps no bound
    # Under jit, the bounded program gives what the model gives on the concrete mask (exact slots).
    expected = model.apply({"params": params}, ids, segment_ids=segments)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "traced without a bound" warning
        jitted = jax.jit(bounded.apply)({"params": params}, ids, segment_ids=segments)
    for name in ("logits", "start_logits"):
        if hasattr(expected, name):
            np.testing.assert_allclose(np.asarray(getattr(jitted, name)), np.asarray(getattr(expected, name)),
                                       atol=2e-5)


def test_packed_rows_bound_by_their_segments_and_a_subclass_keeps_its_heads_mask():
    from bertjax.models.task_models import with_global_token_bound

    class MyClassifier(bertjax.MODEL_CLASSES["sequence_classification"]):
        pass

    model, params = _task_model("sequence_classification")
    mine = MyClassifier(model.config)
    ids = np.full((2, SEQ), 5)
    segments = np.zeros((2, SEQ), np.int32)
    segments[0, :30] = np.repeat([1, 2, 3], 10)  # three packed examples: a global <s> each
    segments[1, :12] = 1
    assert with_global_token_bound(mine, {"input_ids": ids, "segment_ids": segments}
                                   ).config.longformer.max_global_tokens == 3
    np.testing.assert_array_equal(mine.apply({"params": params}, ids, segment_ids=segments, max_segments=3).logits,
                                  model.apply({"params": params}, ids, segment_ids=segments, max_segments=3).logits)


def test_a_bound_of_the_models_own_that_the_data_exceeds_is_refused():
    from bertjax.models.task_models import with_global_token_bound

    model, _ = _task_model("question_answering", longformer=LongformerOptions(attention_window=8, max_global_tokens=5))
    ids, segments = _separated_rows([4, 8])
    with pytest.raises(ValueError, match=r"a row of the data has 9 global tokens .* more than the model's "
                                         r"longformer.max_global_tokens=5"):
        with_global_token_bound(model, {"input_ids": ids, "segment_ids": segments})
    assert with_global_token_bound(model, {"input_ids": ids[:1], "segment_ids": segments[:1]}) is model


def test_the_bounded_classifier_is_linear_in_the_length_under_jit():
    from bertjax.models.task_models import with_global_token_bound

    model, params = _task_model("sequence_classification", max_position_embeddings=1024 + 2)
    ids, segments = np.full((1, 1024), 5), np.ones((1, 1024), np.int32)
    bounded = with_global_token_bound(model, {"input_ids": ids, "segment_ids": segments})

    def temporary_bytes(m):
        compiled = jax.jit(m.apply).lower({"params": params}, ids, segment_ids=segments).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        linear = temporary_bytes(bounded)
    with pytest.warns(UserWarning, match=r"traced without a bound .* every one of the 1024 positions is a global "
                                         r"slot, a \[seq, seq\] program"):
        quadratic = temporary_bytes(model)
    # The unbounded program scores every position against every key ([heads, 1024, 1024] floats per layer).
    assert quadratic > 4 * linear, (quadratic, linear)


def test_multiple_choice_global_tokens_follow_the_pair_templates_separators():
    """transformers puts the choice after `</s></s>`: positions past the first separator + 1. With one separator
    (a BERT-style template: bertjax's own tokenizer) that dropped the choice's first token from the global set."""
    from bertjax.models.task_models import around_first_separator

    bert_style = np.asarray([[2, 7, 8, 3, 9, 10, 3, 0]])  # [CLS] q q [SEP] c c [SEP] pad, sep 3
    roberta_style = np.asarray([[0, 7, 8, 2, 2, 9, 10, 2]])  # <s> q q </s></s> c c </s>, sep 2
    np.testing.assert_array_equal(around_first_separator(bert_style, 3, before=False), [[0, 0, 0, 0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(around_first_separator(roberta_style, 2, before=False), [[0, 0, 0, 0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(around_first_separator(bert_style, 3, before=True), [[1, 1, 1, 0, 0, 0, 0, 0]])
