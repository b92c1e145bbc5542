"""Arguments shared by the commands that read a model directory."""

from __future__ import annotations

import argparse


def add_allow_pickle(parser: argparse.ArgumentParser) -> None:
    """`--allow-pickle`: the one way any command reads a transformers directory that has only a pytorch_model.bin
    (a pickle, which can run code when loaded); safetensors otherwise."""
    parser.add_argument("--allow-pickle", action="store_true",
                        help="read a Hugging Face pytorch_model.bin (a pickle: only for files you trust); default: "
                             "safetensors only")
