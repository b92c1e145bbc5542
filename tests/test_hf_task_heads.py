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
    params = bertjax.init_params(model, jax.random.key(0))
    params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(1), p.shape), params)
    padded, mask, packed, segments = packed_and_padded()
    expected = model.apply({"params": params}, jnp.asarray(padded), attention_mask=jnp.asarray(mask)).logits
    out = model.apply({"params": params}, jnp.asarray(packed), segment_ids=jnp.asarray(segments),
                      max_segments=MAX_SEGMENTS)
    assert out.logits.shape == (len(PACKED_ROWS), MAX_SEGMENTS, 3) and out.logits.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out.segment_mask), [[True, True, True], [True, False, False]])
    for r, members in enumerate(PACKED_ROWS):
        for k, i in enumerate(members):
            np.testing.assert_allclose(np.asarray(out.logits[r, k]), np.asarray(expected[i]), atol=2e-5)
    np.testing.assert_array_equal(np.asarray(out.logits[1, 1:]), 0.0)  # empty slots are zeros
