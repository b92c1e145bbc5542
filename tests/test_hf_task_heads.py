"""Fine-tuning heads: parity with transformers' {Family}For{SequenceClassification, TokenClassification,
QuestionAnswering, MultipleChoice}, round trips, packed == padded, and starting a task head from an encoder.

The reference is transformers on tiny random-weight models with every parameter perturbed (biases and norm
scales too), right-padded batches, outputs compared at real tokens in float32 (ATOL from test_hf_parity).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax import TaskConfig
from test_hf_parity import random_bertjax_params

# Each packed example is one segment; the padded batch holds the same examples one per row.
EXAMPLE_LENGTHS = (5, 3, 7, 4)
PACKED_ROWS = ((0, 1, 2), (3,))  # example indices per packed row
PACKED_SEQ, PADDED_SEQ, MAX_SEGMENTS = 16, 8, 3


def packed_and_padded(seed: int = 0):
    rng = np.random.default_rng(seed)
    examples = [rng.integers(3, 100, n) for n in EXAMPLE_LENGTHS]
    padded = np.zeros((len(examples), PADDED_SEQ), np.int32)
    mask = np.zeros_like(padded)
    for i, ex in enumerate(examples):
        padded[i, :len(ex)], mask[i, :len(ex)] = ex, 1
    packed = np.zeros((len(PACKED_ROWS), PACKED_SEQ), np.int32)
    segments = np.zeros_like(packed)
    for r, members in enumerate(PACKED_ROWS):
        at = 0
        for k, i in enumerate(members):
            packed[r, at:at + len(examples[i])], segments[r, at:at + len(examples[i])] = examples[i], k + 1
            at += len(examples[i])
    return padded, mask, packed, segments


@pytest.mark.parametrize("preset,pooling", [("bert-tiny", "cls"), ("modernbert-tiny", "mean"),
                                            ("eurobert-tiny", "late")])
def test_packed_rows_give_the_padded_logits(preset, pooling):
    config = bertjax.get_config(preset, vocab_size=100, task=TaskConfig(num_labels=3, classifier_pooling=pooling))
    model = bertjax.EncoderForSequenceClassification(config)
    params = random_bertjax_params(model, seed=1)
    padded, mask, packed, segments = packed_and_padded()
    apply = jax.jit(model.apply, static_argnames="max_segments")  # one compile per shape, not one per op
    expected = apply({"params": params}, jnp.asarray(padded), attention_mask=jnp.asarray(mask)).logits
    out = apply({"params": params}, jnp.asarray(packed), segment_ids=jnp.asarray(segments),
                max_segments=MAX_SEGMENTS)
    assert out.logits.shape == (len(PACKED_ROWS), MAX_SEGMENTS, 3) and out.logits.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out.segment_mask), [[True, True, True], [True, False, False]])
    for r, members in enumerate(PACKED_ROWS):
        for k, i in enumerate(members):
            np.testing.assert_allclose(np.asarray(out.logits[r, k]), np.asarray(expected[i]), atol=2e-5)
    np.testing.assert_array_equal(np.asarray(out.logits[1, 1:]), 0.0)  # empty slots are zeros


# ---------------------------------------------------------------------------------------------------------------
# Parity with transformers and round trip, every family x head transformers has.

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hf_parity import ATOL, TINY, VOCAB, bert_config, modernbert_config, perturb_, roberta_config  # noqa: E402
from test_hf_family_albert_distilbert import albert_config, distilbert_config  # noqa: E402

LENGTHS, SEQ, CHOICES = (12, 9, 4), 12, 3
LABELS = {"sequence_classification": ("neg", "neutral", "pos"), "token_classification": ("O", "B-X", "I-X", "B-Y")}
CLASS_SUFFIX = {"sequence_classification": "SequenceClassification", "token_classification": "TokenClassification",
                "question_answering": "QuestionAnswering", "multiple_choice": "MultipleChoice"}


def electra_config(**overrides):
    return transformers.ElectraConfig(**{**dict(**TINY, embedding_size=24, num_hidden_layers=2, intermediate_size=48,
                                                 hidden_act="gelu_new", max_position_embeddings=40,
                                                 attn_implementation="eager"), **overrides})


def eurobert_config(**overrides):
    return transformers.EuroBertConfig(**{**dict(
        **TINY, num_hidden_layers=2, num_key_value_heads=2, head_dim=12, intermediate_size=40,
        max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 500.0}, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, mask_token_id=3, attn_implementation="eager"), **overrides})


ALL = tuple(CLASS_SUFFIX)
# (case id, transformers class prefix, config factory, heads, whether the family has token types)
FAMILY_CASES = [
    ("bert", "Bert", bert_config, ALL, True),
    ("roberta", "Roberta", roberta_config, ALL, False),
    ("albert", "Albert", albert_config, ALL, True),
    ("distilbert", "DistilBert", distilbert_config, ALL, False),
    ("electra", "Electra", electra_config, ALL, True),
    ("eurobert-late", "EuroBert", eurobert_config, ("sequence_classification", "token_classification"), False),
    ("eurobert-bos", "EuroBert", lambda: eurobert_config(classifier_pooling="bos"), ("sequence_classification",),
     False),
    ("eurobert-mean", "EuroBert", lambda: eurobert_config(classifier_pooling="mean", mlp_bias=True),
     ("sequence_classification",), False),
    ("modernbert-cls", "ModernBert", lambda: modernbert_config(3, 2, 8), ALL, False),
    ("modernbert-mean-biases", "ModernBert",
     lambda: modernbert_config(3, 2, 8, classifier_pooling="mean", norm_bias=True, classifier_bias=True,
                               classifier_activation="gelu_new"), ("sequence_classification", "multiple_choice"),
     False),
]
PARITY_CASES = [(case, prefix, factory, head, types) for case, prefix, factory, heads, types in FAMILY_CASES
                for head in heads]


def task_batch(head: str, pad_id: int, token_types: bool, seed: int = 2):
    """ids, mask and extra inputs: [batch, seq], or [batch, choices, seq] for multiple choice."""
    rng = np.random.default_rng(seed)
    lengths = np.array(LENGTHS if head != "multiple_choice" else [LENGTHS, LENGTHS[::-1]])
    shape = lengths.shape + (SEQ,)
    mask = (np.arange(SEQ) < lengths[..., None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(3, VOCAB, shape), pad_id)
    extra = {"token_type_ids": rng.integers(0, 2, shape)} if token_types else {}
    return ids, mask, extra


def hf_outputs(model, ids, mask, extra) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    **{k: torch.tensor(v) for k, v in extra.items()})
    names = ("start_logits", "end_logits") if hasattr(out, "start_logits") else ("logits",)
    return {name: getattr(out, name).numpy() for name in names}


def assert_close(ours, theirs: dict[str, np.ndarray], mask: np.ndarray, head: str) -> None:
    for name, expected in theirs.items():
        actual = np.asarray(getattr(ours, name))
        assert actual.shape == expected.shape and actual.dtype == np.float32, (name, actual.shape, expected.shape)
        if head in ("token_classification", "question_answering"):  # per token: real tokens only
            actual, expected = actual[mask.astype(bool)], expected[mask.astype(bool)]
        diff = float(np.max(np.abs(actual - expected)))
        assert diff <= ATOL, f"{name}: max abs diff {diff:.3g} > {ATOL}"


def build_reference(prefix: str, factory, head: str, directory: str):
    hf_config = factory()
    if head in LABELS:
        hf_config.id2label = dict(enumerate(LABELS[head]))
        hf_config.label2id = {name: i for i, name in enumerate(LABELS[head])}
    if head == "sequence_classification":
        hf_config.problem_type = "multi_label_classification"
    torch.manual_seed(0)
    model = getattr(transformers, f"{prefix}For{CLASS_SUFFIX[head]}")(hf_config).eval()
    perturb_(model, seed=1)
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize("case,prefix,factory,head,token_types", PARITY_CASES,
                         ids=[f"{c[0]}-{c[3]}" for c in PARITY_CASES])
def test_task_head_matches_transformers_and_round_trips(case, prefix, factory, head, token_types, tmp_path):
    reference = build_reference(prefix, factory, head, str(tmp_path / "hf"))
    model, params = bertjax.from_pretrained(str(tmp_path / "hf"))
    assert type(model) is bertjax.MODEL_CLASSES[head]
    task = model.config.task
    if head in LABELS:
        assert task.labels == LABELS[head] and task.num_labels == len(LABELS[head])
    assert task.problem_type == ("multi_label_classification" if head == "sequence_classification" else None)

    ids, mask, extra = task_batch(head, reference.config.pad_token_id, token_types)
    expected = hf_outputs(reference, ids, mask, extra)
    ours = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                                **{k: jnp.asarray(v) for k, v in extra.items()})
    assert_close(ours, expected, mask, head)

    # bertjax -> transformers: the same class, labels and problem type, every tensor consumed, equal outputs.
    bertjax.save_pretrained(str(tmp_path / "bj"), model, params)
    auto = getattr(transformers, f"AutoModelFor{CLASS_SUFFIX[head]}")
    reloaded, info = auto.from_pretrained(str(tmp_path / "bj"), output_loading_info=True,
                                          attn_implementation=reference.config._attn_implementation)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(reloaded) is type(reference)
    assert reloaded.config.id2label == reference.config.id2label
    assert reloaded.config.problem_type == reference.config.problem_type
    assert getattr(reloaded.config, "classifier_pooling", None) == getattr(reference.config, "classifier_pooling",
                                                                          None)
    again = hf_outputs(reloaded.eval(), ids, mask, extra)
    for name in expected:
        np.testing.assert_allclose(again[name], expected[name], atol=1e-6, rtol=0)
    again_model, _ = bertjax.from_pretrained(str(tmp_path / "bj"))
    assert again_model.config == model.config


# ---------------------------------------------------------------------------------------------------------------
# Starting a task head from an encoder or MLM checkpoint.

@pytest.mark.parametrize("source,target,reused", [
    ("BertForPreTraining", "sequence_classification", True),  # the pretrained pooler is the classifier's dense
    ("ModernBertModel", "token_classification", False),
    ("BertForSequenceClassification", "sequence_classification", True),  # 3 labels -> 5 (MNLI -> another task)
])
def test_encoder_checkpoint_into_task_head_initialises_only_the_head(source, target, reused, tmp_path, caplog):
    factory = (lambda: bert_config(num_labels=3)) if source.startswith("Bert") else lambda: modernbert_config(3, 2, 8)
    torch.manual_seed(0)
    reference = getattr(transformers, source)(factory()).eval()
    perturb_(reference, seed=1)
    reference.save_pretrained(str(tmp_path))
    base, base_params = bertjax.from_pretrained(str(tmp_path), head="encoder")
    with caplog.at_level("WARNING", logger="bertjax.hf.pretrained"):
        model, params = bertjax.from_pretrained(str(tmp_path), head=target, num_labels=5, labels=tuple("abcde"),
                                                seed=3)
    assert type(model) is bertjax.MODEL_CLASSES[target] and model.config.task.labels == tuple("abcde")
    message = caplog.text
    assert f"new {target} head" in message and "classifier/out/kernel" in message
    assert ("classifier/dense/kernel" in message) != reused
    # The backbone is the checkpoint's, parameter for parameter.
    for scope in ("embeddings", "encoder"):
        for a, b in zip(jax.tree.leaves(params[scope]), jax.tree.leaves(base_params[scope])):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if reused:  # the pooler's weights (BertForSequenceClassification uses them as transformers does)
        np.testing.assert_array_equal(np.asarray(params["classifier"]["dense"]["kernel"]),
                                      np.asarray(base_params["pooler"]["dense"]["kernel"]))
    if source.endswith("SequenceClassification"):
        assert "shape changed: ['classifier.weight', 'classifier.bias']" in message
    assert params["classifier"]["out"]["kernel"].shape == (32, 5)
    # Same encoder output as the bare model; the head is trained from here.
    ids, mask, _ = task_batch(target, reference.config.pad_token_id, token_types=False)
    out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    bare = jax.jit(base.apply)({"params": base_params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(out.last_hidden_state), np.asarray(bare.last_hidden_state))


def test_task_settings_refused_outside_task_heads_and_unknown_fields(tmp_path):
    torch.manual_seed(0)
    transformers.BertForMaskedLM(bert_config()).save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="need a task head"):
        bertjax.from_pretrained(str(tmp_path), num_labels=3)
    with pytest.raises(ValueError, match="TaskConfig has no field"):
        bertjax.from_pretrained(str(tmp_path), head="sequence_classification", num_label=3)


# ---------------------------------------------------------------------------------------------------------------
# Task settings: typed, hashable, round-tripped; export refuses what a family cannot write.

def test_task_config_is_typed_hashable_and_round_trips_through_json():
    import json

    task = TaskConfig(num_labels=3, labels=("a", "b", "c"), problem_type="single_label_classification",
                      classifier_dropout=0.1, classifier_pooling="mean")
    config = bertjax.get_config("modernbert-tiny", task=task)
    hash(config)  # a jit static argument
    assert task.id2label == {0: "a", 1: "b", 2: "c"} and task.label2id == {"a": 0, "b": 1, "c": 2}
    assert TaskConfig(num_labels=2).label_names == ("LABEL_0", "LABEL_1")
    assert bertjax.EncoderConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    for bad, match in [(dict(num_labels=2, labels=("a",)), "2 names|1 names"),
                       (dict(labels=["a", "b"]), "TaskConfig.labels"),
                       (dict(labels=("a", "a")), "distinct"),
                       (dict(problem_type="ranking"), "TaskConfig.problem_type"),
                       (dict(classifier_pooling="max"), "TaskConfig.classifier_pooling"),
                       (dict(num_labels=0), "TaskConfig.num_labels")]:
        with pytest.raises(ValueError, match=match):
            TaskConfig(**bad)


@pytest.mark.parametrize("preset,head,task,match", [
    ("bert-tiny", "sequence_classification", TaskConfig(classifier_pooling="mean"), "task.classifier_pooling"),
    ("modernbert-tiny", "sequence_classification", TaskConfig(classifier_pooling="late"), "task.classifier_pooling"),
    ("roberta-tiny", "question_answering", TaskConfig(num_labels=3), "task.num_labels=3"),
])
def test_export_refuses_task_settings_the_family_cannot_write(preset, head, task, match, tmp_path):
    model = bertjax.MODEL_CLASSES[head](bertjax.get_config(preset, task=task))
    with pytest.raises(ValueError, match=match):
        bertjax.save_pretrained(str(tmp_path), model, {})
    assert not list(tmp_path.iterdir())  # nothing written


def test_export_refuses_another_family_classifier_layout(tmp_path):
    model = bertjax.EncoderForSequenceClassification(bertjax.get_config("bert-tiny", classifier_activation="gelu"))
    with pytest.raises(ValueError, match="classifier_activation='gelu'"):
        bertjax.save_pretrained(str(tmp_path), model, {})
    with pytest.raises(ValueError, match="no bertjax head|no eurobert architecture"):
        bertjax.save_pretrained(str(tmp_path), bertjax.EncoderForQuestionAnswering(
            bertjax.get_config("eurobert-tiny")), {})


@pytest.mark.parametrize("preset", ["bert-tiny", "roberta-tiny", "albert-tiny", "distilbert-tiny",
                                    "electra-tiny-discriminator", "eurobert-tiny", "modernbert-tiny"])
def test_preset_sequence_classifier_exports_to_transformers_with_same_logits(preset, tmp_path):
    """Presets carry their family's classifier layout, so a head trained from a preset exports as is."""
    task = TaskConfig(num_labels=3, labels=("x", "y", "z"), problem_type="single_label_classification")
    config = bertjax.get_config(preset, vocab_size=VOCAB, task=task)
    model = bertjax.EncoderForSequenceClassification(config)
    params = random_bertjax_params(model, seed=4)
    bertjax.save_pretrained(str(tmp_path), model, params)
    reference, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(tmp_path), output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert reference.config.id2label == {0: "x", 1: "y", 2: "z"}
    ids, mask, _ = task_batch("sequence_classification", config.pad_token_id, token_types=False)
    ours = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    assert_close(ours, hf_outputs(reference.eval(), ids, mask, {}), mask, "sequence_classification")
