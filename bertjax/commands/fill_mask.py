"""`bertjax fill-mask --model DIR "text with [MASK]"`: the most likely tokens at each [MASK].

DIR is any directory `bertjax.model_dirs.load_model_dir` reads: a pretraining workdir (`bertjax pretrain --workdir`:
its latest checkpoint, or `--step N`, and its tokenizer), a Hugging Face checkpoint directory (`config.json` +
weights + tokenizer files), or a bertjax model directory (`bertjax convert --from-hf` output).
"""

from __future__ import annotations

import argparse

from bertjax.commands.model_args import add_allow_pickle
from bertjax.inference.fill_mask import format_predictions, load_predictor

HELP = "predict the tokens hidden behind [MASK] with a pretrained masked language model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="a pretraining workdir, a bertjax model directory or a transformers checkpoint directory")
    parser.add_argument("--step", type=int, metavar="N",
                        help="with a pretraining workdir: the checkpoint to use (default: the latest)")
    parser.add_argument("--top-k", type=int, default=5, help="predictions shown per [MASK] (default 5)")
    add_allow_pickle(parser)
    parser.add_argument("texts", nargs="+", metavar="TEXT", help="sentences containing [MASK] (or <mask>, <|mask|>)")


def run(args: argparse.Namespace) -> int:
    if args.top_k <= 0:
        raise ValueError(f"--top-k must be positive, got {args.top_k}")
    predictor = load_predictor(args.model, step=args.step, allow_pickle=args.allow_pickle)
    # Every text in one packed pass through the inference layer (bertjax.inference), as `embed` runs.
    for text, predictions in zip(args.texts, predictor.many(args.texts, args.top_k)):
        print(format_predictions(text, predictions))
    return 0
