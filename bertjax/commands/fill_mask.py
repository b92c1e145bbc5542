"""`bertjax fill-mask --model DIR "text with [MASK]"`: the most likely tokens at each [MASK].

DIR is any directory `bertjax.model_dirs.load_model_dir` reads: a pretraining workdir (`bertjax pretrain --workdir`:
its latest checkpoint, or `--step N`, and its tokenizer), a Hugging Face checkpoint directory (`config.json` +
weights + tokenizer files), or a bertjax model directory (`bertjax convert --from-hf` output).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

HELP = "predict the tokens hidden behind [MASK] with a pretrained masked language model"

# Mask spellings accepted in the text, whatever the tokenizer's own mask token is.
MASK_PATTERN = re.compile(r"\[MASK\]|<mask>")


@dataclass(frozen=True)
class Prediction:
    token: str
    token_id: int
    probability: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="a pretraining workdir or a directory converted from Hugging Face")
    parser.add_argument("--step", type=int, metavar="N",
                        help="with a pretraining workdir: the checkpoint to use (default: the latest)")
    parser.add_argument("--top-k", type=int, default=5, help="predictions shown per [MASK] (default 5)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="read a Hugging Face pytorch_model.bin (a pickle: only for files you trust)")
    parser.add_argument("texts", nargs="+", metavar="TEXT", help='sentences containing [MASK] (or <mask>)')


def run(args: argparse.Namespace) -> int:
    if args.top_k <= 0:
        raise ValueError(f"--top-k must be positive, got {args.top_k}")
    predictor = load_predictor(args.model, step=args.step, allow_pickle=args.allow_pickle)
    for text in args.texts:
        print(format_predictions(text, predictor(text, args.top_k)))
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Prediction.

def encode_with_masks(tokenizer, text: str) -> tuple[np.ndarray, np.ndarray]:
    """([CLS] text [SEP] ids with the mask id at each [MASK], positions of the masks)."""
    pieces = MASK_PATTERN.split(text)
    if len(pieces) < 2:
        raise ValueError(f"no [MASK] in {text!r}")
    ids = [tokenizer.cls_id]
    masks = []
    for i, piece in enumerate(pieces):
        # The mask absorbs the space before it (as RoBERTa's <mask> does); the space after it stays with the
        # next word, which byte-level BPE needs to pick the word-initial token.
        piece = piece.rstrip() if i == 0 else piece
        if i < len(pieces) - 1:
            piece = piece.rstrip()
        if piece.strip():
            ids.extend(int(t) for t in tokenizer.encode(piece))
        if i < len(pieces) - 1:
            masks.append(len(ids))
            ids.append(tokenizer.mask_id)
    ids.append(tokenizer.sep_id)
    return np.asarray(ids, np.int32), np.asarray(masks, np.int32)


def make_predictor(model, params, tokenizer) -> Callable[[str, int], list[list[Prediction]]]:
    """`predict(text, top_k)`: for each [MASK] of `text`, the top_k tokens and their probabilities."""
    from bertjax.models.checked import checked

    config = model.config
    banned = np.zeros(config.vocab_size, bool)
    banned[tokenizer.special_ids[tokenizer.special_ids < config.vocab_size]] = True
    banned[tokenizer.vocab_size:] = True  # padding rows of an embedding larger than the vocabulary

    @checked  # jit, with out-of-range ids an error (a model whose vocabulary is smaller than the tokenizer's)
    def probabilities(params, ids, masked_positions):
        kwargs = {"token_type_ids": jnp.zeros_like(ids)} if config.type_vocab_size else {}
        logits = model.apply({"params": params}, ids, masked_positions=masked_positions, **kwargs).logits
        return jax.nn.softmax(jnp.where(jnp.asarray(banned), -jnp.inf, logits.astype(jnp.float32)), axis=-1)

    def predict(text: str, top_k: int = 5) -> list[list[Prediction]]:
        ids, masks = encode_with_masks(tokenizer, text)
        if len(ids) > config.max_position_embeddings - config.position_offset:
            raise ValueError(f"text is {len(ids)} tokens; the model takes at most "
                             f"{config.max_position_embeddings - config.position_offset}")
        probs = np.asarray(probabilities(params, ids[None], masks[None]))[0]
        out = []
        for row in probs:
            options = []
            for t in np.argsort(-row, kind="stable"):
                token = tokenizer.decode([int(t)]).strip()
                if token:  # pieces that decode to nothing (a lone word-boundary marker) say nothing to a reader
                    options.append(Prediction(token, int(t), float(row[t])))
                if len(options) == top_k or row[t] == 0.0:
                    break
            out.append(options)
        return out

    return predict


def load_predictor(model_dir: str | Path, step: int | None = None,
                   allow_pickle: bool = False) -> Callable[[str, int], list[list[Prediction]]]:
    from bertjax.model_dirs import load_model_dir

    model, params, tokenizer = load_model_dir(model_dir, step=step, allow_pickle=allow_pickle)
    if tokenizer is None:
        raise FileNotFoundError(f"--model {model_dir}: no tokenizer in the directory (tokenizer.json, *.model or "
                                "vocab.txt); copy the checkpoint's tokenizer files next to its weights")
    return make_predictor(model, params, tokenizer)


def format_predictions(text: str, predictions: list[list[Prediction]]) -> str:
    """The text with each [MASK] filled by its best guess, then the top-k list per mask."""
    best = iter(p[0].token for p in predictions)
    filled = MASK_PATTERN.sub(lambda _: f"[{next(best)}]", text)
    lines = [filled]
    for i, options in enumerate(predictions):
        shown = ", ".join(f"{p.token!r} {p.probability:.3f}" for p in options)
        lines.append(f"  mask {i + 1}: {shown}")
    return "\n".join(lines)
