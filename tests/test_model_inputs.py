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
            rng = np.random.default_rng(0)
            flat = {path: jnp.asarray((1.0 if path[-1] == "scale" else 0.0) + 0.05 * rng.standard_normal(spec.shape),
                                      spec.dtype) for path, spec in expected_params(model).items()}
            built[preset] = model, traverse_util.unflatten_dict(flat)
        return built[preset]

    return get


def run(model, params, ids, mask=None, **kwargs):
    mask = None if mask is None else jnp.asarray(mask)
    return model.apply({"params": params}, jnp.asarray(ids), attention_mask=mask, **kwargs)


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
    # padded rows, so the eager ops reuse their kernels.
    gap_at = 5
    gapped_ids = np.concatenate([ids[:, :gap_at], rng.integers(0, vocab, (2, left)), ids[:, gap_at:],
                                 rng.integers(0, vocab, (2, right))], 1)
    gapped_mask = np.concatenate([mask[:, :gap_at], np.zeros((2, left), np.int32), mask[:, gap_at:],
                                  np.zeros((2, right), np.int32)], 1)

    # Sliding windows count by index, as transformers', so a gap widens the span a local layer sees.
    cases = [(padded_ids, padded_mask)]
    if model.config.local_window is None:
        cases.append((gapped_ids, gapped_mask))

    plain = run(model, params, ids, mask)
    valid = mask.astype(bool)
    for padded, kept in ((run(model, params, case_ids, case_mask), case_mask) for case_ids, case_mask in cases):
        for name in ("logits", "last_hidden_state"):
            expected = np.asarray(getattr(plain, name))[valid]
            actual = np.asarray(getattr(padded, name))[kept.astype(bool)]
            assert np.all(np.isfinite(actual)), name
            np.testing.assert_allclose(actual, expected, atol=ATOL, rtol=0, err_msg=name)


@pytest.mark.parametrize("preset", PRESETS)
def test_one_token_sequence(preset, masked_lm):
    model, params = masked_lm(preset)
    alone = run(model, params, [[5]])
    assert alone.logits.shape == (1, 1, model.config.vocab_size)
    in_padding = run(model, params, [[5, 9, 9, 9, 9]], [[1, 0, 0, 0, 0]])
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
