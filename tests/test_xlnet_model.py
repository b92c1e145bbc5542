"""XLNet: parity with transformers' XLNetModel / XLNetLMHeadModel / task heads (plain forward, left padding as
XLNetTokenizer pads, token types, perm_mask + target_mapping, clamped relative distances), round trips, and clear
errors for the permutation inputs.

The reference is transformers on tiny random-weight models with every parameter perturbed; outputs compared at real
tokens in float32 (ATOL from test_hf_parity). One bertjax model per checkpoint, one jitted apply per input set.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hf_parity import ATOL, VOCAB, perturb_, random_bertjax_params  # noqa: E402
from test_hf_task_heads import CLASS_SUFFIX, LABELS, assert_close, build_reference, hf_outputs  # noqa: E402

SEQ, LENGTHS, PAD = 10, (10, 7, 3), 5


def xlnet_config(**overrides):
    return transformers.XLNetConfig(**{**dict(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=48,
                                              ff_activation="gelu", pad_token_id=PAD, clamp_len=-1), **overrides})


def left_padded_batch(seed: int = 3):
    """XLNetTokenizer's layout: padding first, token types 3 on padding, 0/1 for the segments, 2 on the last <cls>."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(SEQ)[None, ::-1] < np.asarray(LENGTHS)[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(6, VOCAB, (len(LENGTHS), SEQ)), PAD)
    types = np.where(mask == 1, (np.arange(SEQ)[None] >= SEQ - np.asarray(LENGTHS)[:, None] // 2).astype(int), 3)
    types[:, -1] = 2
    return ids, mask, types


def permutation_inputs(mask, num_predict: int = 2, seed: int = 4):
    """A random factorisation order per row over its real tokens; the last `num_predict` real tokens in the order
    are targets (perm_mask as XLNet's released code builds it), mapped left to right."""
    rng = np.random.default_rng(seed)
    batch = mask.shape[0]
    perm = np.zeros((batch, SEQ, SEQ), np.float32)
    mapping = np.zeros((batch, num_predict, SEQ), np.float32)
    for b in range(batch):
        real = np.flatnonzero(mask[b])
        order = rng.permutation(real)
        rank = np.full(SEQ, -1)
        rank[order] = np.arange(len(order))
        targets = np.sort(order[-num_predict:])
        is_target = np.isin(np.arange(SEQ), targets)
        # i may not see j when j is a target not before i in the order
        perm[b] = (is_target[None, :] & (rank[None, :] >= rank[:, None])).astype(np.float32)
        mapping[b, np.arange(len(targets)), targets] = 1.0
    return perm, mapping


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory):
    """clamp_len 6 with rows of 10: distances up to 6 are exact, longer ones clamped (both regimes in one model)."""
    directory = tmp_path_factory.mktemp("xlnet")
    torch.manual_seed(0)
    reference = transformers.XLNetLMHeadModel(xlnet_config(clamp_len=6)).eval()
    perturb_(reference, seed=1)
    reference.save_pretrained(str(directory))
    model, params = bertjax.from_pretrained(str(directory))
    return reference, model, params, directory


def _torch(x):
    return None if x is None else torch.tensor(x)


PARITY_CASES = ("plain", "left padding", "token types", "permutation")


def parity_inputs(name: str) -> dict:
    ids, mask, types = left_padded_batch()
    perm, mapping = permutation_inputs(mask)
    return {"plain": dict(input_ids=ids[:1]), "left padding": dict(input_ids=ids, attention_mask=mask),
            "token types": dict(input_ids=ids, attention_mask=mask, token_type_ids=types),
            "permutation": dict(input_ids=ids, attention_mask=mask, token_type_ids=types, perm_mask=perm,
                                target_mapping=mapping)}[name]


@pytest.mark.parametrize("head", ["encoder", "masked_lm"])
def test_models_match_transformers_plain_padded_types_and_permutations(lm_checkpoint, head):
    """XLNetModel (`last_hidden_state`: the content stream, or the query stream [batch, num_predict, hidden] with
    target_mapping) and XLNetLMHeadModel (`logits`) on the same checkpoint; transformers reads XLNetModel out of
    the LM checkpoint (dropping lm_loss) as bertjax does with head="encoder"."""
    reference, model, params, directory = lm_checkpoint
    if head == "encoder":
        reference = transformers.XLNetModel.from_pretrained(str(directory)).eval()
        model, params = bertjax.from_pretrained(str(directory), head="encoder")
    assert type(model) is bertjax.MODEL_CLASSES[head] and model.config.attention_kind == "two_stream"
    assert model.config.xlnet.clamp_len == 6
    field = "logits" if head == "masked_lm" else "last_hidden_state"
    apply = jax.jit(model.apply)
    for name in PARITY_CASES:
        inputs = parity_inputs(name)
        with torch.no_grad():
            expected = getattr(reference(**{k: _torch(v) for k, v in inputs.items()}), field).numpy()
        ours = np.asarray(getattr(apply({"params": params}, **{k: jnp.asarray(v) for k, v in inputs.items()}),
                                  field))
        assert ours.shape == expected.shape and ours.dtype == np.float32, (name, ours.shape, expected.shape)
        if name == "permutation":  # one row per prediction slot: [batch, num_predict, ...]
            assert ours.shape[:2] == inputs["target_mapping"].shape[:2]
        elif "attention_mask" in inputs:
            keep = inputs["attention_mask"].astype(bool)
            ours, expected = ours[keep], expected[keep]
        diff = float(np.max(np.abs(ours - expected)))
        assert diff <= ATOL, f"{head} {name}: max abs diff {diff:.3g} > {ATOL}"


@pytest.mark.parametrize("name", ["left padding", "permutation"])
def test_intermediates_hidden_states_match_transformers(lm_checkpoint, name):
    """bertjax.intermediates.hidden_states records XLNet's stack as EncoderStack's: the content stream's input and
    every layer's output, the last one last_hidden_state, as transformers' `hidden_states`; with target_mapping the
    query stream's are `encoder/query_hidden_states` (transformers interleaves the two streams then)."""
    from bertjax import intermediates

    reference, model, params, _ = lm_checkpoint
    inputs = parity_inputs(name)
    with torch.no_grad():
        theirs = [t.numpy() for t in reference(**{k: _torch(v) for k, v in inputs.items()},
                                               output_hidden_states=True).hidden_states]
    ids, others = jnp.asarray(inputs["input_ids"]), {k: jnp.asarray(v) for k, v in inputs.items() if k != "input_ids"}
    states = intermediates.hidden_states(model, params, ids, **others)
    keep = inputs["attention_mask"].astype(bool)
    if name == "permutation":
        _, recorded = model.apply({"params": params}, ids, mutable=["intermediates"], **others)
        queries = recorded["intermediates"]["encoder"]["query_hidden_states"]
        assert len(queries) == len(states) == model.config.num_layers + 1
        for ours, expected in zip(queries, theirs[1::2]):
            np.testing.assert_allclose(np.asarray(ours), expected, atol=ATOL, rtol=0)
        theirs = theirs[0::2]
    else:
        last = model.apply({"params": params}, ids, **others).last_hidden_state
        np.testing.assert_array_equal(np.asarray(states[-1]), np.asarray(last))
    assert len(states) == len(theirs) == model.config.num_layers + 1
    for ours, expected in zip(states, theirs):
        np.testing.assert_allclose(np.asarray(ours)[keep], expected[keep], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="attention_kind='two_stream' records no attention probabilities"):
        intermediates.attention_probabilities(model, params, ids, **others)


@pytest.mark.parametrize("head", ["encoder", "masked_lm"])
def test_models_round_trip_through_transformers(lm_checkpoint, tmp_path, head):
    """bertjax -> XLNetModel / XLNetLMHeadModel: every tensor of the original checkpoint comes back bit for bit
    (lm_loss tied to the word embedding, its bias kept), the reloaded model's outputs on the permutation inputs equal
    the original's, and bertjax reads its own export back to the same config and parameters. (bertjax's outputs
    against transformers on this checkpoint: the parity test above.)"""
    reference, model, params, directory = lm_checkpoint
    if head == "encoder":  # drops lm_loss, as transformers does
        reference = transformers.XLNetModel.from_pretrained(str(directory)).eval()
        model, params = bertjax.from_pretrained(str(directory), head="encoder")
    bertjax.save_pretrained(str(tmp_path), model, params)
    auto = transformers.AutoModel if head == "encoder" else transformers.AutoModelForCausalLM
    reloaded, info = auto.from_pretrained(str(tmp_path), output_loading_info=True)
    assert type(reloaded) is type(reference)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    original, back = reference.state_dict(), reloaded.eval().state_dict()
    assert set(back) == set(original)
    for key, tensor in original.items():
        torch.testing.assert_close(back[key], tensor, rtol=0, atol=0, msg=key)
    inputs = {k: _torch(v) for k, v in parity_inputs("permutation").items()}
    field = "logits" if head == "masked_lm" else "last_hidden_state"
    with torch.no_grad():
        torch.testing.assert_close(getattr(reloaded(**inputs), field), getattr(reference(**inputs), field),
                                   rtol=0, atol=1e-6)
    again, again_params = bertjax.from_pretrained(str(tmp_path))
    assert type(again) is type(model) and again.config == model.config
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), again_params, params)


XLNET_HEADS = tuple(CLASS_SUFFIX)


@pytest.mark.parametrize("head", XLNET_HEADS)
def test_task_heads_match_transformers_and_round_trip(head, tmp_path):
    """XLNet's summary pools the last token (XLNetTokenizer puts <cls> there); left-padded batches."""
    reference = build_reference("XLNet", xlnet_config, head if head != "question_answering" else head,
                                str(tmp_path / "hf")) if head != "question_answering" else None
    if head == "question_answering":  # transformers' span head without beam search is ...Simple
        torch.manual_seed(0)
        reference = transformers.XLNetForQuestionAnsweringSimple(xlnet_config()).eval()
        perturb_(reference, seed=1)
        reference.save_pretrained(str(tmp_path / "hf"))
    model, params = bertjax.from_pretrained(str(tmp_path / "hf"))
    assert type(model) is bertjax.MODEL_CLASSES[head] and model.config.task.classifier_pooling == "last"
    if head in LABELS:
        assert model.config.task.labels == LABELS[head]
    ids, mask, types = left_padded_batch()
    extra = {"token_type_ids": types}
    if head == "multiple_choice":
        ids, mask, types = (np.stack([x, x[::-1]], axis=1) for x in (ids, mask, types))
        extra = {"token_type_ids": types}
    expected = hf_outputs(reference, ids, mask, extra)
    ours = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                                **{k: jnp.asarray(v) for k, v in extra.items()})
    assert_close(ours, expected, mask, head)
    bertjax.save_pretrained(str(tmp_path / "bj"), model, params)
    auto = getattr(transformers, f"AutoModelFor{CLASS_SUFFIX[head]}")
    reloaded, info = auto.from_pretrained(str(tmp_path / "bj"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(reloaded) is type(reference) and reloaded.config.summary_type == "last"
    again = hf_outputs(reloaded.eval(), ids, mask, extra)
    for name in expected:
        np.testing.assert_allclose(again[name], expected[name], atol=1e-6, rtol=0)


@pytest.mark.parametrize("summary_type", ["mean"])  # "first" takes the same path
def test_other_summary_types_agree_without_padding_and_say_why_not_with_it(summary_type, tmp_path, caplog):
    # transformers' "first" reads index 0 and its "mean" averages everything, left padding included; bertjax pools
    # each row's real tokens. Rows without padding agree; loading says that padded ones will not.
    reference = build_reference("XLNet", lambda: xlnet_config(summary_type=summary_type),
                                "sequence_classification", str(tmp_path))
    with caplog.at_level("WARNING", logger="bertjax.hf.xlnet"):
        model, params = bertjax.from_pretrained(str(tmp_path))
    assert f"summary_type={summary_type!r}" in caplog.text and "without padding" in caplog.text
    ids, mask, types = (x[:1] for x in left_padded_batch())  # the full-length row
    assert mask.all()
    expected = hf_outputs(reference, ids, mask, {"token_type_ids": types})
    ours = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                                token_type_ids=jnp.asarray(types))
    assert_close(ours, expected, mask, "sequence_classification")
    caplog.clear()
    with caplog.at_level("WARNING", logger="bertjax.hf.xlnet"):  # and writing it back says so too
        bertjax.save_pretrained(str(tmp_path / "bj"), model, params)
    assert f"written as summary_type={summary_type!r}" in caplog.text


def test_a_task_config_without_pooling_keeps_xlnets_last_token(tmp_path, caplog):
    """TaskConfig(num_labels=3) over the xlnet preset used to take TaskConfig's own default, the first token, and
    export it as summary_type "first" without a word: transformers then read the left padding."""
    import json

    from bertjax.config import TaskConfig

    config = bertjax.get_config("xlnet-tiny", task=TaskConfig(num_labels=3))
    assert config.classifier_pooling == "last"
    assert bertjax.get_config("eurobert-tiny", task=TaskConfig()).classifier_pooling == "late"
    assert bertjax.get_config("bert-tiny", task=TaskConfig()).classifier_pooling == "cls"
    model = bertjax.MODEL_CLASSES["sequence_classification"](config)
    with caplog.at_level("WARNING", logger="bertjax.hf.xlnet"):
        bertjax.save_pretrained(str(tmp_path), model, random_bertjax_params(model, seed=0))
    assert json.loads((tmp_path / "config.json").read_text())["summary_type"] == "last"
    assert "summary_type" not in caplog.text


# ---------------------------------------------------------------------------------------------------------------
# Bad input: clear errors naming the input.

@pytest.fixture(scope="module")
def tiny_lm():
    model = bertjax.MODEL_CLASSES["masked_lm"](bertjax.get_config("xlnet-tiny"))
    return model, random_bertjax_params(model, seed=0)  # drawn with numpy: no initialiser to compile


def test_perm_mask_on_a_model_without_a_query_stream_is_refused():
    model = bertjax.MODEL_CLASSES["masked_lm"](bertjax.get_config("bert-tiny"))
    ids = jnp.ones((1, 4), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), ids)["params"]
    with pytest.raises(ValueError, match="perm_mask is an XLNet input.*attention_kind='standard'"):
        model.apply({"params": params}, ids, perm_mask=jnp.zeros((1, 4, 4)))
    with pytest.raises(ValueError, match="target_mapping is an XLNet input"):
        model.apply({"params": params}, ids, target_mapping=jnp.zeros((1, 1, 4)))


def test_bad_permutation_inputs_and_lengths_are_named(tiny_lm):
    model, params = tiny_lm
    ids, mask = jnp.ones((1, 4), jnp.int32), jnp.asarray([[0, 1, 1, 1]])
    with pytest.raises(ValueError, match="target_mapping selects padding: row 0, prediction slot 1 points at "
                                         "position 0"):
        model.apply({"params": params}, ids, attention_mask=mask,
                    target_mapping=jnp.asarray([[[0, 0, 1, 0], [1, 0, 0, 0]]], jnp.float32))
    jitted = bertjax.checked(lambda p, i, m, t: model.apply({"params": p}, i, attention_mask=m,
                                                            target_mapping=t).logits)
    good = jnp.asarray([[[0, 0, 1, 0], [0, 0, 0, 1]]], jnp.float32)
    assert jitted(params, ids, mask, good).shape == (1, 2, model.config.vocab_size)
    with pytest.raises(ValueError, match="target_mapping selects padding: 1 .row, prediction slot. entries"):
        jitted(params, ids, mask, jnp.asarray([[[0, 0, 1, 0], [1, 0, 0, 0]]], jnp.float32))
    with pytest.raises(ValueError, match=r"perm_mask must be \[batch, seq, seq\]"):
        model.apply({"params": params}, ids, perm_mask=jnp.zeros((1, 4, 3)))
    with pytest.raises(ValueError, match=r"target_mapping must be \[batch, num_predict, seq\]"):
        model.apply({"params": params}, ids, target_mapping=jnp.zeros((1, 4)))
    with pytest.raises(ValueError, match="masked_positions or target_mapping"):
        model.apply({"params": params}, ids, masked_positions=jnp.zeros((1, 1), jnp.int32),
                    target_mapping=jnp.zeros((1, 1, 4)))
    too_long = jnp.ones((1, model.config.max_position_embeddings + 1), jnp.int32)
    with pytest.raises(ValueError, match="sequence length 65 exceeds the model's max_position_embeddings"):
        model.apply({"params": params}, too_long)


def test_packed_rows_give_each_document_its_own_outputs(tiny_lm):
    """Two documents packed in one row (segment ids 1, 2) give the logits each has alone, also with a
    permutation: attention and relative distances stay inside each document."""
    model, params = tiny_lm
    rng = np.random.default_rng(0)
    first, second = rng.integers(6, 100, 5), rng.integers(6, 100, 3)
    packed = jnp.asarray(np.concatenate([first, second])[None], jnp.int32)
    segments = jnp.asarray([[1] * 5 + [2] * 3])
    perm = np.zeros((1, 8, 8), np.float32)
    perm[0, :, [1, 6]] = 1.0  # positions 1 and 6 (one per document) are targets nobody sees
    mapping = np.zeros((1, 2, 8), np.float32)
    mapping[0, 0, 1] = mapping[0, 1, 6] = 1.0
    apply = jax.jit(model.apply)
    out = apply({"params": params}, packed, segment_ids=segments, perm_mask=jnp.asarray(perm),
                target_mapping=jnp.asarray(mapping)).logits
    for slot, (doc, start, target) in enumerate(((first, 0, 1), (second, 5, 1))):
        n = len(doc)
        alone = apply({"params": params}, jnp.asarray(doc[None], jnp.int32),
                      perm_mask=jnp.asarray(perm[:, start:start + n, start:start + n]),
                      target_mapping=jnp.asarray(np.eye(n, dtype=np.float32)[None, target:target + 1])).logits
        np.testing.assert_allclose(np.asarray(out[0, slot]), np.asarray(alone[0, 0]), atol=1e-5)


def test_xlnet_options_are_a_nested_checked_sub_config():
    import json

    config = bertjax.get_config("xlnet-base", xlnet={"clamp_len": 256})  # a YAML override updates the sub-config
    assert config.xlnet.clamp_len == 256 and config.task.classifier_pooling == "last"
    assert bertjax.EncoderConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ValueError, match="XLNetOptions has no field"):
        bertjax.get_config("xlnet-base", xlnet={"clamp": 1})
    with pytest.raises(ValueError, match="xlnet must be set exactly when attention_kind='two_stream'"):
        bertjax.get_config("bert-tiny", attention_kind="two_stream")
    with pytest.raises(ValueError, match="needs position_embedding='none'"):
        bertjax.get_config("xlnet-tiny", position_embedding="learned")
