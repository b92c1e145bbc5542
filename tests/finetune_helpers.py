"""Shared pieces of the fine-tuning tests: a tiny model directory with its tokenizer, and synthetic data files."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np

POSITIVE = ["good", "great", "fine", "nice", "happy", "warm", "bright", "kind"]
NEGATIVE = ["bad", "poor", "sad", "cold", "dark", "rude", "grim", "dull"]
NEUTRAL = ["the", "a", "day", "was", "it", "and", "very", "so", "is", "of"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + POSITIVE + NEGATIVE + NEUTRAL + ["paris", "france", "who", "where", "?", ".", ","]


def tiny_model_dir(path: Path, preset: str = "bert-tiny", **overrides) -> Path:
    """A transformers directory of a randomly initialised tiny MLM (hidden 32, 2 layers) and a WordPiece vocab."""
    import bertjax
    from bertjax.data.tokenizers import WordPieceTokenizer
    from bertjax.models import MODEL_CLASSES, init_params

    config = bertjax.get_config(preset, **{"vocab_size": len(VOCAB), "pad_token_id": 0, "dropout_rate": 0.0,
                                           **overrides})
    model = MODEL_CLASSES["masked_lm"](config)
    # With the special-token ids a checkpoint's config.json carries besides the padding one (best/ keeps them).
    bertjax.save_pretrained(str(path), model, init_params(model, jax.random.key(0)),
                            token_ids={"bos_token_id": VOCAB.index("[CLS]"), "eos_token_id": VOCAB.index("[SEP]")})
    WordPieceTokenizer("\n".join(VOCAB)).save(path)
    return path


def sentiment_rows(count: int, seed: int) -> list[dict]:
    """Separable sentences: the label says whether the sentence's cue words are positive or negative."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        label = int(rng.integers(2))
        cues = POSITIVE if label else NEGATIVE
        words = list(rng.choice(NEUTRAL, size=int(rng.integers(2, 6)))) + list(rng.choice(cues, size=2))
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": "positive" if label else "negative"})
    return rows


def choice_rows(rng: np.random.Generator, count: int) -> list[dict]:
    """Multiple choice: three answers, one of them made of positive words (the label)."""
    rows = []
    for _ in range(count):
        label = int(rng.integers(3))
        choices = [" ".join(rng.choice(NEGATIVE, 2)) for _ in range(3)]
        choices[label] = " ".join(rng.choice(POSITIVE, 2))
        rows.append({"question": "which is good ?", "choices": choices, "label": label})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def finetune_files(root: Path, train_rows: int, validation_rows: int) -> dict[str, Path]:
    """A tiny model directory and sentiment train/validation files under `root` (the fine-tuning tests' inputs)."""
    return {"root": root, "model": tiny_model_dir(root / "model"),
            "train": write_jsonl(root / "train.jsonl", sentiment_rows(train_rows, 0)),
            "validation": write_jsonl(root / "validation.jsonl", sentiment_rows(validation_rows, 1))}
