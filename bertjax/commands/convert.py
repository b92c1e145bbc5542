"""`bertjax convert`: a transformers checkpoint directory <-> a bertjax model directory.

A bertjax model directory holds `model_config.json` ({"head": ..., "config": EncoderConfig fields}, the file a
pretraining workdir also starts with) and `params/`, an Orbax checkpoint of the parameter pytree, so it restores
straight onto a mesh. Both directions read their input with `bertjax.model_dirs.load_model_dir`, so `--to-hf`
also exports a pretraining workdir (its latest checkpoint, or `--step N`) with its tokenizer.

    bertjax convert --from-hf hf_dir --out model_dir [--dtype bfloat16]
    bertjax convert --to-hf model_dir_or_workdir --out hf_dir [--step N] [--head encoder]

The `--to-hf` output is a directory transformers loads as it is: config.json, the weights, and the tokenizer as
tokenizer.json + tokenizer_config.json + special_tokens_map.json (`AutoTokenizer`, `AutoModelForMaskedLM`,
`pipeline("fill-mask")`).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
from pathlib import Path

from bertjax.commands.model_args import add_allow_pickle

HELP = "convert a Hugging Face checkpoint directory to a bertjax model directory, or a model or run back"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-hf", metavar="DIR", help="transformers checkpoint directory to read")
    source.add_argument("--to-hf", metavar="DIR", help="bertjax model directory or pretraining workdir to write as a "
                        "transformers checkpoint")
    parser.add_argument("--out", metavar="DIR", required=True, help="directory to write")
    parser.add_argument("--head", metavar="HEAD", help="with --from-hf: the model to build (encoder, masked_lm, "
                        "sequence_classification, ...; default: the checkpoint's class, config.json architectures); "
                        "with --to-hf only `encoder`: write the bare encoder (its *Model class) without the head, as "
                        "a DeBERTa-v3 or ELECTRA discriminator is published")
    parser.add_argument("--step", type=int, metavar="N", help="with --to-hf on a pretraining workdir: the checkpoint "
                        "to export (default: the latest)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="parameter dtype of what is written: with --from-hf the model directory's (default "
                        "float32), with --to-hf the checkpoint's tensors (default: the model's own)")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    add_allow_pickle(parser)


# Tokenizer files travel with the weights, so `bertjax fill-mask --model OUT` works on the converted directory.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "*.model", "vocab.json", "merges.txt")


def _checkpoint_roots(source: str) -> list[str]:
    """Where a file of `source` may really live: the directory itself, and a Hugging Face cache snapshot's
    repository (models--org--name/snapshots/REV/, whose files link into the repository's blobs/). (Not an enclosing
    git checkout, whose links git-annex-like stores make: a home directory under git would let any file through.)"""
    roots = [os.path.realpath(source)]
    roots += [os.path.realpath(directory.parent) for directory in Path(os.path.abspath(source)).parents
              if directory.name == "snapshots"]
    return roots


def tokenizer_files(source: str) -> list[str]:
    """The tokenizer files of `source` that travel with the weights (TOKENIZER_FILES), refusing a symlink to a file
    outside the checkpoint: a downloaded directory could otherwise carry any file of the user's disk (a key) into
    the output the user then shares."""
    roots = _checkpoint_roots(source)
    found = []
    for pattern in TOKENIZER_FILES:
        for path in sorted(glob.glob(os.path.join(glob.escape(source), pattern))):
            if not os.path.isfile(path):
                continue
            target = os.path.realpath(path)
            if not any(os.path.commonpath([target, root]) == root for root in roots):
                raise ValueError(f"--from-hf {source}: {os.path.basename(path)} links to {target}, outside the "
                                 "checkpoint; copy the file in (or remove the link) and convert again")
            found.append(path)
    return found


def copy_tokenizer_files(files: list[str], destination: str) -> list[str]:
    for path in files:
        shutil.copyfile(path, os.path.join(destination, os.path.basename(path)))
    return [os.path.basename(path) for path in files]


def check_tokenizer(source: str):
    """Load the tokenizer among the files `copy_tokenizer_files` copies (the one `load_tokenizer` picks), so that a
    truncated or foreign file is an error naming it now; returns it. A directory without tokenizer files is fine
    (None), and so is a readable tokenizer bertjax's commands cannot use (special tokens it does not know): a
    warning, the files are copied as they are, for transformers (None)."""
    from bertjax.data import load_tokenizer
    from bertjax.data.tokenizers import InvalidTokenizerFile

    try:
        return load_tokenizer(source)
    except FileNotFoundError:
        return None
    except InvalidTokenizerFile as error:
        raise ValueError(f"--from-hf {source}: {error}. Its tokenizer files are copied with the weights; replace "
                         "the broken file (or remove the tokenizer files to convert the weights alone)") from None
    except ValueError as error:
        print(f"warning: --from-hf {source}: bertjax's commands cannot use its tokenizer ({error}); its files are "
              "copied as they are", file=sys.stderr)
        return None


def write_built_tokenizer_json(tokenizer, source: str, destination: str) -> None:
    """A checkpoint saved without tokenizer.json (a family's SentencePiece model) runs from the one transformers
    builds from its files (`HuggingFaceTokenizer.from_transformers_files`): written beside the copies, so that the
    converted directory reads the same without transformers or the source's config.json."""
    from bertjax.data.tokenizer_export import TOKENIZER_JSON

    built = tokenizer._files().get(TOKENIZER_JSON) if tokenizer is not None else None
    if built is not None and not os.path.isfile(os.path.join(source, TOKENIZER_JSON)):
        with open(os.path.join(destination, TOKENIZER_JSON), "wb") as file:
            file.write(built)


def cast_model(model, params, dtype: str, source: str):
    """The model with its parameters (and compute) in `dtype`; values beyond the dtype's range are an error."""
    import jax
    import jax.numpy as jnp

    from bertjax.train.checkpoints import check_finite

    cast = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    check_finite(cast, source, f"values beyond the range of {dtype}")
    return model.clone(config=model.config.replace(dtype=dtype, param_dtype=dtype)), cast


def bare_encoder(model, params, source: str):
    """The backbone of any bertjax model (embeddings, layers, and the pooler where the family has one) with its
    parameters: the head's are left out. BERT's and ALBERT's classification and multiple-choice heads keep the
    pooler as their dense layer (`classifier/dense`, written as `bert.pooler.dense`): it is the encoder's pooler."""
    from bertjax.hf.pretrained import head_of
    from bertjax.hf.registry import FAMILIES
    from bertjax.models import MODEL_CLASSES

    head = head_of(model)
    kept = {name: params[name] for name in ("embeddings", "encoder", "pooler") if name in params}
    if model.config.pooler and "pooler" not in kept:
        family = FAMILIES.get(model.config.family)
        keys = family.task_heads.keys.get(head) if family is not None and family.task_heads else None
        if keys is not None and keys.dense and keys.dense.removesuffix(".dense").endswith("pooler"):
            kept["pooler"] = {"dense": params["classifier"]["dense"]}
        else:
            # transformers' BertModel (...) has a pooler, which an MLM head does not train: it loads the head's own
            # export and draws the pooler fresh, as from any *ForMaskedLM checkpoint.
            raise ValueError(f"--to-hf {source} --head encoder: the {head} model has no trained pooler, which the "
                             f"{model.config.family} encoder has; export it with its head (no --head): transformers' "
                             f"{model.config.family} *Model class loads that, with a fresh pooler")
    return MODEL_CLASSES["encoder"](model.config.replace(task=None)), kept


def run(args: argparse.Namespace) -> int:
    from bertjax import hf
    from bertjax.output_paths import check_output_dir
    from bertjax.data.tokenizer_export import save_for_model
    from bertjax.inference.texts import check_tokenizer_fits
    from bertjax.model_dirs import load_model_dir, read_token_ids, save_model_dir

    source = args.from_hf or args.to_hf
    if args.from_hf:
        if args.step is not None:
            raise ValueError("--step applies to --to-hf (a pretraining workdir's checkpoint)")
        # from_pretrained refuses NaN/inf weights (or values beyond --dtype's range) before anything is written
        model, params = hf.from_pretrained(args.from_hf, dtype=args.dtype or "float32", head=args.head,
                                           allow_pickle=args.allow_pickle)
        token_ids = hf.special_token_ids(args.from_hf)
        # the files copied below: a broken one would surface only at the next use
        tokenizer = check_tokenizer(args.from_hf)
        if tokenizer is not None:  # a pair that could not run is not passed on (remove the files: weights alone)
            check_tokenizer_fits(tokenizer, model.config, f"--from-hf {source}")
        copied = tokenizer_files(args.from_hf)
        check_output_dir(args.out, reading=[source], overwrite=args.overwrite)  # before writing anything
        save_model_dir(args.out, model, params, token_ids=token_ids)
        copy_tokenizer_files(copied, args.out)
        write_built_tokenizer_json(tokenizer, args.from_hf, args.out)
    else:
        if args.head not in (None, "encoder"):
            raise ValueError(f"--head {args.head} with --to-hf: a model is exported with its own head, or as the bare "
                             "encoder with --head encoder")
        model, params, tokenizer = load_model_dir(args.to_hf, step=args.step, allow_pickle=args.allow_pickle)
        if args.head == "encoder":
            model, params = bare_encoder(model, params, args.to_hf)
        if tokenizer is not None:
            check_tokenizer_fits(tokenizer, model.config, f"--to-hf {source}")
        if args.dtype is not None:  # a bfloat16 export of float32 master weights, as checkpoints are published
            model, params = cast_model(model, params, args.dtype, f"--to-hf {args.to_hf}")
        check_output_dir(args.out, reading=[source], overwrite=args.overwrite)  # before writing anything
        hf.save_pretrained(args.out, model, params, token_ids=read_token_ids(args.to_hf))
        if tokenizer is not None:
            save_for_model(tokenizer, args.out, model.config)
    print(f"wrote {args.out} ({type(model).__name__}, {model.config.num_layers} layers)")
    return 0
