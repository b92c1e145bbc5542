"""`bertjax pretrain --config PATH --workdir DIR [key=value ...]`: masked-language-model pretraining.

Rerunning the same command in the same workdir resumes from its latest checkpoint. On several hosts, start the
same command on each with `--coordinator HOST:PORT --num-processes N --process-id I` (or on a TPU pod slice with
nothing: the slice is detected). See launch/ for ready-made scripts.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

HELP = ("pretrain an encoder from a YAML run config (objective.name: MLM, MLM+NSP/SOP, ELECTRA, distillation, "
        "permutation LM); resumes in the same workdir")

FILL_MASK_SEED = 0  # which word of each held-out sentence gets masked in the end-of-run demonstration


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bertjax.train import distributed

    parser.add_argument("--config", required=True, metavar="PATH",
                        help="a YAML run config file, or the name of one shipped with bertjax (configs/pretrain/: "
                        "tiny, modernbert-base, ...)")
    parser.add_argument("--workdir", required=True, metavar="DIR",
                        help="where checkpoints, metrics, the tokenizer and loss.png go")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides on dotted keys, e.g. train.steps=100 eval.every=50")
    distributed.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from bertjax.train import distributed

    # Before anything touches a JAX backend: the processes must connect first.
    distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    from bertjax.train.loop import pretrain
    from bertjax.train.run_config import load_run_config
    from bertjax.train.session_outputs import final_report

    config = load_run_config(args.config, args.overrides)
    # config_path: the workdir checks name --config when it is the workdir's config.yaml, which the run would replace
    result = pretrain(config, args.workdir, config_path=args.config)

    import jax
    if jax.process_index() != 0:
        return 0
    with final_report():  # a reader gone by now takes the summary, not the run's status
        print("\n" + "\n".join(summary(result, config.objective.name)))
        if not result.preempted and config.eval.fill_mask_examples and jax.process_count() == 1:
            try:
                show_fill_mask(config, result)
            except (ValueError, FileNotFoundError) as error:  # a demonstration: the run itself succeeded
                print(f"\nskipped the fill-mask examples: {error}", file=sys.stderr)
    return 0


def summary(result, objective: str = "mlm") -> list[str]:
    """The lines printed after a run: its steps and time, and the held-out loss at the start and at the end, or at
    the step of the latest evaluation when the run stopped before the end (or did not evaluate there). Another
    objective's loss is its whole (distillation's weighted sum, ELECTRA's generator MLM + 50 x detection), named
    so; metrics.jsonl holds its parts."""
    lines = [f"workdir {result.workdir}: steps {result.start_step} -> {result.final_step} in {result.seconds:.0f} s"
             f"{' (stopped by SIGTERM or Ctrl-C; rerun to resume)' if result.preempted else ''}"]
    name = "MLM loss" if objective == "mlm" else f"{objective} loss (its total; parts in metrics.jsonl)"
    if result.eval_loss_start is not None:
        lines.append(f"held-out {name} at the start: {result.eval_loss_start:.4f}")
    if result.eval_loss_end is not None:
        if result.eval_loss_end_step == result.final_step and not result.preempted:
            lines.append(f"held-out {name} at the end:   {result.eval_loss_end:.4f}")
        else:
            lines.append(f"latest held-out {name} (step {result.eval_loss_end_step}): {result.eval_loss_end:.4f}")
    return lines


def show_fill_mask(config, result) -> None:
    """Fill-mask predictions of the trained model on a few held-out sentences, one word masked in each."""
    from bertjax.inference.fill_mask import format_predictions, make_predictor
    from bertjax.train import feed as feed_lib

    data = feed_lib.plan_phases(config)[-1].data
    sentences = feed_lib.held_out_sentences(data, result.tokenizer, config.eval.fill_mask_examples)
    if not sentences:
        return
    predictor = make_predictor(result.model, result.params, result.tokenizer,
                               query_stream=config.objective.name == "permutation_lm")
    rng = np.random.default_rng(FILL_MASK_SEED)
    print("\nfill-mask on held-out sentences (the masked word in brackets is the model's best guess):")
    for sentence in sentences:
        masked = feed_lib.mask_a_word(sentence, result.tokenizer, rng)
        print(f"original: {sentence}")
        print(format_predictions(masked, predictor(masked, 5)))
