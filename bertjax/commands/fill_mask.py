"""`bertjax fill-mask --model DIR "text with [MASK]"`: the most likely tokens at each [MASK].

DIR is a pretraining workdir (`bertjax pretrain --workdir`: its latest checkpoint and its tokenizer), a Hugging Face
checkpoint directory (`config.json` + weights + tokenizer files, read by `bertjax.from_pretrained` and
`bertjax.data.load_tokenizer`), or its `bertjax convert --from-hf` output (which carries the tokenizer files along).
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--top-k", type=int, default=5, help="predictions shown per [MASK] (default 5)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="read a Hugging Face pytorch_model.bin (a pickle: only for files you trust)")
    parser.add_argument("texts", nargs="+", metavar="TEXT", help='sentences containing [MASK] (or <mask>)')


def run(args: argparse.Namespace) -> int:
    if args.top_k <= 0:
        raise ValueError(f"--top-k must be positive, got {args.top_k}")
    predictor = load_predictor(args.model, allow_pickle=args.allow_pickle)
    for text in args.texts:
        print(format_predictions(text, predictor(text, args.top_k)))
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Loading a model directory: one loader per kind of directory, chosen by the files present.

def _is_workdir(path: Path) -> bool:
    from bertjax.train.loop import MODEL_CONFIG_FILE  # written by `bertjax pretrain`: head + EncoderConfig
    return (path / MODEL_CONFIG_FILE).is_file() and (path / "checkpoints").is_dir()


def _is_model_dir(path: Path) -> bool:
    from bertjax.commands.convert import MODEL_FILE, PARAMS_DIR  # `bertjax convert --from-hf` output
    return (path / MODEL_FILE).is_file() and (path / PARAMS_DIR).is_dir()


def _load_model_dir(path: Path, allow_pickle: bool = False):
    from bertjax.commands.convert import load_model_dir as load_converted
    from bertjax.data import load_tokenizer

    model, params = load_converted(str(path))
    return model, params, load_tokenizer(path / "tokenizer" if (path / "tokenizer").is_dir() else path)


def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def _load_workdir(path: Path, allow_pickle: bool = False):
    from bertjax.config import EncoderConfig
    from bertjax.data import load_tokenizer
    from bertjax.models import MODEL_CLASSES
    from bertjax.train.checkpoints import restore_params
    from bertjax.train.loop import MODEL_CONFIG_FILE

    described = json.loads((path / MODEL_CONFIG_FILE).read_text())
    model = MODEL_CLASSES[described["head"]](EncoderConfig.from_dict(described["config"]))
    steps = sorted(int(p.name) for p in (path / "checkpoints").iterdir() if p.name.isdigit())
    if not steps:
        raise FileNotFoundError(f"{path / 'checkpoints'} holds no checkpoint yet")
    params = restore_params(path / "checkpoints" / str(steps[-1]))
    return model, params, load_tokenizer(path / "tokenizer")


def _load_hf_dir(path: Path, allow_pickle: bool = False):
    import bertjax
    from bertjax.data import load_tokenizer

    model, params = bertjax.from_pretrained(str(path), allow_pickle=allow_pickle)
    return model, params, load_tokenizer(path)


# (name, test, loader); the first whose test passes loads the directory.
MODEL_DIR_KINDS: tuple[tuple[str, Callable[[Path], bool], Callable], ...] = (
    ("pretraining workdir", _is_workdir, _load_workdir),
    ("bertjax model directory", _is_model_dir, _load_model_dir),
    ("Hugging Face directory", _is_hf_dir, _load_hf_dir),
)


def load_model_dir(model_dir: str | Path, allow_pickle: bool = False):
    """(model, params, tokenizer) of a pretraining workdir or a converted Hugging Face directory (allow_pickle:
    read a Hugging Face pytorch_model.bin)."""
    path = Path(model_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {path}: no such directory")
    for _, test, loader in MODEL_DIR_KINDS:
        if test(path):
            return loader(path, allow_pickle=allow_pickle)
    raise FileNotFoundError(f"--model {path}: not a pretraining workdir (model_config.json + checkpoints/), a "
                            f"bertjax model directory (model_config.json + params/) or a Hugging Face directory "
                            f"(config.json)")


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


def load_predictor(model_dir: str | Path, allow_pickle: bool = False) -> Callable[[str, int], list[list[Prediction]]]:
    return make_predictor(*load_model_dir(model_dir, allow_pickle))


def format_predictions(text: str, predictions: list[list[Prediction]]) -> str:
    """The text with each [MASK] filled by its best guess, then the top-k list per mask."""
    best = iter(p[0].token for p in predictions)
    filled = MASK_PATTERN.sub(lambda _: f"[{next(best)}]", text)
    lines = [filled]
    for i, options in enumerate(predictions):
        shown = ", ".join(f"{p.token!r} {p.probability:.3f}" for p in options)
        lines.append(f"  mask {i + 1}: {shown}")
    return "\n".join(lines)
