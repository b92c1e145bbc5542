"""`bertjax predict --model DIR --input FILE --output FILE.jsonl`: predictions of a fine-tuned model, one JSON
line per input example, in input order (records: bertjax.finetune.prediction). The file is standard JSON: a NaN
or infinity is an error. An --output that is the --input file (under any name: a link too) or a directory is
refused before the model loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bertjax.commands.model_args import add_allow_pickle
from bertjax.jsonl import write_json_objects

HELP = "predict with a fine-tuned model: labels with scores, word-aligned tags, answer spans as text"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bertjax.finetune.readers import DATA_FILES

    parser.add_argument("--model", required=True, metavar="DIR", help="a fine-tuned model (the best/ of a workdir)")
    parser.add_argument("--input", required=True, metavar="FILE", help=f"examples ({DATA_FILES})")
    parser.add_argument("--output", required=True, metavar="FILE.jsonl", help="where the predictions go")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="token budget of one packed batch (default 2048 on CPU, 16384 on GPU/TPU)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="multiple choice (not packed): questions per forward pass (default 64)")
    add_allow_pickle(parser)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="data settings, e.g. data.text_column=sentence data.max_length=256")


def run(args: argparse.Namespace) -> int:
    from bertjax.output_paths import check_output_file

    output = Path(args.output)
    check_output_file(output, args.input, what="the predictions")  # before any work: never replace the input
    if output.exists() and not args.overwrite:
        raise ValueError(f"--output {output} exists; pass --overwrite to replace it, or choose another name")
    from bertjax.finetune.prediction import predict

    records = predict(args.model, args.input, args.overrides, batch_size=args.batch_size, max_tokens=args.max_tokens,
                      allow_pickle=args.allow_pickle)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json_objects(output, records, allow_nan=False)  # standard JSON: other programs read it
    print(f"{len(records)} predictions -> {output}")
    return 0
