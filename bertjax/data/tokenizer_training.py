"""Train a SentencePiece tokenizer (BPE or unigram) with BERT's special tokens, from any documents.

Ids 0..4 are `[PAD] [UNK] [CLS] [SEP] [MASK]`: pad at 0 matches `EncoderConfig.pad_token_id`'s default.
`[CLS] [SEP] [MASK]` are control symbols: text that happens to contain "[MASK]" never encodes to them.
"""

from __future__ import annotations

import io
import pathlib
from collections.abc import Iterable
from typing import Literal

from bertjax.data.tokenizers import SentencePieceTokenizer

ModelType = Literal["bpe", "unigram"]
MODEL_TYPES: tuple[str, ...] = ("bpe", "unigram")
DEFAULT_VOCAB_SIZE = 8192  # a multiple of 128 (TPU-friendly embedding), enough for the ~1M-token default corpus
# SentencePiece ignores longer input lines; documents are fed line by line, longer lines in pieces of at most this.
_MAX_LINE_BYTES = 4192
_TRAINER_OPTIONS = dict(
    pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
    control_symbols=["[CLS]", "[SEP]", "[MASK]"],
    # Byte fallback spells rare characters with byte pieces instead of [UNK].
    byte_fallback=True, split_digits=True, character_coverage=0.9995,
    # A small corpus may not support `vocab_size` pieces: a smaller vocabulary beats a failed run.
    hard_vocab_limit=False, minloglevel=2)


def train_sentencepiece(documents: Iterable[str], out_dir: str | pathlib.Path, *, vocab_size: int = DEFAULT_VOCAB_SIZE,
                        model_type: ModelType = "bpe", max_lines: int = 200_000, seed: int = 0,
                        num_threads: int = 2) -> SentencePieceTokenizer:
    """Train on `documents` (at most `max_lines` of their lines, sampled by SentencePiece) and save
    `out_dir/tokenizer.model`. Deterministic for a seed and input."""
    import sentencepiece

    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    lines = [piece for doc in documents for line in doc.splitlines() for piece in _line_pieces(line.strip())]
    if not lines:
        raise ValueError("no text to train the tokenizer on (all documents are empty)")
    sentencepiece.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type=model_type,
            input_sentence_size=max_lines, shuffle_input_sentence=True, num_threads=num_threads, **_TRAINER_OPTIONS)
    except RuntimeError as error:  # e.g. a vocabulary smaller than the characters + 256 byte pieces
        raise ValueError(f"SentencePiece training failed (vocab_size={vocab_size}): {error}") from None
    tokenizer = SentencePieceTokenizer(model.getvalue(), source=str(pathlib.Path(out_dir) / "tokenizer.model"))
    tokenizer.save(out_dir)
    return tokenizer


def _line_pieces(line: str, limit: int = _MAX_LINE_BYTES) -> list[str]:
    """`line` cut at spaces into pieces SentencePiece accepts (a longer run without spaces is cut anywhere), so
    long lines (minified text, one-paragraph-per-line corpora) train the tokenizer instead of vanishing."""
    if len(line.encode("utf-8")) <= limit:
        return [line] if line else []
    pieces, current, size = [], [], 0
    for word in line.split():
        while len(word.encode("utf-8")) > limit:  # characters, not bytes: never split a UTF-8 sequence
            if current:
                pieces.append(" ".join(current))
                current, size = [], 0
            cut = len(word.encode("utf-8")[:limit].decode("utf-8", errors="ignore"))
            pieces.append(word[:cut])
            word = word[cut:]
        length = len(word.encode("utf-8"))
        if current and size + 1 + length > limit:
            pieces.append(" ".join(current))
            current, size = [], 0
        size += length + (1 if current else 0)
        current.append(word)
    if current:
        pieces.append(" ".join(current))
    return pieces


def train_default_tokenizer(out_dir: str | pathlib.Path, vocab_size: int = DEFAULT_VOCAB_SIZE, *,
                            model_type: ModelType = "bpe", max_lines: int = 200_000, seed: int = 0,
                            eval_fraction: float | None = None) -> SentencePieceTokenizer:
    """A SentencePiece tokenizer trained on the train split of the embedded default corpus (seconds for BPE)."""
    from bertjax.data.default_corpus import DEFAULT_EVAL_FRACTION, default_corpus_documents

    fraction = DEFAULT_EVAL_FRACTION if eval_fraction is None else eval_fraction
    return train_sentencepiece(default_corpus_documents("train", fraction), out_dir, vocab_size=vocab_size,
                               model_type=model_type, max_lines=max_lines, seed=seed)
