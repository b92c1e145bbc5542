"""`bertjax glue --model MODEL --data-dir DIR --workdir DIR`: GLUE dev scores on local data in the GLUE layout.

See bertjax/finetune/glue.py for the protocol (grid of learning rates x weight decays x epochs per task, early
stopping, RTE/MRPC/STS-B from the best MNLI model) and the scores reported per task. Rerunning resumes: every grid
point is a `bertjax finetune` workdir under DIR/<task>/.
"""

from __future__ import annotations

import argparse
import math
import sys

from bertjax.commands.model_args import add_allow_pickle

HELP = "fine-tune on the GLUE tasks found in a directory (ModernBERT's grid and protocol) and print dev scores"


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _floats(text: str, *, positive: bool = False) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) for v in values) or any(v <= 0 if positive else v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected {'positive' if positive else 'non-negative'} numbers, got "
                                         f"{text!r}")
    return values


def _positive_floats(text: str) -> list[float]:
    """A learning rate of 0 trains nothing: refused with the command line, before any grid point trains."""
    return _floats(text, positive=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bertjax.finetune.glue import LARGE_EPOCHS, LEARNING_RATES, SMALL_EPOCHS, WEIGHT_DECAYS

    def listed(values) -> str:
        return ",".join(f"{v:g}" for v in values)

    parser.add_argument("--model", required=True, metavar="MODEL", help="any model directory bertjax reads")
    parser.add_argument("--data-dir", required=True, metavar="DIR", help="GLUE layout: DIR/MNLI/train.tsv, ...")
    parser.add_argument("--workdir", required=True, metavar="DIR", help="one fine-tuning workdir per task and setting")
    parser.add_argument("--tasks", default=None, help="comma-separated subset (default: every task found)")
    parser.add_argument("--learning-rates", type=_positive_floats, default=list(LEARNING_RATES), metavar="LR,LR,...",
                        help=f"learning-rate grid (default {listed(LEARNING_RATES)})")
    parser.add_argument("--weight-decays", type=_floats, default=list(WEIGHT_DECAYS), metavar="WD,WD,...",
                        help=f"decoupled weight-decay grid (default {listed(WEIGHT_DECAYS)}; each step shrinks the "
                             "weights by wd x lr_t / peak lr, as ModernBERT's fine-tuning)")
    parser.add_argument("--epochs", type=_ints, default=None, metavar="N,N,...",
                        help=f"epochs grid for every task (default: {listed(LARGE_EPOCHS)} for MNLI, QNLI, QQP, "
                             f"SST-2; {listed(SMALL_EPOCHS)} for CoLA, MRPC, RTE, STS-B)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="fine-tuning overrides for every run, e.g. train.batch_size=16 data.max_length=256")
    add_allow_pickle(parser)


def run(args: argparse.Namespace) -> int:
    from bertjax.finetune.glue import GlueStopped, format_table, run_glue

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    try:
        table = run_glue(args.model, args.data_dir, args.workdir, tasks=tasks, learning_rates=args.learning_rates,
                         weight_decays=args.weight_decays, epochs=args.epochs, overrides=args.overrides,
                         allow_pickle=args.allow_pickle)
    except GlueStopped as stopped:  # as pretrain and finetune after a preemption: saved, exit 0, rerun resumes
        print(f"bertjax glue: {stopped}", file=sys.stderr)
        if stopped.table:
            print("\nGLUE dev scores of the tasks finished (best over the grid):")
            print(format_table(stopped.table))
        return 0
    print("\nGLUE dev scores (best over the grid):")
    print(format_table(table))
    return 0
