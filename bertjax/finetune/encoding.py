"""Examples -> fixed-length rows of token ids, padded to data.max_length, with the special tokens where the model's
tokenizer puts them (`tokenizer.special_template`: BERT's `[CLS] first [SEP] second [SEP]` with token types 0/1,
RoBERTa's `<s> first </s></s> second </s>`, ...).

Every row has the same length so that one compiled step serves every batch. `segment_ids` is 1 on real tokens
and 0 on padding (the models' attention mask); `token_type_ids` are the template's.
A row that does not fit is cut longest-text-first (as transformers' default truncation), or, with
data.truncation=false, is an error that names the example.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

IGNORE = -100  # label of a position that the loss and the metrics skip (as transformers)


def fit_pair(first: list[int], second: list[int] | None, max_length: int, truncation: bool,
             what: str, specials: int) -> tuple[list[int], list[int] | None]:
    """Cut `first`/`second` to fit with their `specials` special tokens, from their ends, as the fast tokenizers
    transformers loads (`longest_first`) cut them: the shorter text keeps up to half the room and the longer one
    the rest, so an odd token goes to the longer text, and to the second one when both are as long."""
    room = max_length - specials
    total = len(first) + (len(second) if second is not None else 0)
    if total <= room:
        return first, second
    if not truncation:
        raise ValueError(f"{what} is {total + specials} tokens, longer than data.max_length={max_length}; raise "
                         "data.max_length or allow cutting with data.truncation=true")
    if second is None:
        return list(first[:room]), None
    shorter = min(room // 2, len(first), len(second))
    longer = min(max(len(first), len(second)), room - shorter)
    keep_first, keep_second = (longer, shorter) if len(first) > len(second) else (shorter, longer)
    return list(first[:keep_first]), list(second[:keep_second])


def layout(tokenizer, first: Sequence[int], second: Sequence[int] | None, max_length: int) -> dict[str, np.ndarray]:
    """One padded row (input_ids, segment_ids, token_type_ids); the texts must already fit."""
    ids, types = tokenizer.special_template.build(first, second)
    if len(ids) > max_length:
        raise ValueError(f"internal: a row of {len(ids)} tokens for max_length {max_length}")
    row = {"input_ids": np.full(max_length, tokenizer.pad_id, np.int32),
           "segment_ids": np.zeros(max_length, np.int32), "token_type_ids": np.zeros(max_length, np.int32)}
    row["input_ids"][:len(ids)] = ids
    row["segment_ids"][:len(ids)] = 1
    row["token_type_ids"][:len(ids)] = types
    return row


def encode_texts(tokenizer, texts: Sequence[str], pairs: Sequence[str | None] | None, max_length: int,
                 truncation: bool, source: str) -> dict[str, np.ndarray]:
    """Rows for texts (and their pairs): arrays [examples, max_length]. A None pair (or `pairs` None) is a single
    text: each row is laid out as the tokenizer lays out that example alone, so a file may mix both."""
    return encode_texts_and_cuts(tokenizer, texts, pairs, max_length, truncation, source)[0]


def encode_texts_and_cuts(tokenizer, texts: Sequence[str], pairs: Sequence[str | None] | None, max_length: int,
                          truncation: bool, source: str,
                          where: Callable[[int], str] | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`encode_texts`, and which examples were cut to fit max_length (bool [examples]: part of them never reaches
    the model, which `bertjax predict` counts). `where(i)` names text i in errors when it is not `source`'s
    example i + 1 (a multiple-choice row holds several)."""
    firsts = tokenizer.encode_batch(list(texts))
    pairs = [None] * len(firsts) if pairs is None else list(pairs)
    paired = [i for i, pair in enumerate(pairs) if pair is not None]
    seconds: list = [None] * len(firsts)
    for i, ids in zip(paired, tokenizer.encode_batch([pairs[i] for i in paired]) if paired else []):
        seconds[i] = [int(t) for t in ids]
    rows, cut = [], np.zeros(len(firsts), bool)
    for i, (first, second) in enumerate(zip(firsts, seconds)):
        specials = tokenizer.special_template.specials(second is not None)
        length = len(first) + (len(second) if second is not None else 0)
        first, second = fit_pair([int(t) for t in first], second, max_length, truncation,
                                 where(i) if where is not None else f"{source}, example {i + 1}", specials)
        cut[i] = len(first) + (len(second) if second is not None else 0) < length
        rows.append(layout(tokenizer, first, second, max_length))
    return stack(rows), cut


def stack(rows: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


def encode_words(tokenizer, words: Sequence[str], max_length: int, truncation: bool,
                 what: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One row for a sentence given as words, and `word_of_token` [max_length]: the index of the word whose
    first sub-token sits at each position, -1 elsewhere (later sub-tokens, specials, padding).

    Each word is tokenised on its own, so a word's pieces never merge with a neighbour's and a label belongs to
    exactly one first piece (transformers' `is_split_into_words` does the same). A word with no piece (only
    whitespace) has no position; the words cut by truncation have none either, and predict gives them a null tag.
    """
    # A space before each word makes byte-level BPE (RoBERTa) pick its word-initial pieces, as in running text; as
    # transformers' add_prefix_space, none before a word that starts with a space, and an empty word stays empty
    # (no piece, no position). WordPiece and SentencePiece encode " word" exactly as "word".
    spaced = [word if not word or word.startswith(" ") else " " + word for word in words]
    pieces = tokenizer.encode_batch(spaced) if len(words) else []
    total = sum(len(p) for p in pieces)
    template = tokenizer.special_template
    specials, start = template.specials(pair=False), template.text_start(0, 0, pair=False)
    if total + specials > max_length and not truncation:
        raise ValueError(f"{what} is {total + specials} tokens, longer than data.max_length={max_length}; raise "
                         "data.max_length or allow cutting with data.truncation=true")
    ids: list[int] = []
    word_of_token = np.full(max_length, -1, np.int32)
    for index, word_pieces in enumerate(pieces):
        if len(word_pieces) == 0:
            continue
        room = max_length - specials - len(ids)
        if room <= 0:
            break
        # A word the cut falls inside keeps its first pieces, as transformers' truncation cuts: its label sits on
        # the first (kept whole or dropped, a long word such as a URL lost its tag too).
        word_of_token[start + len(ids)] = index
        ids.extend(int(t) for t in word_pieces[:room])
        if len(word_pieces) > room:
            break
    return layout(tokenizer, ids, None, max_length), word_of_token


def word_labels_to_tokens(word_of_token: np.ndarray, word_labels: Sequence[int]) -> np.ndarray:
    """Token labels: each word's label on its first sub-token, IGNORE everywhere else."""
    labels = np.full(word_of_token.shape, IGNORE, np.int32)
    first = word_of_token >= 0
    labels[first] = np.asarray(word_labels, np.int32)[word_of_token[first]]
    return labels


def token_predictions_to_words(word_of_token: np.ndarray, token_predictions: np.ndarray, num_words: int,
                               default: int) -> np.ndarray:
    """Per word, the prediction at its first sub-token; `default` for words without a position."""
    token_predictions = np.asarray(token_predictions)
    out = np.full(num_words, default, token_predictions.dtype)
    first = word_of_token >= 0
    out[word_of_token[first]] = token_predictions[first]
    return out
