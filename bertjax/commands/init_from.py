"""`bertjax init-from --source DIR --config PATH --out DIR [key=value ...]`: grow a trained model into the larger
one a run config trains, as ModernBERT-large was initialised from ModernBERT-base (Warner et al., 2024).

Every weight of the larger model is the source's centre-tiled up to the new shape, and each layer of the deeper
model starts from the source layer at the same relative depth (bertjax.train.init_from.grow_params). The result is
a bertjax model directory (with the source's tokenizer); a run starts from it with `model.init_from`:

    bertjax init-from --source runs/modernbert-base --config configs/pretrain/modernbert-large.yaml --out runs/large-init
    bertjax pretrain --config configs/pretrain/modernbert-large.yaml --workdir runs/large \\
        model.init_from=runs/large-init tokenizer.path=runs/large-init/tokenizer
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from bertjax.commands.model_args import add_allow_pickle

HELP = "build a larger model from a trained smaller one (centre tiling, layer map) to start a run from"

INIT_FROM_FILE = "init_from.json"  # in the output directory: the source and the layer map used


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", required=True, metavar="DIR",
                        help="the trained model: a pretraining workdir, a bertjax or a transformers model directory")
    parser.add_argument("--config", required=True, metavar="PATH",
                        help="the YAML run config of the larger model, a file or a shipped name "
                             "(configs/pretrain/modernbert-large.yaml)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="where the grown model directory goes: a new or empty directory, not --source")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --out (files of the same names are replaced)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="run config overrides on dotted keys, e.g. model.overrides.num_layers=4")
    add_allow_pickle(parser)


def run(args: argparse.Namespace) -> int:
    import jax

    from bertjax.output_paths import check_output_dir
    from bertjax.hf.pretrained import head_of
    from bertjax.model_dirs import load_model_dir, save_model_dir
    from bertjax.models import MODEL_CLASSES, abstract_params
    from bertjax.train.init_from import grow_params
    from bertjax.train.run_config import load_run_config
    from bertjax.train.setup import build_model_config

    # Before reading anything: writing into the source (a workdir) would replace its model_config.json.
    check_output_dir(args.out, reading=[args.source], overwrite=args.overwrite)
    config = load_run_config(args.config, args.overrides)
    source_model, source_params, tokenizer = load_model_dir(args.source, allow_pickle=args.allow_pickle)
    source_config = source_model.config
    seq_len = max([config.data.seq_len] + [int(p.data.get("seq_len", 0)) for p in config.train.phases])
    # The vocabulary is the source's (its tokenizer), as in the run that follows.
    target_config = build_model_config(config, vocab_size=source_config.vocab_size,
                                       pad_id=source_config.pad_token_id, max_seq_len=seq_len)
    if target_config.vocab_size != source_config.vocab_size:
        raise ValueError(f"model.overrides.vocab_size ({target_config.vocab_size}) differs from the source model's "
                         f"({source_config.vocab_size}): the grown model keeps the source's vocabulary")
    if target_config.family != source_config.family:
        raise ValueError(f"model.preset {config.model.preset!r} is of the {target_config.family} family but the "
                         f"source is of the {source_config.family} family")
    head = head_of(source_model)
    target = MODEL_CLASSES[head](target_config)
    params, mapping = grow_params(jax.device_get(source_params), abstract_params(target),
                                  position_offset=target_config.position_offset)
    out = Path(args.out)
    save_model_dir(out, target, params, tokenizer)
    (out / INIT_FROM_FILE).write_text(json.dumps({
        "source": str(Path(args.source).absolute()), "rule": "centre tiling", "layer_map": mapping}) + "\n")

    def size(c):
        return f"{c.num_layers} layers, hidden {c.hidden_size}, {c.num_heads} heads, mlp {c.intermediate_size}"

    print(f"{args.source} ({size(source_config)}) -> {out} ({size(target_config)})")
    print(f"layer map (target layer <- source layer): {', '.join(f'{i}<-{j}' for i, j in enumerate(mapping))}")
    if source_config.position_embedding == "rope" and target_config.head_dim != source_config.head_dim:
        # Rotary positions rotate dimensions j and j + head_dim/2 together at a frequency set by j / head_dim:
        # tiling the head dimension pairs components that were never rotated together, at other frequencies.
        print(f"note: head_dim grows {source_config.head_dim} -> {target_config.head_dim} in a rotary-position "
              "model, so the grown query/key heads lose the source's rotary pairs and frequencies; grow num_heads "
              "at the same head_dim to keep them (ModernBERT-large keeps base's 64)")
    # The overrides given here too: without them the run would build the config's own model and grow this one again.
    settings = [*args.overrides, f"model.init_from={out}"]
    if tokenizer is not None:
        settings.append(f"tokenizer.path={out / 'tokenizer'}")
    else:  # the run would train a tokenizer of its own, whose vocabulary the grown embedding does not fit
        print(f"note: {args.source} holds no tokenizer; add tokenizer.path=<the tokenizer the source model was "
              "trained with> to the command below")
    print(f"start the run from it: bertjax pretrain --config {shlex.quote(str(args.config))} --workdir DIR "
          f"{' '.join(shlex.quote(setting) for setting in settings)}")
    return 0
