"""Masked-language-model targets, drawn for many rows at once with numpy.

Per row: the candidates are the real, non-special tokens (segment id > 0, not [CLS]/[SEP]/[PAD]/...). The row's
budget is `rate * candidates`, rounded up or down at random so that its expectation is exactly the rate, and
capped at `max_predictions`. A strategy (`STRATEGIES`) picks which candidates to predict within the budget:
- "token": any tokens (BERT, RoBERTa, ModernBERT);
- "whole_word": whole words only, never part of one (BERT's whole-word masking);
- "span": runs of whole words whose length in words is geometric, truncated at a maximum and renormalised
  (SpanBERT: p=0.2, at most 10 words, mean 3.8 words).
Each picked token becomes [MASK] with probability `mask_fraction`, a random non-special token with probability
`random_fraction`, else stays (BERT's 80/10/10). The outputs have static shapes: `masked_positions`,
`masked_ids` (the original tokens: the labels) and `masked_weights` (1 for a real prediction, 0 for padding) are
[rows, max_predictions], sorted by position with padding last; padding slots hold position 0 and label 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class MaskingVocab:
    """What masking needs to know about the vocabulary (plain arrays: cheap to send to worker processes)."""

    mask_id: int
    is_special: np.ndarray  # bool [vocab]
    word_start: np.ndarray  # bool [vocab]
    replacement_ids: np.ndarray  # int32: the ids a "random token" is drawn from (all non-special ids)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "MaskingVocab":
        is_special = np.zeros(tokenizer.vocab_size, bool)
        is_special[tokenizer.special_ids] = True
        return cls(mask_id=tokenizer.mask_id, is_special=is_special, word_start=np.asarray(tokenizer.word_start),
                   replacement_ids=np.flatnonzero(~is_special).astype(np.int32))


@dataclasses.dataclass(frozen=True)
class MaskingOptions:
    rate: float = 0.15
    mask_fraction: float = 0.8
    random_fraction: float = 0.1
    max_predictions: int = 20
    strategy: str = "token"
    span_p: float = 0.2
    span_max_words: int = 10

    def __post_init__(self):
        if not 0.0 < self.rate < 1.0:
            raise ValueError(f"mlm rate must be in (0, 1), got {self.rate}")
        if self.mask_fraction < 0 or self.random_fraction < 0 or self.mask_fraction + self.random_fraction > 1:
            # Named as the run config spells them (DataConfig.masking_options builds these options from them).
            raise ValueError(f"data.mask_token_fraction ({self.mask_fraction}) and data.random_token_fraction "
                             f"({self.random_fraction}) must be >= 0 and sum to at most 1 (MaskingOptions "
                             "mask_fraction, random_fraction; the rest of the predicted tokens are kept)")
        if self.max_predictions <= 0:
            raise ValueError(f"max_predictions must be positive, got {self.max_predictions}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"masking strategy must be one of {sorted(STRATEGIES)}, got {self.strategy!r}")
        if not 0.0 < self.span_p <= 1.0 or self.span_max_words <= 0:
            raise ValueError(f"span_p must be in (0, 1] and span_max_words positive, got {self.span_p}, "
                             f"{self.span_max_words}")


def mask_rows(input_ids: np.ndarray, segment_ids: np.ndarray, vocab: MaskingVocab, options: MaskingOptions,
              rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Pick and corrupt the prediction targets of every row; `input_ids` is not modified."""
    num_rows, seq_len = input_ids.shape
    candidate = (segment_ids > 0) & ~vocab.is_special[input_ids]
    num_candidates = candidate.sum(axis=1)
    # Random rounding: E[budget] = rate * candidates exactly, for short rows as for long ones.
    budget = np.floor(num_candidates * options.rate + rng.random(num_rows)).astype(np.int64)
    budget = np.minimum(budget, options.max_predictions)
    selected = STRATEGIES[options.strategy](input_ids, candidate, budget, vocab, options, rng)

    slots = options.max_predictions
    # Selected positions first, in order; the rest after them (key seq_len + position).
    key = np.where(selected, 0, seq_len) + np.arange(seq_len)
    positions = np.argsort(key, axis=1, kind="stable")[:, :slots].astype(np.int32)
    weights = np.arange(slots) < selected.sum(axis=1, keepdims=True)
    positions = np.where(weights, positions, 0).astype(np.int32)
    labels = np.where(weights, np.take_along_axis(input_ids, positions, axis=1), 0).astype(np.int32)

    choice = rng.random((num_rows, slots))
    random_tokens = vocab.replacement_ids[rng.integers(0, len(vocab.replacement_ids), (num_rows, slots))]
    replacement = np.where(choice < options.mask_fraction, vocab.mask_id,
                           np.where(choice < options.mask_fraction + options.random_fraction, random_tokens, labels))
    corrupted = input_ids.copy()
    row, slot = np.nonzero(weights)
    corrupted[row, positions[row, slot]] = replacement[row, slot]
    return {"input_ids": corrupted, "masked_positions": positions, "masked_ids": labels,
            "masked_weights": weights.astype(np.float32)}


def select_tokens(input_ids, candidate, budget, vocab, options, rng) -> np.ndarray:
    keys = np.where(candidate, rng.random(candidate.shape), np.inf)
    rank = np.argsort(np.argsort(keys, axis=1), axis=1)
    return candidate & (rank < budget[:, None])


def word_ids(input_ids: np.ndarray, candidate: np.ndarray, vocab: MaskingVocab) -> np.ndarray:
    """[rows, seq] number of the word each token belongs to (within its row). A word never spans a non-candidate
    (special, padding): those tokens are one-token words of their own."""
    starts = vocab.word_start[input_ids] | ~candidate
    starts[:, 1:] |= ~candidate[:, :-1]
    starts[:, 0] = True
    return np.cumsum(starts, axis=1) - 1


def select_whole_words(input_ids, candidate, budget, vocab, options, rng) -> np.ndarray:
    num_rows, seq_len = candidate.shape
    words = word_ids(input_ids, candidate, vocab)
    flat_words = words + np.arange(num_rows)[:, None] * seq_len
    word_length = np.bincount(flat_words.ravel(), minlength=num_rows * seq_len).reshape(num_rows, seq_len)
    word_is_candidate = np.zeros(num_rows * seq_len, bool)
    word_is_candidate[flat_words[candidate]] = True
    word_is_candidate = word_is_candidate.reshape(num_rows, seq_len) & (word_length > 0)

    # Words in random order; take them while they fit the budget. A second pass fills what the first left with
    # the words short enough for the remainder, so long words do not waste the budget.
    order = np.argsort(np.where(word_is_candidate, rng.random((num_rows, seq_len)), np.inf), axis=1)
    length = np.where(np.take_along_axis(word_is_candidate, order, axis=1),
                      np.take_along_axis(word_length, order, axis=1), 0)
    taken = (length > 0) & (np.cumsum(length, axis=1) <= budget[:, None])
    left = budget - np.where(taken, length, 0).sum(axis=1)
    second = np.where(~taken & (length <= left[:, None]), length, 0)
    taken |= (second > 0) & (np.cumsum(second, axis=1) <= left[:, None])

    chosen_word = np.zeros((num_rows, seq_len), bool)
    np.put_along_axis(chosen_word, order, taken, axis=1)
    return candidate & np.take_along_axis(chosen_word, words, axis=1)


def select_spans(input_ids, candidate, budget, vocab, options, rng) -> np.ndarray:
    num_rows, seq_len = candidate.shape
    words = word_ids(input_ids, candidate, vocab)
    selected = np.zeros((num_rows, seq_len), bool)
    for r in range(num_rows):
        if budget[r] == 0:
            continue
        # Words of this row: first token, length, and whether the next word continues the same run of
        # candidates (a span never crosses a [SEP] or padding).
        first = np.flatnonzero(np.diff(words[r], prepend=-1))
        length = np.diff(first, append=seq_len)
        is_candidate = candidate[r, first]
        selected[r] = _spans_in_row(first, length, is_candidate, int(budget[r]), options, rng, seq_len)
    return selected


def span_length_law(p: float, max_words: int) -> tuple[np.ndarray, np.ndarray]:
    """(lengths 1..max_words, their probabilities): geometric(p) truncated at max_words and renormalised, as
    SpanBERT draws its spans (not clipped: clipping would pile the tail's mass onto the longest span)."""
    lengths = np.arange(1, max_words + 1)
    law = p * (1.0 - p) ** (lengths - 1)
    return lengths, law / law.sum()


def _spans_in_row(first, length, is_candidate, budget, options, rng, seq_len) -> np.ndarray:
    chosen = np.zeros(len(first), bool)
    used = 0
    starts = np.flatnonzero(is_candidate)
    lengths, law = span_length_law(options.span_p, options.span_max_words)
    # Each attempt draws a span; a span that cannot fit at all costs an attempt, so the loop always ends.
    for _ in range(4 * budget + 4):
        if used >= budget or not len(starts):
            break
        words = int(rng.choice(lengths, p=law))
        start = int(starts[rng.integers(len(starts))])
        end = start
        size = 0
        while (end < len(first) and end - start < words and is_candidate[end] and not chosen[end]
               and used + size + length[end] <= budget):
            size += length[end]
            end += 1
        if end > start:
            chosen[start:end] = True
            used += size
            starts = starts[~chosen[starts]]
    token_chosen = np.zeros(seq_len, bool)
    for w in np.flatnonzero(chosen):
        token_chosen[first[w]:first[w] + length[w]] = True
    return token_chosen


# DataConfig.masking -> how to pick the tokens to predict, given the candidates and each row's budget.
STRATEGIES: dict[str, Callable[..., np.ndarray]] = {
    "token": select_tokens,
    "whole_word": select_whole_words,
    "span": select_spans,
}
