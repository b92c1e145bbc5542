"""`bertjax convert`: a transformers checkpoint directory <-> a bertjax model directory.

A bertjax model directory holds `model_config.json` ({"head": ..., "config": EncoderConfig fields}, the file a
pretraining workdir also starts with) and `params/`, an Orbax checkpoint of the parameter pytree, so it restores
straight onto a mesh.

    bertjax convert --from-hf hf_dir --out model_dir [--dtype bfloat16]
    bertjax convert --to-hf model_dir --out hf_dir
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil

HELP = "Convert a Hugging Face checkpoint directory to a bertjax model directory, or back."
MODEL_FILE = "model_config.json"
PARAMS_DIR = "params"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-hf", metavar="DIR", help="transformers checkpoint directory to read")
    source.add_argument("--to-hf", metavar="DIR", help="bertjax model directory to write as a transformers checkpoint")
    parser.add_argument("--out", metavar="DIR", required=True, help="directory to write")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="parameter dtype when reading a transformers checkpoint (default float32)")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="read a pytorch_model.bin (a pickle: only for files you trust); default: safetensors only")


def save_model_dir(path: str, model, params) -> None:
    import orbax.checkpoint as ocp

    from bertjax.hf.pretrained import head_of

    path = os.path.abspath(path)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, MODEL_FILE), "w") as f:
        json.dump({"head": head_of(model), "config": model.config.to_dict()}, f, indent=2)
        f.write("\n")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.join(path, PARAMS_DIR), params, force=True)
        checkpointer.wait_until_finished()


def load_model_dir(path: str):
    """(model, params) from a directory written by `save_model_dir`."""
    import orbax.checkpoint as ocp

    from bertjax.config import EncoderConfig
    from bertjax.hf.pretrained import expected_params
    from bertjax.models import MODEL_CLASSES
    from flax import traverse_util

    path = os.path.abspath(path)
    model_file = os.path.join(path, MODEL_FILE)
    if not os.path.isfile(model_file):
        raise FileNotFoundError(f"{path}: no {MODEL_FILE} (not a bertjax model directory)")
    with open(model_file) as f:
        description = json.load(f)
    head = description.get("head")
    if head not in MODEL_CLASSES:
        raise ValueError(f"{model_file}: head {head!r} is not one of {sorted(MODEL_CLASSES)}")
    model = MODEL_CLASSES[head](EncoderConfig.from_dict(description["config"]))
    abstract = traverse_util.unflatten_dict(expected_params(model))
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(os.path.join(path, PARAMS_DIR), abstract)
    return model, params


# Tokenizer files travel with the weights, so `bertjax fill-mask --model OUT` works on the converted directory.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "*.model")


def copy_tokenizer_files(source: str, destination: str) -> list[str]:
    copied = []
    for pattern in TOKENIZER_FILES:
        for path in sorted(glob.glob(os.path.join(glob.escape(source), pattern))):
            if os.path.isfile(path):
                shutil.copyfile(path, os.path.join(destination, os.path.basename(path)))
                copied.append(os.path.basename(path))
    return copied


def run(args: argparse.Namespace) -> int:
    from bertjax import hf
    from bertjax.commands.output_dir import check_output_dir

    source = args.from_hf or args.to_hf
    if args.from_hf:
        model, params = hf.from_pretrained(args.from_hf, dtype=args.dtype, allow_pickle=args.allow_pickle)
    else:
        model, params = load_model_dir(args.to_hf)
    check_output_dir(args.out, reading=[source], overwrite=args.overwrite)  # before writing anything
    write = save_model_dir if args.from_hf else hf.save_pretrained
    write(args.out, model, params)
    copy_tokenizer_files(source, args.out)
    print(f"wrote {args.out} ({type(model).__name__}, {model.config.num_layers} layers)")
    return 0
