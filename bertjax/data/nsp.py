"""Sentence-pair rows for BERT's next-sentence prediction (NSP) and ALBERT's sentence-order prediction (SOP).

One pair per row, padded: `[CLS] A [SEP] B [SEP]`, token types 0 for `[CLS] A [SEP]` and 1 for `B [SEP]`, one
segment (A and B attend to each other), positions 0..n-1. Labels (`nsp_labels`), as in Hugging Face:
- NSP: 0 = B follows A in the same document, 1 = B is a random stretch of another document (50% each);
- SOP: 0 = A then B in document order, 1 = the two swapped (50% each).

A document is cut into consecutive pieces of the target length (`seq_len - 3`, or with probability
`short_seq_prob` a random shorter one, as BERT does so that the model also sees short inputs); each piece is cut
in two at a random point to give A and B. For a random-next pair the unused B part of the piece goes back to
the document and starts the next piece, so no text is wasted. A last piece of a single token cannot make a pair
and is dropped (counted).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertjax.data.packing import Rows, SpecialTokens, write_rows

OBJECTIVES = ("nsp", "sop")


def make_sentence_pairs(docs: Sequence[np.ndarray], seq_len: int, objective: str, short_seq_prob: float,
                        specials: SpecialTokens, rng: np.random.Generator) -> tuple[Rows, np.ndarray, int]:
    """Rows of sentence pairs, their labels, and the number of tokens dropped (single-token leftovers)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"sentence objective must be one of {OBJECTIVES}, got {objective!r}")
    if seq_len < 5:
        raise ValueError(f"sentence pairs need seq_len >= 5 ([CLS] A [SEP] B [SEP]), got {seq_len}")
    max_tokens = seq_len - 3
    firsts, seconds, labels = [], [], []
    dropped = 0
    for index, doc in enumerate(docs):
        offset = 0
        while len(doc) - offset >= 2:
            target = max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))
            piece = doc[offset:offset + target]
            split = int(rng.integers(1, len(piece)))
            first, label = piece[:split], 0
            if objective == "nsp" and len(docs) > 1 and rng.random() < 0.5:
                second = _random_stretch(docs, index, target - split, rng)
                label = 1
                offset += split
            else:
                second = piece[split:]
                offset += len(piece)
                if objective == "sop" and rng.random() < 0.5:
                    first, second, label = second, first, 1
            firsts.append(first)
            seconds.append(second)
            labels.append(label)
        dropped += len(doc) - offset
    return _pair_rows(firsts, seconds, seq_len, specials), np.array(labels, np.int32), dropped


def _random_stretch(docs: Sequence[np.ndarray], exclude: int, length: int, rng: np.random.Generator) -> np.ndarray:
    other = int(rng.integers(len(docs) - 1))
    other += other >= exclude  # uniform over the other documents
    doc = docs[other]
    start = int(rng.integers(len(doc)))
    return doc[start:start + max(length, 1)]


def _pair_rows(firsts, seconds, seq_len: int, specials: SpecialTokens) -> Rows:
    cls, sep = np.array([specials.cls_id], np.int32), np.array([specials.sep_id], np.int32)
    n = len(firsts)
    pieces = [np.concatenate((cls, a, sep)) for a in firsts] + [np.concatenate((b, sep)) for b in seconds]
    first_length = np.fromiter((len(a) + 2 for a in firsts), np.int64, n)
    row = np.concatenate((np.arange(n), np.arange(n)))
    column = np.concatenate((np.zeros(n, np.int64), first_length))
    token_type = np.concatenate((np.zeros(n, np.int64), np.ones(n, np.int64)))
    return write_rows(pieces, row, column, np.ones(2 * n, np.int64), token_type, column, n, seq_len,
                      specials.pad_id)
