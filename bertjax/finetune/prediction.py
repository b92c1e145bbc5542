"""Predictions of a fine-tuned model over a file of examples: one record per example, in input order (what
`bertjax predict` writes as JSON lines, and what `bertjax glue` scores).

The model directory is the `best/` of `bertjax finetune` (its finetune.json gives the task, the labels and the data
settings) or any transformers directory of a task model (the task comes from its class, labels from id2label).
Records: sequence classification `{"label", "score", "scores"}` (regression `{"score"}`), token classification
`{"tokens", "tags", "scores"}` (one tag per input word; tag and score null for a word the model never saw: one past
data.max_length, or one without any token), question answering `{"id", "answer", "start", "end", "score"}` (the
answer as text of the context; "" for no answer, with a null score when the context has no span at all), multiple
choice `{"label", "scores"}`. Examples longer than data.max_length are cut (data.truncation, the default) and a
warning counts them.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Callable


def load_task(model_dir: str | Path, model, overrides: list[str]):
    """(task, labels) of a fine-tuned model: from its finetune.json when present, else from its class."""
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import Labels, task_class, task_for_head
    from bertjax.finetune.tasks.base import chosen_keys, fit_max_length
    from bertjax.finetune.trainer import RUN_FILE, read_run_file
    from bertjax.hf.pretrained import head_of

    ignored = [item.split("=", 1)[0] for item in overrides if not item.startswith(("data.", "task."))]
    if ignored:  # training settings would be accepted and change nothing
        raise ValueError(f"{', '.join(ignored)}: predict takes data.* and task.* settings only (how examples are "
                         "encoded and read out)")
    if (Path(model_dir) / RUN_FILE).is_file():
        described = read_run_file(model_dir)
        try:
            cls = task_class(described["task"])
            labels = Labels(names=tuple(described["labels"]), regression=described["regression"],
                            unanswerable=described["unanswerable"], text_pairs=described.get("text_pairs"))
            defaults = {"data": described["data"]}
        except (KeyError, TypeError, ValueError) as error:  # a record edited or damaged: named, no traceback
            raise ValueError(f"{Path(model_dir) / RUN_FILE}: not a fine-tuning record bertjax can read "
                             f"({type(error).__name__}: {error}); write best/ again with `bertjax finetune`") from None
    else:
        cls = task_for_head(head_of(model))
        task = model.config.task_or_default
        regression = task.problem_type == "regression"
        # One output that is no regression (a reranker's relevance, with no problem_type) is a sigmoid too, as
        # transformers' text-classification pipeline scores it: a softmax over one logit is always 1.
        labels = Labels(names=() if regression or cls.head in ("question_answering", "multiple_choice")
                        else task.label_names, regression=regression,
                        multi_label=cls.head == "sequence_classification" and not regression
                        and (task.problem_type == "multi_label_classification" or task.num_labels == 1))
        defaults = cls.defaults
    config = load_finetune_config(None, overrides, defaults)
    if config.task.unanswerable is not None:  # a transformers SQuAD v2 checkpoint has no record of it
        labels = dataclasses.replace(labels, unanswerable=config.task.unanswerable)
    # A task default (QA's 384) is capped to a smaller checkpoint; a data.max_length the user set must fit it.
    data = fit_max_length(config.data, model.config, chosen=chosen_keys(overrides), model=f"--model {model_dir}")
    return cls(data, config.task), labels


def warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)


def truncation_warning(task, encoded, input_file, model_config) -> str | None:
    """The line that counts the examples cut to data.max_length (None when none was): part of each never reached
    the model, which a record alone does not show."""
    from bertjax.inference.texts import model_max_length

    if not encoded.truncated:
        return None
    length, limit = task.data.max_length, model_max_length(model_config)
    advice = (f"pass data.max_length={limit} (the most the model takes) to see more of them" if length < limit
              else f"the model takes no more than {limit} tokens")
    return (f"{input_file}: {encoded.truncated} of {len(encoded.examples)} examples "
            f"{task.truncation_cause.format(length=length)}; {task.truncation_effect}; {advice}")


def predict(model_dir: str | Path, input_file: str | Path, overrides: list[str] = (), *,
            batch_size: int = 64, max_tokens: int | None = None, say: Callable[[str], None] = warn,
            allow_pickle: bool = False) -> list[dict]:
    """The records of `input_file`'s examples, in input order (see the module docstring). `say` gets the warning
    that counts examples cut to data.max_length (default: printed to stderr); `allow_pickle` reads a transformers
    directory that has only a pytorch_model.bin (trusted files only)."""
    import dataclasses

    from bertjax.finetune.inference import predict_outputs
    from bertjax.finetune.readers import read_rows
    from bertjax.inference.texts import check_tokenizer_fits
    from bertjax.model_dirs import load_model_dir
    from bertjax.models.inputs import check_ids
    from bertjax.models.task_models import with_global_token_bound

    if batch_size <= 0:
        raise ValueError(f"--batch-size must be positive, got {batch_size}")
    if max_tokens is not None and max_tokens <= 0:
        raise ValueError(f"--max-tokens must be positive, got {max_tokens}")
    model, params, tokenizer = load_model_dir(model_dir, allow_pickle=allow_pickle)
    if tokenizer is None:
        raise FileNotFoundError(f"{model_dir} holds no tokenizer")
    check_tokenizer_fits(tokenizer, model.config, model_dir)
    task, labels = load_task(model_dir, model, list(overrides))
    # One row per example: the inference layer packs them itself (data.packing is the training-time layout).
    task.data = dataclasses.replace(task.data, packing=False)
    encoded = task.encode(tokenizer, read_rows(input_file), labels, str(input_file), with_targets=False)
    check_ids(encoded.arrays["input_ids"], model.config.vocab_size, "token ids")  # on the host, before any compile
    for note in encoded.notes:  # what the encoding skipped or read otherwise than the model was trained on
        say(note)
    warning = truncation_warning(task, encoded, input_file, model.config)
    if warning:
        say(warning)
    # The inference layer (as fill-mask and embed): examples packed several per row where the model allows it,
    # shape buckets under a token budget, rows split over every local device (bertjax/finetune/inference.py).
    # A Longformer runs with the most global tokens a row here has: a static bound keeps its attention linear.
    model = with_global_token_bound(model, encoded.arrays)
    outputs = predict_outputs(model, params, task, encoded, tokenizer, max_tokens=max_tokens, batch_size=batch_size)
    check_outputs(outputs, input_file, model.config.dtype)
    return task.predictions(outputs, encoded, labels)


def check_outputs(outputs: dict, input_file, dtype: str) -> None:
    """NaN anywhere in the model's outputs is an error: an argmax over NaN scores is label 0 and a span over them
    is the first token, records that look like predictions. (Infinities stay: padded choices and positions hold
    them by design.)"""
    import numpy as np

    rows = None
    for value in outputs.values():
        value = np.asarray(value)
        if np.issubdtype(value.dtype, np.floating):
            bad = np.isnan(value).reshape(len(value), -1).any(axis=1)
            rows = bad if rows is None else rows | bad
    if rows is not None and rows.any():
        raise ValueError(f"{input_file}: the model's outputs are NaN for {int(rows.sum())} of {len(rows)} encoded "
                         f"rows (the first: row {int(np.argmax(rows)) + 1}); it computes in {dtype}: a float16 model "
                         "can overflow where float32 does not, and a model trained to NaN has NaN parameters")
