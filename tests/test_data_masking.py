"""MLM masking: rates and the 80/10/10 split measured over many rows, whole words and spans never split, budgets
never exceeded, specials and padding never masked, static shapes."""

import math

import numpy as np
import pytest

from bertjax.data.masking import MaskingOptions, MaskingVocab, mask_rows, word_ids

VOCAB = 1000
MASK, PAD, CLS, SEP = 4, 0, 2, 3
SEQ = 128


def make_vocab(word_start_every: int = 1) -> MaskingVocab:
    is_special = np.zeros(VOCAB, bool)
    is_special[:5] = True
    # Ids divisible by `word_start_every` start words; the others continue the word before them.
    word_start = (np.arange(VOCAB) % word_start_every) == 0
    word_start[:5] = True
    return MaskingVocab(mask_id=MASK, is_special=is_special, word_start=word_start,
                        replacement_ids=np.arange(5, VOCAB, dtype=np.int32))


def make_rows(num_rows: int, seed: int = 0):
    """Packed-looking rows: a few documents [CLS] ... [SEP] per row, then padding."""
    rng = np.random.default_rng(seed)
    ids = np.full((num_rows, SEQ), PAD, np.int32)
    seg = np.zeros((num_rows, SEQ), np.int32)
    for r in range(num_rows):
        col, segment = 0, 1
        fill = rng.integers(SEQ // 2, SEQ + 1)
        while col + 3 <= fill:
            n = int(min(rng.integers(1, 60), fill - col - 2))
            ids[r, col] = CLS
            ids[r, col + 1:col + 1 + n] = rng.integers(5, VOCAB, n)
            ids[r, col + 1 + n] = SEP
            seg[r, col:col + n + 2] = segment
            col += n + 2
            segment += 1
    return ids, seg


def candidates(ids, seg):
    return (seg > 0) & (ids >= 5)


@pytest.mark.parametrize("rate", [0.15, 0.30])
def test_token_masking_rate_and_80_10_10(rate):
    ids, seg = make_rows(3000)
    options = MaskingOptions(rate=rate, max_predictions=math.ceil(SEQ * rate))
    out = mask_rows(ids, seg, make_vocab(), options, np.random.default_rng(1))
    weights = out["masked_weights"] > 0
    assert abs(weights.sum() / candidates(ids, seg).sum() - rate) < 0.01

    rows, slots = np.nonzero(weights)
    positions = out["masked_positions"][rows, slots]
    original = ids[rows, positions]
    now = out["input_ids"][rows, positions]
    np.testing.assert_array_equal(out["masked_ids"][rows, slots], original)
    masked = now == MASK
    kept = now == original
    randomised = ~masked & ~kept
    # A random replacement equal to the original token (probability 1/995) counts as kept: negligible here.
    assert abs(masked.mean() - 0.8) < 0.01
    assert abs(randomised.mean() - 0.1) < 0.01
    assert abs(kept.mean() - 0.1) < 0.01
    assert not np.isin(now[randomised], np.arange(5)).any(), "random replacements must not be special tokens"
    # Nothing changes outside the predicted positions.
    unchanged = np.ones_like(ids, bool)
    unchanged[rows, positions] = False
    np.testing.assert_array_equal(out["input_ids"][unchanged], ids[unchanged])


def test_budget_static_shapes_and_never_special():
    ids, seg = make_rows(500)
    options = MaskingOptions(rate=0.15, max_predictions=12)
    out = mask_rows(ids, seg, make_vocab(), options, np.random.default_rng(2))
    for name in ("masked_positions", "masked_ids", "masked_weights"):
        assert out[name].shape == (500, 12)
    assert out["masked_positions"].dtype == np.int32 and out["masked_ids"].dtype == np.int32
    assert out["masked_weights"].dtype == np.float32 and out["input_ids"].dtype == np.int32
    weights = out["masked_weights"] > 0
    n_cand = candidates(ids, seg).sum(1)
    count = weights.sum(1)
    # The budget is rate * candidates rounded up or down, capped at max_predictions.
    assert np.all(count <= np.minimum(np.ceil(n_cand * 0.15), 12))
    assert np.all(count >= np.minimum(np.floor(n_cand * 0.15), 12))
    # Real predictions first, ascending; padding slots hold position 0 and label 0.
    for r in range(500):
        real = out["masked_positions"][r, weights[r]]
        assert np.all(np.diff(real) > 0)
        assert np.all(weights[r, :count[r]])
        assert np.all(out["masked_positions"][r, ~weights[r]] == 0) and np.all(out["masked_ids"][r, ~weights[r]] == 0)
    rows, slots = np.nonzero(weights)
    assert candidates(ids, seg)[rows, out["masked_positions"][rows, slots]].all(), "special or pad token masked"


def test_masks_are_reproducible_and_change_with_the_seed():
    ids, seg = make_rows(50)
    options = MaskingOptions()
    a = mask_rows(ids, seg, make_vocab(), options, np.random.default_rng(7))
    b = mask_rows(ids, seg, make_vocab(), options, np.random.default_rng(7))
    c = mask_rows(ids, seg, make_vocab(), options, np.random.default_rng(8))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["masked_positions"], c["masked_positions"])


def reference_words(ids_row, cand_row, vocab):
    """Independent, loop-based word segmentation: list of (start, end) token ranges of candidate words."""
    words, start = [], None
    for i, token in enumerate(ids_row):
        starts_word = (not cand_row[i]) or vocab.word_start[token] or i == 0 or not cand_row[i - 1]
        if start is not None and starts_word:
            words.append((start, i))
            start = None
        if cand_row[i] and start is None:
            start = i
    if start is not None:
        words.append((start, len(ids_row)))
    return words


@pytest.mark.parametrize("strategy", ["whole_word", "span"])
def test_whole_word_and_span_masking_never_split_a_word(strategy):
    vocab = make_vocab(word_start_every=3)  # words of ~3 tokens
    ids, seg = make_rows(400, seed=3)
    options = MaskingOptions(rate=0.15, max_predictions=20, strategy=strategy)
    out = mask_rows(ids, seg, vocab, options, np.random.default_rng(4))
    weights = out["masked_weights"] > 0
    cand = candidates(ids, seg)
    n_cand = cand.sum(1)
    assert np.all(weights.sum(1) <= np.minimum(np.ceil(n_cand * 0.15), 20)), "budget exceeded"
    span_words = []
    for r in range(len(ids)):
        chosen = np.zeros(SEQ, bool)
        chosen[out["masked_positions"][r, weights[r]]] = True
        words = reference_words(ids[r], cand[r], vocab)
        for start, end in words:
            assert chosen[start:end].all() or not chosen[start:end].any(), f"row {r}: word {start}:{end} split"
        # Consecutive chosen words form the spans.
        run = 0
        for start, end in words:
            if chosen[start]:
                run += 1
            elif run:
                span_words.append(run)
                run = 0
        if run:
            span_words.append(run)
    rate = weights.sum() / cand.sum()
    # Whole words rarely fit the budget exactly; the shortfall stays small.
    assert 0.13 < rate <= 0.15 + 0.005
    if strategy == "span":
        # Geometric(0.2) truncated at 10 has mean 3.8 words (shortened by the budget and by run ends): spans are
        # clearly longer than single words.
        assert np.mean(span_words) > 1.8


def test_word_ids_follow_word_starts_and_specials():
    vocab = make_vocab(word_start_every=2)
    ids = np.array([[CLS, 6, 7, 9, 8, SEP, CLS, 7, SEP, PAD]], np.int32)
    seg = np.array([[1, 1, 1, 1, 1, 1, 2, 2, 2, 0]], np.int32)
    words = word_ids(ids, candidates(ids, seg), vocab)
    # 6 starts a word, 7 continues it; 9 continues too (odd); 8 starts one; the 7 after [CLS] starts its own.
    np.testing.assert_array_equal(words[0], [0, 1, 1, 1, 2, 3, 4, 5, 6, 7])


def test_invalid_options_are_rejected():
    with pytest.raises(ValueError, match="mask_fraction"):
        MaskingOptions(mask_fraction=0.9, random_fraction=0.2)
    with pytest.raises(ValueError, match="strategy"):
        MaskingOptions(strategy="words")
    with pytest.raises(ValueError, match="rate"):
        MaskingOptions(rate=0.0)


@pytest.mark.parametrize("size", ["base", "large"])
def test_modernbert_configs_mask_as_published(size):
    """ModernBERT (Warner et al., 2024): 30% of tokens predicted, 80/10/10, i.e. 24% [MASK], 3% random, 3% kept of
    all maskable tokens; held-out batches at 15%. Read from the shipped run configs, measured over many rows."""
    from bertjax.train.run_config import load_run_config
    from train_helpers import REPO

    data = load_run_config(REPO / f"configs/pretrain/modernbert-{size}.yaml").data.replace(seq_len=SEQ)
    ids, seg = make_rows(3000)
    total = candidates(ids, seg).sum()
    for config, rate in ((data, 0.30), (data.for_evaluation(), 0.15)):
        out = mask_rows(ids, seg, make_vocab(), config.masking_options(), np.random.default_rng(2))
        rows, slots = np.nonzero(out["masked_weights"] > 0)
        positions = out["masked_positions"][rows, slots]
        now, original = out["input_ids"][rows, positions], ids[rows, positions]
        masked, kept = now == MASK, now == original
        assert abs(len(rows) / total - rate) < 0.01
        assert abs(masked.sum() / total - 0.8 * rate) < 0.01
        assert abs((~masked & ~kept).sum() / total - 0.1 * rate) < 0.01
        assert abs(kept.sum() / total - 0.1 * rate) < 0.01
    assert (data.mlm_probability, data.mask_token_fraction, data.random_token_fraction) == (0.3, 0.8, 0.1)
    assert data.for_evaluation().mlm_probability == 0.15


def test_span_lengths_follow_spanberts_truncated_geometric_law():
    """SpanBERT (Joshi et al., 2020, section 3.1): geometric(0.2) truncated at 10 words and renormalised, mean 3.8.
    Clipping at 10 instead would put the tail's mass on 10 (mean 4.46)."""
    from bertjax.data.masking import span_length_law

    lengths, law = span_length_law(0.2, 10)
    numpy_law = np.array([0.2 * 0.8 ** (k - 1) for k in range(1, 11)])
    np.testing.assert_allclose(law, numpy_law / numpy_law.sum(), rtol=1e-12)
    assert abs(float((lengths * law).sum()) - 3.797) < 1e-3
    _, albert = span_length_law(0.5, 3)  # configs/pretrain/albert-base.yaml
    np.testing.assert_allclose(albert, [4 / 7, 2 / 7, 1 / 7])
