"""`bertjax train-embedder --model MODEL --train PAIRS --workdir DIR [--validation PAIRS] [--config YAML] [key=value]`.

Contrastive fine-tuning of an embedding model on (anchor, positive[, negatives]) rows with in-batch negatives
(MultipleNegativesRankingLoss; `loss.symmetric=true` for both directions), negatives gathered across every device
of the mesh, and cached large batches with `train.mini_batch_size` (GradCache). MODEL is a sentence-transformers
directory, a transformers checkpoint (mean pooling) or any bertjax model directory / pretraining workdir, with its
tokenizer. The run config starts from sentence-transformers' defaults (configs/embedder/contrastive.yaml spells
them out), then `--config FILE`, then the overrides. The workdir holds config.yaml, metrics.jsonl (the loss, and
recall@k / MRR@k on the validation pairs), TensorBoard events, loss.png, orbax checkpoints (rerunning the same
command resumes) and, at the end, model/: a sentence-transformers directory that `SentenceTransformer(...)`,
`bertjax.embeddings.load_sentence_encoder` and `bertjax embed` read. On several hosts, start the same command on
each with `--coordinator HOST:PORT --num-processes N --process-id I`, as `bertjax pretrain`.
"""

from __future__ import annotations

import argparse

from bertjax.commands.model_args import add_allow_pickle

HELP = "fine-tune an embedding model on (anchor, positive[, negative]) pairs with in-batch negatives"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bertjax.finetune.readers import DATA_FILES
    from bertjax.train import distributed

    parser.add_argument("--model", required=True, metavar="MODEL",
                        help="a sentence-transformers, transformers or bertjax model directory, or a pretraining "
                             "workdir")
    parser.add_argument("--train", required=True, metavar="FILE",
                        help=f"pairs ({DATA_FILES}) with columns anchor, positive and optional negative "
                             "(or negative_1 ... negative_n)")
    parser.add_argument("--validation", default=None, metavar="FILE",
                        help="held-out pairs, same columns: recall@k and MRR@k before, during and after training")
    parser.add_argument("--workdir", required=True, metavar="DIR",
                        help="checkpoints, metrics.jsonl, TensorBoard events, loss.png and model/ at the end")
    parser.add_argument("--config", metavar="PATH", default=None,
                        help="a YAML run config file or the name of one shipped with bertjax (configs/embedder/: "
                             "contrastive, tiny-docstrings); the defaults otherwise")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. train.batch_size=512 train.mini_batch_size=32 loss.symmetric=true")
    distributed.add_arguments(parser)
    add_allow_pickle(parser)


def run(args: argparse.Namespace) -> int:
    from bertjax.train import distributed

    # Before anything touches a JAX backend: the processes must connect first.
    distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    import jax

    from bertjax.embeddings.train_config import load_embedder_config
    from bertjax.embeddings.training import train_embedder
    from bertjax.train.session_outputs import final_report

    config = load_embedder_config(args.config, args.overrides)
    result = train_embedder(config, args.workdir, args.model, args.train, args.validation, config_path=args.config,
                            allow_pickle=args.allow_pickle)
    if jax.process_index() != 0:
        return 0
    with final_report():  # a reader gone by now takes the summary, not the run's status
        print(f"\nworkdir {result.workdir}: steps {result.start_step} -> {result.final_step} of {result.total_steps} "
              f"in {result.seconds:.0f} s")
        if result.eval_start or result.eval_end:
            names = sorted(set(result.eval_start or {}) | set(result.eval_end or {}))
            for name in names:
                before = (result.eval_start or {}).get(name)
                after = (result.eval_end or {}).get(name)
                shown = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
                when = "after" if result.eval_end_step in (None, result.final_step) else \
                    f"at step {result.eval_end_step} (the latest evaluation)"
                print(f"{name.removeprefix('eval_')} on the validation pairs: {shown(before)} before, "
                      f"{shown(after)} {when}")
        if result.model_dir is not None:
            print(f"sentence-transformers model in {result.model_dir}")
        elif result.preempted:
            print("stopped before the end: rerun the same command to resume")
    return 0
