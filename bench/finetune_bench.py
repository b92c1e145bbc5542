"""CPU fine-tuning throughput of bertjax (padded rows, packed rows) vs transformers, same run.

    JAX_PLATFORMS=cpu python -m bench.finetune_bench [--epochs 8] [--hidden 128] [--layers 2] [--torch-threads 1]
        [--finetune-seeds 0,1,2]

Everything both sides see is the same: one transformers directory (a random-init BERT written by
`bertjax.save_pretrained`, with a WordPiece tokenizer trained on the training texts and exported by
`save_for_transformers`) loaded by `bertjax finetune` and by `AutoModelForSequenceClassification`; the real
labelled texts of the offline demo (bertjax.finetune.demo_data: standard-library docstrings labelled with their
package); AdamW with the same peak learning rate, weight decay, linear warmup ratio and decay, gradient clipping,
dropout (0.1 on hidden states, none on attention probabilities: bertjax has none), batch, epochs and max_length. transformers pads each batch to its longest example
(DataCollatorWithPadding, as run_glue does without --pad_to_max_length); bertjax pads every row to max_length,
or packs several examples per row. A packed step holds more examples than a padded one, so the packed run uses
`train.batch_size = batch / mean examples per row` rows: the same number of examples per update on average.

Examples/s counts training examples over the time of the training steps (evaluation left out on both sides;
bertjax leaves out its first step, which compiles, and that compile time is printed). Accuracy is on the
validation file after the last epoch. On a machine shared with other jobs, wall-clock time also counts their
work, and the load changes from one run to the next: so each side also reports examples per second of its own
process CPU time (all its threads), and transformers runs first and again last, the ratios taken against the mean
of its two runs. Fine-tuning a small model on 212 validation examples is noisy (one example is 0.5% accuracy), so
`--finetune-seeds` repeats the transformers and packed runs with other fine-tuning seeds (head initialisation,
shuffling, dropout; the starting weights stay the same) and reports the accuracies of every seed and their mean;
the padded run, the slowest, runs with the first seed only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np


def build_model_dir(directory: Path, train_texts: list[str], args) -> None:
    """A random-init BERT + WordPiece tokenizer as a transformers directory (the shared starting point)."""
    import jax
    from tokenizers import BertWordPieceTokenizer

    import bertjax
    from bertjax.data.tokenizer_export import save_for_transformers
    from bertjax.data.tokenizers import WordPieceTokenizer

    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(train_texts, vocab_size=args.vocab_size, min_frequency=2,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    vocab = sorted(trainer.get_vocab().items(), key=lambda item: item[1])
    tokenizer = WordPieceTokenizer("\n".join(token for token, _ in vocab) + "\n", lowercase=True)
    config = bertjax.get_config("bert-base", vocab_size=tokenizer.vocab_size, hidden_size=args.hidden,
                                num_layers=args.layers, num_heads=max(1, args.hidden // 64),
                                intermediate_size=4 * args.hidden, pad_token_id=tokenizer.pad_id)
    model = bertjax.EncoderModel(config)
    bertjax.save_pretrained(str(directory), model, bertjax.init_params(model, jax.random.key(args.seed)))
    save_for_transformers(tokenizer, directory, model_max_length=config.max_position_embeddings,
                          model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run_transformers(model_dir: Path, train: list[dict], validation: list[dict], args, seed: int) -> dict:
    """The loop of transformers' run_glue_no_trainer without accelerate (not installed here): AdamW with weight
    decay off for biases and LayerNorm weights, get_linear_schedule_with_warmup, clipping at 1.0, shuffled
    batches padded to their longest example by DataCollatorWithPadding."""
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding,
                              get_linear_schedule_with_warmup)

    torch.manual_seed(seed)
    torch.set_num_threads(args.torch_threads)
    names = sorted({row["label"] for row in train})
    label_id = {name: i for i, name in enumerate(names)}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # bertjax applies no dropout to attention probabilities (as ModernBERT's default attention_dropout=0), so
    # transformers runs without it as well: the same computation, the same regularisation.
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=len(names), id2label=dict(enumerate(names)), label2id=label_id,
        attention_probs_dropout_prob=0.0)
    collate = DataCollatorWithPadding(tokenizer, return_tensors="pt")

    def encode(rows):
        encoded = tokenizer([r["text"] for r in rows], truncation=True, max_length=args.max_length)
        return [{**{key: values[i] for key, values in encoded.items()}, "labels": label_id[r["label"]]}
                for i, r in enumerate(rows)]

    train_set, validation_set = encode(train), encode(validation)
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=True, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(seed))
    no_decay = ("bias", "LayerNorm.weight")
    groups = [{"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
               "weight_decay": args.weight_decay},
              {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-8)
    total = len(loader) * args.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(args.warmup_ratio * total), total)
    model.train()
    seconds, cpu_seconds, examples = 0.0, 0.0, 0
    for _ in range(args.epochs):
        for batch in loader:
            began, began_cpu = time.perf_counter(), time.process_time()
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            seconds += time.perf_counter() - began
            cpu_seconds += time.process_time() - began_cpu
            examples += len(batch["labels"])
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(validation_set), 64):
            batch = collate(validation_set[start:start + 64])
            correct += int((model(**batch).logits.argmax(-1) == batch["labels"]).sum())
    return {"examples_per_second": examples / seconds, "examples_per_cpu_second": examples / cpu_seconds,
            "accuracy": correct / len(validation_set), "seconds": seconds, "threads": torch.get_num_threads()}


def run_bertjax(model_dir: Path, data_dir: Path, args, out: Path, packing: bool, seed: int) -> dict:
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import task_class
    from bertjax.finetune.trainer import finetune

    task = task_class("sequence-classification")
    settings = [f"train.epochs={args.epochs}", f"train.learning_rate={args.learning_rate}",
                f"train.weight_decay={args.weight_decay}", f"train.warmup_ratio={args.warmup_ratio}",
                f"train.seed={seed}", f"data.max_length={args.max_length}", "train.progress_bar=false",
                f"checkpoint.every={10 ** 6}", "eval.every=0", f"train.batch_size={args.batch_size}"]
    per_row = 1.0
    if packing:
        packed = load_finetune_config(None, settings + ["data.packing=true"], task.defaults)
        probe = task(packed.data, packed.task)
        per_row = mean_examples_per_row(probe, model_dir, data_dir / "train.jsonl")
        settings[-1] = f"train.batch_size={max(1, round(args.batch_size / per_row))}"
        settings.append("data.packing=true")
    config = load_finetune_config(None, settings, task.defaults)
    started = time.perf_counter()
    result = finetune(model_dir, task, data_dir / "train.jsonl", data_dir / "validation.jsonl", out, config,
                      say=lambda text: None)
    results = result.results
    return {"examples_per_second": results["train_examples_per_second"],
            "examples_per_cpu_second": results["train_examples_per_cpu_second"],
            "accuracy": results["final_metrics"]["accuracy"],
            "compile_seconds": results["first_step_seconds"], "seconds": time.perf_counter() - started,
            "rows_per_step": config.train.batch_size, "examples_per_row": per_row}


def mean_examples_per_row(task, model_dir: Path, train_file: Path) -> float:
    from bertjax.finetune.readers import read_rows
    from bertjax.model_dirs import load_model_dir

    _, _, tokenizer = load_model_dir(model_dir)
    rows = read_rows(train_file)
    labels = task.fit_labels(rows, str(train_file), None)
    encoded = task.encode(tokenizer, rows, labels, str(train_file), with_targets=True, training=True)
    return len(rows) / encoded.rows


def summarise(group: list[dict]) -> dict:
    """One row of the table from the runs of several seeds: mean rates and accuracy, every seed's accuracy."""
    row = dict(group[0])
    for key in ("examples_per_second", "examples_per_cpu_second", "accuracy"):
        row[key] = float(np.mean([run[key] for run in group]))
    row["accuracies"] = [run["accuracy"] for run in group]
    row["accuracy_note"] = (" (mean of " + ", ".join(f"{a:.4f}" for a in row["accuracies"]) + ")"
                            if len(group) > 1 else "")
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0, help="initialisation of the shared starting weights")
    parser.add_argument("--finetune-seeds", default="0",
                        help="comma-separated fine-tuning seeds of the transformers and packed runs (default 0)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="PyTorch intra-op threads (1: on a busy 2-core machine two threads spin-wait on each "
                             "other and run several times slower)")
    parser.add_argument("--workdir", default=None,
                        help="keep the model, data and runs here (a temporary directory otherwise)")
    args = parser.parse_args(argv)

    import jax
    import torch
    import transformers

    from bertjax.finetune.demo_data import write_dataset

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.workdir or tmp)
        data_dir, model_dir = root / "data", root / "model"
        counts = write_dataset(data_dir)
        train, validation = read_jsonl(data_dir / "train.jsonl"), read_jsonl(data_dir / "validation.jsonl")
        build_model_dir(model_dir, [row["text"] for row in train], args)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
              f"jax {jax.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
        print(f"data: {counts['train']} train / {counts['validation']} validation docstrings, "
              f"{len({r['label'] for r in train})} labels; model: BERT hidden {args.hidden}, {args.layers} layers, "
              f"random init; AdamW lr {args.learning_rate:g}, wd {args.weight_decay:g}, warmup {args.warmup_ratio:g}, "
              f"batch {args.batch_size}, {args.epochs} epochs, max_length {args.max_length}")
        seeds = [int(seed) for seed in args.finetune_seeds.split(",")]
        first, *others = seeds
        runs = {"transformers (dynamic padding), first": [run_transformers(model_dir, train, validation, args, first)],
                "bertjax packed": [run_bertjax(model_dir, data_dir, args, root / "packed", True, first)],
                "bertjax padded": [run_bertjax(model_dir, data_dir, args, root / "padded", False, first)]}
        for seed in others:
            runs["transformers (dynamic padding), first"].append(
                run_transformers(model_dir, train, validation, args, seed))
            runs["bertjax packed"].append(run_bertjax(model_dir, data_dir, args, root / f"packed-{seed}", True, seed))
        runs["transformers (dynamic padding), last"] = [run_transformers(model_dir, train, validation, args, first)]
    rows = {name: summarise(group) for name, group in runs.items()}
    references = [row for name, row in rows.items() if name.startswith("transformers")]
    reference = {key: float(np.mean([row[key] for row in references]))
                 for key in ("examples_per_second", "examples_per_cpu_second")}
    print("\n| run | examples/s | vs transformers | examples/CPU-s | vs transformers | validation accuracy | notes |"
          "\n|---|---:|---:|---:|---:|---:|---|")
    for name, row in rows.items():
        notes = (f"{row['threads']} torch threads" if "threads" in row else
                 f"{row['rows_per_step']} rows/step, {row['examples_per_row']:.2f} examples/row, "
                 f"first step (compile) {row['compile_seconds']:.1f} s")
        print(f"| {name} | {row['examples_per_second']:.1f} | "
              f"{row['examples_per_second'] / reference['examples_per_second']:.2f}x | "
              f"{row['examples_per_cpu_second']:.1f} | "
              f"{row['examples_per_cpu_second'] / reference['examples_per_cpu_second']:.2f}x | "
              f"{row['accuracy']:.4f}{row['accuracy_note']} | {notes} |")
    print(json.dumps(rows, indent=1, default=float))


if __name__ == "__main__":
    main()
