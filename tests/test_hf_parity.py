"""Numerical parity with transformers (PyTorch, CPU) on tiny randomly initialised models.

The reference is transformers itself: each case builds a model from a config, perturbs every parameter
(biases and norm scales included, so a mapping bug cannot hide behind zeros and ones), writes it with
`save_pretrained`, loads it with `bertjax.from_pretrained` and compares float32 outputs at non-padding positions.
The other direction (bertjax -> `save_pretrained` -> transformers) is checked the same way.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.hf.pretrained import expected_params
from flax import traverse_util

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4  # float32, max abs difference
VOCAB = 100
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4)


def perturb_(model, seed: int, weight_std: float = 0.02) -> None:
    """Add N(0, 0.02) noise to every parameter; the matrices outside the embeddings get N(0, weight_std).

    A larger weight_std (see LARGE_WEIGHTS) makes the layers' pre-activations O(1). There the activation forms
    differ (tanh-GELU vs erf-GELU by up to 5e-4, against 5e-7 at 0.2), and a wrong activation shows in the
    outputs at ATOL."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            std = weight_std if parameter.ndim == 2 and "embeddings" not in name else 0.02
            parameter.add_(torch.randn(parameter.shape, generator=generator) * std)


def padded_batch(lengths, seq: int, pad_id: int, seed: int):
    """Right-padded token ids avoiding the pad id, and the matching 0/1 attention mask."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, (len(lengths), seq))
    mask = (np.arange(seq)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    return np.where(mask == 1, ids, pad_id), mask


def bert_config(**overrides):
    return transformers.BertConfig(**TINY, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=64,
                                   attn_implementation="eager", **overrides)


def roberta_config(**overrides):
    return transformers.RobertaConfig(**TINY, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=66,
                                      type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
                                      attn_implementation="eager", **overrides)


def modernbert_config(num_layers: int, every: int, window: int, **overrides):
    return transformers.ModernBertConfig(
        **TINY, num_hidden_layers=num_layers, intermediate_size=48, global_attn_every_n_layers=every,
        local_attention=window, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        cls_token_id=1, sep_token_id=2, attn_implementation="sdpa", **overrides)


def rewrite_as_legacy_modernbert_config(directory: str, every: int) -> None:
    """Turn a transformers-5 ModernBERT config.json into the transformers-4 format still found on the Hub."""
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        values = json.load(f)
    rope = values.pop("rope_parameters")
    values.pop("layer_types")
    values.update(global_attn_every_n_layers=every, global_rope_theta=rope["full_attention"]["rope_theta"],
                  local_rope_theta=rope["sliding_attention"]["rope_theta"])
    with open(path, "w") as f:
        json.dump(values, f)


# One batch shape for every case: eager op-by-op execution then reuses its compiled kernels across cases.
LENGTHS, SEQ = (40, 29, 7), 40  # longer than every ModernBERT local window below, so the windows mask

# (case id, transformers class name, config factory, legacy ModernBERT every-n or None)
CASES = [
    ("bert-model", "BertModel", lambda: bert_config(), None),
    ("bert-mlm", "BertForMaskedLM", lambda: bert_config(), None),
    ("bert-pretraining", "BertForPreTraining", lambda: bert_config(), None),
    ("bert-nsp", "BertForNextSentencePrediction", lambda: bert_config(), None),
    ("bert-mlm-untied-gelu-new", "BertForMaskedLM",
     lambda: bert_config(tie_word_embeddings=False, hidden_act="gelu_new", layer_norm_eps=1e-6), None),
    ("bert-mlm-gelu-large-weights", "BertForMaskedLM", lambda: bert_config(tie_word_embeddings=False), None),
    ("roberta-model", "RobertaModel", lambda: roberta_config(), None),
    ("roberta-mlm", "RobertaForMaskedLM", lambda: roberta_config(), None),
    ("modernbert-model-3l-every2-w8-legacy", "ModernBertModel",
     lambda: modernbert_config(3, 2, 8, rope_parameters={"full_attention": {"rope_theta": 20_000.0},
                                                         "sliding_attention": {"rope_theta": 5_000.0}}), 2),
    ("modernbert-model-4l-every3-w16", "ModernBertModel", lambda: modernbert_config(4, 3, 16), None),
    ("modernbert-mlm-4l-every3-w8-legacy", "ModernBertForMaskedLM", lambda: modernbert_config(4, 3, 8), 3),
    ("modernbert-mlm-3l-every2-w16-biases-untied", "ModernBertForMaskedLM",
     lambda: modernbert_config(3, 2, 16, attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True,
                               norm_eps=1e-6, tie_word_embeddings=False, classifier_activation="gelu_new"), None),
]


# Cases whose weight matrices are perturbed with this std instead of 0.02 (perturb_). At 0.02, pre-activations
# are about 0.1-0.2, and there tanh-GELU and erf-GELU agree far below ATOL: an activation form or mapping bug would
# pass. With these weights, swapping the form in transformers' intermediate layers or MLM transform moves the
# logits by more than 10 * ATOL (test_large_weights_tell_the_activation_forms_apart), while bertjax still agrees to
# about 5e-6. gelu-new checks HF "gelu_new" -> tanh form, and that BERT's MLM transform follows hidden_act;
# gelu-large-weights checks that "gelu" is the exact erf form.
LARGE_WEIGHTS = {"bert-mlm-untied-gelu-new": 0.3, "bert-mlm-gelu-large-weights": 0.3}


def family(case_id: str) -> str:
    return case_id.split("-")[0]


CASE_IDS = [case[0] for case in CASES]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(case_id) -> (transformers model, checkpoint directory), built once per module."""
    built = {}

    def get(case_id: str):
        if case_id not in built:
            _, class_name, make_config, legacy_every = next(case for case in CASES if case[0] == case_id)
            torch.manual_seed(0)
            model = getattr(transformers, class_name)(make_config()).eval()
            perturb_(model, seed=1, weight_std=LARGE_WEIGHTS.get(case_id, 0.02))
            directory = str(tmp_path_factory.mktemp(case_id))
            model.save_pretrained(directory)
            if legacy_every is not None:
                rewrite_as_legacy_modernbert_config(directory, legacy_every)
                # transformers reads the rewritten file as the model it came from.
                reread = transformers.AutoConfig.from_pretrained(directory)
                assert reread.layer_types == model.config.layer_types
                assert reread.rope_parameters == model.config.rope_parameters
            built[case_id] = model, directory
        return built[case_id]

    return get


def reference_outputs(model, ids, mask, token_type_ids=None) -> dict[str, np.ndarray]:
    kwargs = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}
    if token_type_ids is not None:
        kwargs["token_type_ids"] = torch.tensor(token_type_ids)
    with torch.no_grad():
        out = model(**kwargs)
        base = model.base_model(**kwargs) if model.base_model is not model else out
    result = {"last_hidden_state": base.last_hidden_state.numpy()}
    if getattr(out, "pooler_output", None) is not None:
        result["pooler_output"] = out.pooler_output.numpy()
    if hasattr(out, "prediction_logits"):  # BertForPreTraining
        result.update(logits=out.prediction_logits.numpy(), nsp_logits=out.seq_relationship_logits.numpy())
    elif hasattr(out, "logits"):
        result["logits"] = out.logits.numpy()
    return result


def bertjax_outputs(model, params, ids, mask, token_type_ids=None) -> dict[str, np.ndarray]:
    kwargs = {} if token_type_ids is None else {"token_type_ids": jnp.asarray(token_type_ids)}
    out = model.apply({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask), **kwargs)
    names = ("last_hidden_state", "pooler_output", "logits", "nsp_logits")
    return {name: np.asarray(getattr(out, name)) for name in names if getattr(out, name, None) is not None}


def assert_outputs_close(ours: dict, theirs: dict, mask: np.ndarray) -> None:
    assert ours.keys() == theirs.keys()
    valid = mask.astype(bool)
    for name, expected in theirs.items():
        actual = ours[name]
        assert actual.shape == expected.shape, name
        if expected.ndim == 3:  # per token: compare at non-padding positions only
            actual, expected = actual[valid], expected[valid]
        assert np.all(np.isfinite(actual)), name
        diff = float(np.max(np.abs(actual - expected)))
        assert diff <= ATOL, f"{name}: max abs diff {diff:.3g} > {ATOL}"


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_matches_transformers_on_padded_batch(case_id, checkpoint):
    reference, directory = checkpoint(case_id)
    model, params = bertjax.from_pretrained(directory, dtype=jnp.float32)
    ids, mask = padded_batch(LENGTHS, SEQ, reference.config.pad_token_id, seed=2)
    if family(case_id) == "modernbert":
        assert SEQ > model.config.local_window  # the sliding window really masks something
    token_types = None
    if family(case_id) == "bert":
        token_types = np.random.default_rng(3).integers(0, 2, ids.shape)
    assert_outputs_close(bertjax_outputs(model, params, ids, mask, token_types),
                         reference_outputs(reference, ids, mask, token_types), mask)


@pytest.mark.parametrize("case_id", sorted(LARGE_WEIGHTS))
def test_large_weights_tell_the_activation_forms_apart(case_id, checkpoint):
    """The LARGE_WEIGHTS cases must be sensitive enough for their job. In transformers itself, swapping tanh-GELU
    for erf-GELU (or back) in the intermediate layers, or in the MLM transform alone, moves the logits by more
    than 10 * ATOL. bertjax then loads each case with the activations of its config.json: hidden_act for both
    the layers and BERT's MLM transform."""
    import copy

    from transformers.activations import ACT2FN

    reference, directory = checkpoint(case_id)
    act = reference.config.hidden_act
    other = ACT2FN["gelu" if act == "gelu_new" else "gelu_new"]
    ids, mask = padded_batch(LENGTHS, SEQ, reference.config.pad_token_id, seed=2)
    token_types = np.random.default_rng(3).integers(0, 2, ids.shape)
    logits = reference_outputs(reference, ids, mask, token_types)["logits"][mask.astype(bool)]
    layers, head = copy.deepcopy(reference), copy.deepcopy(reference)
    for layer in layers.bert.encoder.layer:
        layer.intermediate.intermediate_act_fn = other
    head.cls.predictions.transform.transform_act_fn = other
    for swapped in (layers, head):
        moved = reference_outputs(swapped, ids, mask, token_types)["logits"][mask.astype(bool)]
        assert np.max(np.abs(moved - logits)) > 10 * ATOL
    model, _ = bertjax.from_pretrained(directory, dtype=jnp.float32)
    form = {"gelu": "gelu", "gelu_new": "gelu_tanh"}[act]
    assert (model.config.activation, model.config.head_activation) == (form, form)


def gapped_batch(seq: int, pad_id: int, seed: int):
    """Rows with padding where transformers still numbers positions: on the left, and a gap in the middle."""
    ids, _ = padded_batch((seq, seq), seq, pad_id, seed)
    mask = np.ones_like(ids)
    mask[0, :6] = 0  # left padding
    mask[1, 10:14] = 0  # a gap of padding mid-row
    return np.where(mask == 1, ids, pad_id), mask


@pytest.mark.parametrize("case_id", ["bert-pretraining", "roberta-model", "modernbert-model-4l-every3-w16"])
def test_masked_tokens_are_absent_as_in_transformers_without_them(case_id, checkpoint):
    # A masked token is absent: a left-padded or gapped row gives, at its real tokens, what transformers gives for
    # the row without the padding. transformers' RoBERTa counts positions that way itself, so there the padded rows
    # agree directly too; its BERT and ModernBERT number positions by index (their left-padded outputs move with
    # the padding). The pooled outputs (pooler, NSP) read the first present token, which is transformers' index 0
    # of the row without its padding.
    reference, directory = checkpoint(case_id)
    model, params = bertjax.from_pretrained(directory, dtype=jnp.float32)
    ids, mask = gapped_batch(SEQ, reference.config.pad_token_id, seed=4)
    if model.config.local_window is not None:  # windows count by index: a gap widens them (both libraries)
        ids, mask = ids[:1], mask[:1]
    valid = mask.astype(bool)
    lengths = valid.sum(axis=1)
    compact = np.full_like(ids, reference.config.pad_token_id)
    for row in range(len(ids)):
        compact[row, :lengths[row]] = ids[row][valid[row]]
    compact_mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(mask.dtype)
    per_token = ("last_hidden_state", "logits")
    ours = {name: value[valid] for name, value in bertjax_outputs(model, params, ids, mask).items()
            if name in per_token}
    theirs = {name: value[compact_mask.astype(bool)]
              for name, value in reference_outputs(reference, compact, compact_mask).items() if name in per_token}
    assert_outputs_close(ours, theirs, np.ones(len(next(iter(ours.values()))), bool))
    per_row = ("pooler_output", "nsp_logits")
    pooled = {name: value for name, value in bertjax_outputs(model, params, ids, mask).items() if name in per_row}
    assert_outputs_close(pooled, {name: value for name, value in
                                  reference_outputs(reference, compact, compact_mask).items() if name in per_row},
                         compact_mask)
    if family(case_id) == "roberta":
        direct = {name: value[valid] for name, value in reference_outputs(reference, ids, mask).items()
                  if name in per_token}
        assert_outputs_close(ours, direct, np.ones(len(next(iter(ours.values()))), bool))


@pytest.mark.parametrize("case_id", ["bert-mlm", "roberta-mlm"])
def test_matches_transformers_without_attention_mask_on_padded_ids(case_id, checkpoint):
    # No mask: both libraries attend to every token, padding ids included. transformers' RoBERTa still numbers
    # positions over the ids that are not padding (padding takes the padding_idx row); so does bertjax then.
    reference, directory = checkpoint(case_id)
    model, params = bertjax.from_pretrained(directory, dtype=jnp.float32)
    ids, _ = padded_batch(LENGTHS, SEQ, reference.config.pad_token_id, seed=6)
    out = model.apply({"params": params}, jnp.asarray(ids))
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(out.logits), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("case_id", ["bert-pretraining", "modernbert-mlm-4l-every3-w8-legacy"])
def test_matches_transformers_on_single_token(case_id, checkpoint):
    reference, directory = checkpoint(case_id)
    model, params = bertjax.from_pretrained(directory)
    ids, mask = np.array([[7]]), np.array([[1]])
    assert_outputs_close(bertjax_outputs(model, params, ids, mask), reference_outputs(reference, ids, mask), mask)


def random_bertjax_params(model, seed: int) -> dict:
    """Non-trivial parameters everywhere (bertjax initialises biases to zero and norm scales to one).

    Drawn with numpy on the shapes of `model.init`'s tree: no initialiser has to be compiled.
    """
    rng = np.random.default_rng(seed)
    shapes = expected_params(model)
    flat = {path: jnp.asarray((1.0 if path[-1] == "scale" else 0.0) + 0.02 * rng.standard_normal(spec.shape),
                              spec.dtype) for path, spec in shapes.items()}
    return traverse_util.unflatten_dict(flat)


# (preset, bertjax head, transformers auto class, config overrides)
ROUND_TRIPS = [
    ("bert-tiny", "masked_lm", "AutoModelForMaskedLM", {}),
    ("bert-tiny", "pretraining", "AutoModelForPreTraining", {}),
    ("bert-tiny", "next_sentence", "AutoModelForNextSentencePrediction", {}),
    ("roberta-tiny", "masked_lm", "AutoModelForMaskedLM", {}),
    ("roberta-tiny", "encoder", "AutoModel", {}),
    ("modernbert-tiny", "masked_lm", "AutoModelForMaskedLM", {"num_layers": 4, "global_attention_every": 2}),
    ("modernbert-tiny", "encoder", "AutoModel", {}),
]


def export_to_transformers(preset: str, head: str, auto_class: str, overrides: dict, directory):
    """A random-weight bertjax model of `preset` saved with `save_pretrained` and loaded by transformers'
    `auto_class` with no missing, unexpected or mismatched tensor: (config, model, params, reference)."""
    config = bertjax.get_config(preset, vocab_size=VOCAB, **overrides)
    model = bertjax.MODEL_CLASSES[head](config)
    params = random_bertjax_params(model, seed=4)
    bertjax.save_pretrained(str(directory), model, params)
    reference, info = getattr(transformers, auto_class).from_pretrained(
        str(directory), output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    reference.eval()
    assert type(reference).__name__ == json.loads((directory / "config.json").read_text())["architectures"][0]
    return config, model, params, reference


@pytest.mark.parametrize("preset,head,auto_class,overrides", ROUND_TRIPS,
                         ids=[f"{p}-{h}" for p, h, _, _ in ROUND_TRIPS])
def test_saved_checkpoint_loads_in_transformers_with_same_outputs(preset, head, auto_class, overrides, tmp_path):
    config, model, params, reference = export_to_transformers(preset, head, auto_class, overrides, tmp_path)
    ids, mask = padded_batch(LENGTHS, SEQ, config.pad_token_id, seed=5)
    assert_outputs_close(bertjax_outputs(model, params, ids, mask), reference_outputs(reference, ids, mask), mask)


def test_sharded_safetensors_index_loads_like_a_single_file(checkpoint, tmp_path):
    reference, single_file_dir = checkpoint("modernbert-mlm-3l-every2-w16-biases-untied")
    reference.save_pretrained(str(tmp_path), max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists() and not (tmp_path / "model.safetensors").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    _, sharded = bertjax.from_pretrained(str(tmp_path))
    _, single = bertjax.from_pretrained(single_file_dir)
    assert jax.tree.structure(sharded) == jax.tree.structure(single)
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(single)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
