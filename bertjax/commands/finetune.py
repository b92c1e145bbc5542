"""`bertjax finetune --model MODEL --task TASK --train FILE --validation FILE --workdir DIR [key=value ...]`.

MODEL is any model directory bertjax reads (a transformers checkpoint, a `bertjax convert` directory, a pretraining
workdir) with its tokenizer. The run config starts from the task's defaults (BERT's fine-tuning settings; the same
values as configs/finetune/<task>.yaml), then `--config FILE`, then the overrides. Rerunning the same command in
the same workdir resumes. On several hosts, start the same command on each with `--coordinator HOST:PORT
--num-processes N --process-id I` (or nothing on a TPU pod slice), as `bertjax pretrain`: the mesh spans every
host's devices, each host feeds its rows of every batch, and process 0 writes the workdir's files.
"""

from __future__ import annotations

import argparse

from bertjax.commands.model_args import add_allow_pickle

HELP = "fine-tune a model on a classification, tagging, question-answering or multiple-choice data file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bertjax.finetune.readers import DATA_FILES
    from bertjax.finetune.tasks import TASKS
    from bertjax.train import distributed

    parser.add_argument("--model", required=True, metavar="MODEL",
                        help="a transformers directory, a bertjax model directory or a pretraining workdir")
    parser.add_argument("--task", required=True, choices=list(TASKS), metavar="TASK",
                        help=f"one of: {', '.join(TASKS)}")
    parser.add_argument("--train", required=True, metavar="FILE", help=f"training data ({DATA_FILES})")
    parser.add_argument("--validation", required=True, metavar="FILE", help="validation data, same columns")
    parser.add_argument("--workdir", required=True, metavar="DIR",
                        help="checkpoints, metrics.jsonl, results.json, best/, TensorBoard events, finetune.png")
    parser.add_argument("--config", metavar="PATH", default=None,
                        help="a YAML run config file or the name of one shipped with bertjax (configs/finetune/); the "
                             "task's defaults otherwise")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. train.epochs=5 data.text_column=sentence")
    distributed.add_arguments(parser)
    add_allow_pickle(parser)


def run(args: argparse.Namespace) -> int:
    from bertjax.train import distributed

    # Before anything touches a JAX backend: the processes must connect first.
    distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    import jax

    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import task_class
    from bertjax.finetune.tasks.base import chosen_keys
    from bertjax.train.run_config import read_config_file
    from bertjax.finetune.trainer import BEST_DIR, finetune
    from bertjax.train.session_outputs import final_report

    task = task_class(args.task)
    config = load_finetune_config(args.config, args.overrides, task.defaults)
    chosen = chosen_keys(args.overrides, read_config_file(args.config, empty_ok=True, kind="finetune")
                          if args.config else None)
    result = finetune(args.model, task, args.train, args.validation, args.workdir, config, chosen=chosen,
                      config_path=args.config, allow_pickle=args.allow_pickle)
    if jax.process_index() != 0:
        return 0
    with final_report():  # a reader gone by now takes the summary, not the run's status
        results = result.results
        print(f"\nworkdir {result.workdir}: steps {result.start_step} -> {result.final_step} in {result.seconds:.0f} s")
        if results["best"] is not None:
            print(f"best validation {results['main_metric']}: {results['best']:.4f} at step {results['best_step']} "
                  f"(epoch {results['best_epoch']:g}); model in {result.workdir / BEST_DIR}")
    return 0
