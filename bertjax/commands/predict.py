"""`bertjax predict --model DIR --input FILE --output FILE.jsonl`: predictions of a fine-tuned model, one JSON
line per input example, in input order.

DIR is the `best/` directory of `bertjax finetune` (its finetune.json gives the task, the labels and the data
settings) or any transformers directory of a task model (the task comes from its class, labels from id2label).
Records: sequence classification `{"label", "score", "scores"}` (regression `{"score"}`), token classification
`{"tokens", "tags", "scores"}` (one tag per input word), question answering `{"id", "answer", "start", "end",
"score"}` (the answer as text of the context; "" for no answer), multiple choice `{"label", "scores"}`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "predict with a fine-tuned model: labels with scores, word-aligned tags, answer spans as text"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="a fine-tuned model (the best/ of a workdir)")
    parser.add_argument("--input", required=True, metavar="FILE", help="examples (.csv, .tsv, .jsonl, .parquet)")
    parser.add_argument("--output", required=True, metavar="FILE.jsonl", help="where the predictions go")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per forward pass (default 64)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="data settings, e.g. data.text_column=sentence data.max_length=256")


def run(args: argparse.Namespace) -> int:
    records = predict(args.model, args.input, args.overrides, batch_size=args.batch_size)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    print(f"{len(records)} predictions -> {output}")
    return 0


def load_task(model_dir: str | Path, model, overrides: list[str]):
    """(task, labels) of a fine-tuned model: from its finetune.json when present, else from its class."""
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import Labels, task_class, task_for_head
    from bertjax.finetune.trainer import RUN_FILE, read_run_file
    from bertjax.hf.pretrained import head_of

    if (Path(model_dir) / RUN_FILE).is_file():
        described = read_run_file(model_dir)
        cls = task_class(described["task"])
        labels = Labels(names=tuple(described["labels"]), regression=described["regression"],
                        unanswerable=described["unanswerable"])
        defaults = {"data": described["data"]}
    else:
        cls = task_for_head(head_of(model))
        task = model.config.task_or_default
        regression = task.problem_type == "regression"
        labels = Labels(names=() if regression or cls.head in ("question_answering", "multiple_choice")
                        else task.label_names, regression=regression)
        defaults = cls.defaults
    config = load_finetune_config(None, overrides, defaults)
    return cls(config.data, config.task), labels


def predict(model_dir: str | Path, input_file: str | Path, overrides: list[str] = (), *,
            batch_size: int = 64) -> list[dict]:
    import numpy as np

    from bertjax.finetune import batches as batch_lib
    from bertjax.finetune.readers import read_rows
    from bertjax.finetune.trainer import check_tokenizer_fits
    from bertjax.inference import Runner
    from bertjax.model_dirs import load_model_dir
    from bertjax.models.inputs import check_ids

    if batch_size <= 0:
        raise ValueError(f"--batch-size must be positive, got {batch_size}")
    model, params, tokenizer = load_model_dir(model_dir)
    if tokenizer is None:
        raise FileNotFoundError(f"{model_dir} holds no tokenizer")
    check_tokenizer_fits(tokenizer, model.config, model_dir)
    task, labels = load_task(model_dir, model, list(overrides))
    encoded = task.encode(tokenizer, read_rows(input_file), labels, str(input_file), with_targets=False)
    type_vocab_size, vocab_size = model.config.type_vocab_size, model.config.vocab_size
    check_ids(encoded.arrays["input_ids"], vocab_size, "token ids")  # on the host, before any compile

    def row_fn(params, batch, max_segments):
        output = model.apply({"params": params}, **task.model_kwargs(batch, type_vocab_size), deterministic=True)
        return task.host_outputs(output)

    # The inference layer's runner (as fill-mask and embed): one jitted program, rows split over every local
    # device, the next batch dispatched while the current one computes. The task's own encoding keeps its
    # layouts (text pairs, word-aligned tags, question/context windows), one example per row.
    runner = Runner(row_fn)
    batch_size = -(-batch_size // runner.devices) * runner.devices
    batches = list(batch_lib.eval_batches(encoded.arrays, batch_size))
    outputs_per_batch = runner.run(runner.place_params(params), (batch for batch, _ in batches), max_segments=1)
    pieces = [{k: np.asarray(v)[:real] for k, v in out.items()}
              for out, (_, real) in zip(outputs_per_batch, batches)]
    outputs = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
    return task.predictions(outputs, encoded, labels)
