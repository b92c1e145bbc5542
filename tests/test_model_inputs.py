"""What the models accept: padding never changes valid outputs, tiny inputs work, bad inputs are rejected."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

import bertjax
from bertjax.hf.pretrained import expected_params

PRESETS = ["bert-tiny", "roberta-tiny", "modernbert-tiny"]
ATOL = 1e-5


@pytest.fixture(scope="module")
def masked_lm():
    """masked_lm(preset) -> (model, params) with non-trivial values in every parameter, built once per preset."""
    built = {}

    def get(preset: str):
        if preset not in built:
            model = bertjax.EncoderForMaskedLM(bertjax.get_config(preset))
            built[preset] = model, numpy_params(model)
        return built[preset]

    return get


def numpy_params(model, seed: int = 0):
    """Non-trivial values in every parameter, drawn with numpy: no initialiser to run op by op or to compile."""
    rng = np.random.default_rng(seed)
    flat = {path: jnp.asarray((1.0 if path[-1] == "scale" else 0.0) + 0.05 * rng.standard_normal(spec.shape),
                              spec.dtype) for path, spec in expected_params(model).items()}
    return traverse_util.unflatten_dict(flat)


def run(model, params, ids, mask=None, **kwargs):
    """model.apply as a user calls it, eagerly: its input checks read the concrete values."""
    mask = None if mask is None else jnp.asarray(mask)
    return model.apply({"params": params}, jnp.asarray(ids), attention_mask=mask, **kwargs)


_COMPILED = {}


def compiled_run(model, params, ids, mask=None):
    """`run` under jax.jit (one compiled program per model and shape, not hundreds of eager ops), for the tests
    about output values rather than about eager input checks."""
    if model not in _COMPILED:
        _COMPILED[model] = jax.jit(lambda p, ids, mask: model.apply({"params": p}, ids, attention_mask=mask))
    return _COMPILED[model](params, jnp.asarray(ids), None if mask is None else jnp.asarray(mask))


@pytest.mark.parametrize("preset", PRESETS)
def test_padding_does_not_change_valid_outputs(preset, masked_lm):
    model, params = masked_lm(preset)
    vocab, seq = model.config.vocab_size, 20  # longer than modernbert-tiny's local window
    rng = np.random.default_rng(1)
    lengths = np.array([seq, 13])
    ids = rng.integers(0, vocab, (2, seq))
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    # Pad on both sides with arbitrary token ids: only the mask may decide what is padding.
    left, right = 3, 4
    padded_ids = np.concatenate([rng.integers(0, vocab, (2, left)), ids, rng.integers(0, vocab, (2, right))], 1)
    padded_mask = np.pad(mask, ((0, 0), (left, right)))

    # And a gap of masked tokens mid-row: absent too, so positions go on counting after it. The same length as the
    # padded rows, so they share one compiled program.
    gap_at = 5
    gapped_ids = np.concatenate([ids[:, :gap_at], rng.integers(0, vocab, (2, left)), ids[:, gap_at:],
                                 rng.integers(0, vocab, (2, right))], 1)
    gapped_mask = np.concatenate([mask[:, :gap_at], np.zeros((2, left), np.int32), mask[:, gap_at:],
                                  np.zeros((2, right), np.int32)], 1)

    # Sliding windows count by index, as transformers', so a gap widens the span a local layer sees.
    cases = [(padded_ids, padded_mask)]
    if model.config.local_window is None:
        cases.append((gapped_ids, gapped_mask))

    plain = compiled_run(model, params, ids, mask)
    valid = mask.astype(bool)
    for padded, kept in ((compiled_run(model, params, case_ids, case_mask), case_mask)
                         for case_ids, case_mask in cases):
        for name in ("logits", "last_hidden_state"):
            expected = np.asarray(getattr(plain, name))[valid]
            actual = np.asarray(getattr(padded, name))[kept.astype(bool)]
            assert np.all(np.isfinite(actual)), name
            np.testing.assert_allclose(actual, expected, atol=ATOL, rtol=0, err_msg=name)


@pytest.mark.parametrize("preset", PRESETS)
def test_one_token_sequence(preset, masked_lm):
    model, params = masked_lm(preset)
    alone = compiled_run(model, params, [[5]])
    assert alone.logits.shape == (1, 1, model.config.vocab_size)
    in_padding = compiled_run(model, params, [[5, 9, 9, 9, 9]], [[1, 0, 0, 0, 0]])
    np.testing.assert_allclose(np.asarray(in_padding.logits[:, :1]), np.asarray(alone.logits), atol=ATOL, rtol=0)


@pytest.mark.parametrize("preset,longest", [("bert-tiny", 64), ("roberta-tiny", 64), ("modernbert-tiny", 256)])
def test_sequences_longer_than_the_position_table_are_rejected(preset, longest, masked_lm):
    model, params = masked_lm(preset)
    # roberta-tiny has 66 position rows but its positions start at pad_token_id + 1 = 2.
    fits = jax.eval_shape(lambda p: model.apply({"params": p}, jnp.ones((1, longest), jnp.int32)), params)
    assert fits.logits.shape == (1, longest, model.config.vocab_size)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        run(model, params, np.ones((1, longest + 1), np.int32))


@pytest.mark.parametrize("bad_id", [-1, "vocab"])
def test_out_of_range_token_ids_are_rejected(bad_id, masked_lm):
    model, params = masked_lm("bert-tiny")
    bad = model.config.vocab_size if bad_id == "vocab" else bad_id
    with pytest.raises(ValueError, match="token ids must be in"):
        run(model, params, [[1, 2, bad]])


def test_wrong_shaped_attention_mask_is_rejected(masked_lm):
    model, params = masked_lm("bert-tiny")
    with pytest.raises(ValueError, match="attention_mask"):
        run(model, params, [[1, 2, 3]], [[1, 1]])


def test_token_types_on_a_model_without_them_are_rejected(masked_lm):
    model, params = masked_lm("modernbert-tiny")
    with pytest.raises(ValueError, match="token_type_ids"):
        run(model, params, [[1, 2, 3]], token_type_ids=jnp.zeros((1, 3), jnp.int32))


def test_out_of_range_token_type_ids_are_rejected(masked_lm):
    model, params = masked_lm("bert-tiny")
    ids = jnp.asarray([[1, 2, 3]], jnp.int32)
    with pytest.raises(ValueError, match="token_type_ids must be in"):
        model.apply({"params": params}, ids, token_type_ids=jnp.asarray([[0, 1, 2]], jnp.int32))


def checked_logits(model):
    """bertjax.checked over model.apply, every input traced (as a user's jitted predict): fn(params, ids, kwargs)."""
    return bertjax.checked(lambda p, ids, kw: model.apply({"params": p}, ids, **kw).logits)


def jitted_logits(model):
    """The same under a plain jax.jit, which checks nothing (and costs nothing): the values are unknown."""
    return jax.jit(lambda p, ids, kw: model.apply({"params": p}, ids, **kw).logits)


@pytest.mark.parametrize("preset", ["bert-tiny", "distilbert-tiny", "modernbert-tiny"])  # learned, sinusoidal, RoPE
@pytest.mark.parametrize("bad", ["max", -1])
def test_out_of_range_position_ids_are_rejected_eagerly_and_when_checked(preset, bad, masked_lm):
    # A learned or sinusoidal table has max_position_embeddings rows: an id past it gathered NaN, -1 the last row.
    # RoPE models refuse sequences longer than max_position_embeddings, so they refuse such position ids too.
    model, params = masked_lm(preset)
    limit = model.config.max_position_embeddings
    ids = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
    positions = np.array([[0, 1, limit if bad == "max" else bad, 3]], np.int32)
    message = rf"position_ids must be in \[0, {limit}\) \(max_position_embeddings={limit}.*got min"
    with pytest.raises(ValueError, match=message):
        model.apply({"params": params}, ids, position_ids=positions)
    with pytest.raises(ValueError, match=message):
        checked_logits(model)(params, ids, {"position_ids": positions})


@pytest.mark.parametrize("preset", ["bert-tiny", "roberta-tiny"])  # without and with RoBERTa's offset
def test_the_last_position_row_is_accepted(preset, masked_lm):
    # Given position ids index the table as they are (RoBERTa's position_offset is part of them, as in
    # transformers), so the last row, max_position_embeddings - 1, is valid for every model.
    model, params = masked_lm(preset)
    ids = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
    last = model.config.max_position_embeddings - 1
    kwargs = {"position_ids": np.array([[model.config.position_offset, last - 2, last - 1, last]], np.int32)}
    eager = model.apply({"params": params}, ids, **kwargs).logits
    unchecked = jitted_logits(model)(params, ids, kwargs)
    assert np.all(np.isfinite(np.asarray(eager)))
    np.testing.assert_allclose(np.asarray(checked_logits(model)(params, ids, kwargs)), np.asarray(unchecked),
                               atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(unchecked), atol=ATOL, rtol=0)


def test_models_without_a_position_table_take_any_non_negative_position_ids(masked_lm):
    # ALiBi runs any length, so positions past max_position_embeddings are fine; a negative one is still wrong.
    model, params = masked_lm("mosaicbert-tiny")
    ids = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
    far = np.array([[0, 1, 2, 10 * model.config.max_position_embeddings]], np.int32)
    assert np.all(np.isfinite(np.asarray(model.apply({"params": params}, ids, position_ids=far).logits)))
    negative = np.array([[0, 1, -1, 3]], np.int32)
    with pytest.raises(ValueError, match=r"position_ids must be >= 0; got min -1"):
        model.apply({"params": params}, ids, position_ids=negative)
    with pytest.raises(ValueError, match=r"position_ids must be >= 0; got min -1"):
        checked_logits(model)(params, ids, {"position_ids": negative})


@pytest.mark.parametrize("bad", ["seq", -1])
def test_out_of_range_masked_positions_are_rejected_eagerly_and_when_checked(bad, masked_lm):
    model, params = masked_lm("bert-tiny")
    ids = jnp.asarray([[1, 2, 3, 4, 5, 6]], jnp.int32)
    masked = np.array([[1, 6 if bad == "seq" else bad]], np.int32)
    message = r"masked_positions must be in \[0, 6\).*got min"
    with pytest.raises(ValueError, match=message):
        model.apply({"params": params}, ids, masked_positions=masked)
    with pytest.raises(ValueError, match=message):
        checked_logits(model)(params, ids, {"masked_positions": masked})
    if bad == "seq":  # the other model taking masked_positions goes through the same check
        pretraining = bertjax.EncoderForPreTraining(model.config)
        pretraining_params = numpy_params(pretraining)
        with pytest.raises(ValueError, match=message):
            pretraining.apply({"params": pretraining_params}, ids, masked_positions=masked)


def test_the_last_masked_position_and_padding_slots_are_accepted(masked_lm):
    # bertjax.data pads masked_positions with 0 (and masked_weights 0), so 0 stays a valid slot.
    model, params = masked_lm("bert-tiny")
    ids = jnp.asarray([[1, 2, 3, 4, 5, 6]], jnp.int32)
    kwargs = {"masked_positions": np.array([[2, 5, 0, 0]], np.int32)}
    full = np.asarray(model.apply({"params": params}, ids).logits)
    unchecked = jitted_logits(model)(params, ids, kwargs)
    np.testing.assert_allclose(np.asarray(checked_logits(model)(params, ids, kwargs)), np.asarray(unchecked),
                               atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(unchecked), full[:, [2, 5, 0, 0]], atol=ATOL, rtol=0)
    none = {"masked_positions": np.zeros((1, 0), np.int32)}  # no predictions: nothing to check
    assert checked_logits(model)(params, ids, none).shape == (1, 0, model.config.vocab_size)


@pytest.mark.parametrize("name", ["input_ids", "token_type_ids", "position_ids", "masked_positions"])
def test_int64_ids_past_int32_are_rejected_before_they_wrap(name, masked_lm):
    # 2**32 + 1 would become 1 in a cast to int32 (jax's default), a valid id: the check reads the value as given.
    model, params = masked_lm("bert-tiny")
    ids = np.array([[1, 2, 3, 4]], np.int64)
    kwargs = {}
    if name == "input_ids":
        ids[0, 2] = 2**32 + 1
    else:
        kwargs[name] = np.array([[0, 1, 2**32 + 1, 0]] if name != "masked_positions" else [[2**32 + 1]], np.int64)
    what = "token ids" if name == "input_ids" else name
    with pytest.raises(ValueError, match=rf"{what} must be in \[0, \d+\).*max {2**32 + 1}"):
        model.apply({"params": params}, ids, **kwargs)
    # Through bertjax.checked too (its jit converted them to int32 first, where 2**32 + 1 is 1: accepted, silently).
    where = "argument 1" if name == "input_ids" else f"argument 2\\['{name}'\\]"
    with pytest.raises(ValueError, match=rf"{where}: int64 values in \[\d+, {2**32 + 1}\] do not fit in int32"):
        checked_logits(model)(params, ids, kwargs)


@pytest.mark.parametrize("shape,message", [((1, 0), "input_ids has 0 tokens per row"),
                                           ((0, 4), "input_ids is an empty batch")])
def test_empty_inputs_are_an_input_error(shape, message, masked_lm):
    model, params = masked_lm("bert-tiny")
    ids = np.zeros(shape, np.int32)
    with pytest.raises(ValueError, match=message):
        model.apply({"params": params}, ids)
    with pytest.raises(ValueError, match=message):  # shapes are static: the same error when traced
        checked_logits(model)(params, jnp.asarray(ids), {})


@pytest.mark.parametrize("preset", PRESETS)
def test_a_padding_only_row_gives_finite_outputs_and_gradients(preset, masked_lm):
    """A batch may hold a row with no present token (a bucket's filler row): it runs, and a loss that masks it
    out gets finite gradients (a NaN there would poison every parameter)."""
    model, params = masked_lm(preset)
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, (2, 20))
    mask = np.stack([np.ones(20, np.int32), np.zeros(20, np.int32)])
    logits = compiled_run(model, params, ids, mask).logits
    assert np.all(np.isfinite(np.asarray(logits)))

    def masked_loss(p):
        out = model.apply({"params": p}, jnp.asarray(ids), attention_mask=jnp.asarray(mask)).logits
        return jnp.sum(jax.nn.logsumexp(out, axis=-1) * mask) / jnp.sum(mask)

    grads = jax.jit(jax.grad(masked_loss))(params)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))


def test_multiple_choice_int64_ids_past_int32_are_rejected():
    from bertjax.models.task_models import EncoderForMultipleChoice

    model = EncoderForMultipleChoice(bertjax.get_config("bert-tiny"))
    params = numpy_params(model)
    ids = np.array([[[1, 2, 3], [1, 2, 2**32 + 1]]], np.int64)  # [batch, choices, seq]
    with pytest.raises(ValueError, match=rf"token ids must be in \[0, 128\).*max {2**32 + 1}"):
        model.apply({"params": params}, ids)


def test_token_type_ids_for_a_model_without_them_are_refused_unless_deberta_reads_none(masked_lm):
    """ModernBERT (as transformers' class) takes no token types; DeBERTa's classes take its tokenizer's and ignore
    them (tests/test_deberta.py compares that with transformers)."""
    model, params = masked_lm("modernbert-tiny")
    ids = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
    with pytest.raises(ValueError, match="no token-type embedding .*can be left out"):
        model.apply({"params": params}, ids, token_type_ids=jnp.zeros_like(ids))


@pytest.mark.parametrize("name", ["token_type_ids", "position_ids", "segment_ids"])
def test_float_ids_are_refused_not_cast(name, masked_lm):
    """1.7 was cast to 1 silently (float input_ids and masked_positions were refused already); masks may be floats
    and booleans stay accepted as ids (0/1)."""
    model, params = masked_lm("bert-tiny")
    ids = np.array([[1, 2, 3, 4]], np.int32)
    with pytest.raises(ValueError, match=f"{name} must be integers, got float32"):
        model.apply({"params": params}, ids, **{name: np.ones((1, 4), np.float32)})
    model.apply({"params": params}, ids, attention_mask=np.ones((1, 4), np.float32),
                **{name: np.ones((1, 4), bool)})
