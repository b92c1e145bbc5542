"""Fine-tuned task models on the inference layer (bertjax.inference): `bertjax predict` packs examples as `embed`
and `fill-mask` pack texts, through the same buckets, token budget, runner and mesh.

The task's own encoding (text pairs with their token types, word-aligned tags, question/context windows) gives one
padded row per example or window. Each becomes a sequence (its tokens, padding dropped) with its token type ids,
and sequences are packed several to a row where the model allows it (segment ids keep them apart, positions restart
at each), then the outputs come back per sequence:
  - per segment (`Task.prediction_unit == "segments"`: sequence classification and regression): the head pools
    each packed segment on its own (its first token, or the family's pooling), one logit vector per example;
  - per token ("tokens": token classification, QA's start and end logits): each sequence's outputs are cut out of
    its row and re-padded to the task's row width, so the task reads them as it reads padded-row outputs.
Multiple choice (prediction_unit None) stays one example per row, batch by batch on the same runner: its model takes
[examples, choices, seq] and scores all choices of a question side by side, an input packed segments do not have.
"""

from __future__ import annotations

import functools

import numpy as np

from bertjax.finetune.packing import MAX_SEGMENTS
from bertjax.inference import BucketConfig, Runner, TextInference, supports_packing
from bertjax.inference.buckets import DEFAULT_LENGTHS

# Token outputs at re-padded positions: below any real logit (a QA span never starts or ends on padding), finite
# (a softmax over the labels of a padding position stays defined; token classification never reads it).
PAD_LOGIT = -1e9


@functools.lru_cache(maxsize=16)
def task_row_fn(model, task: type):
    """Row function (bertjax.inference.runner) of a task model and task class: its host outputs per slot or per
    token. Cached (modules hash by their fields), so every prediction with an equal model reuses the compiled
    programs, as `embed` does."""
    unit = task.prediction_unit
    type_vocab_size = model.config.type_vocab_size

    def row_fn(params, batch, max_segments):
        kwargs = task.model_kwargs(batch, type_vocab_size)
        if unit == "segments":
            kwargs["max_segments"] = max_segments
        output = model.apply({"params": params}, **kwargs, deterministic=True)
        return {unit or "rows": task.host_outputs(output)}  # "rows": one example per row, unpacked

    return row_fn


def example_sequences(arrays: dict[str, np.ndarray]) -> tuple[list[np.ndarray], dict[str, list[np.ndarray]]]:
    """Unpadded rows (tokens where segment_ids > 0, at the start of each row) -> (token ids per row, per-token
    inputs per row)."""
    lengths = (arrays["segment_ids"] > 0).sum(1)
    sequences = [row[:n] for row, n in zip(arrays["input_ids"], lengths)]
    token_inputs = {}
    if "token_type_ids" in arrays:
        token_inputs["token_type_ids"] = [row[:n] for row, n in zip(arrays["token_type_ids"], lengths)]
    return sequences, token_inputs


def repad(values: list[np.ndarray], width: int) -> np.ndarray:
    """Per-sequence token outputs [n_i, ...] -> [sequences, width, ...], PAD_LOGIT after each sequence."""
    first = values[0]
    out = np.full((len(values), width) + first.shape[1:], PAD_LOGIT, first.dtype)
    for i, value in enumerate(values):
        out[i, :len(value)] = value
    return out


def predict_outputs(model, params, task, encoded, tokenizer, *, max_tokens: int | None = None,
                    packing: bool | None = None, batch_size: int = 64, mesh=None) -> dict[str, np.ndarray]:
    """The task's host outputs for every row of `encoded` (unpacked rows: one per example or window), in row order,
    as `task.predictions` and `task.metrics` read them. packing: None packs where the model allows it
    (inference.supports_packing); max_tokens: the token budget of a batch (None: the platform's default);
    batch_size: examples per batch of the unpacked path (multiple choice)."""
    if task.prediction_unit is None:
        return _one_example_per_row(model, params, task, encoded, batch_size, mesh)
    arrays = encoded.arrays
    width = arrays["input_ids"].shape[1]
    packing = supports_packing(model.config) if packing is None else packing
    # A model that cannot pack keeps rows of the task's width (the shape it was trained and evaluated at).
    lengths = DEFAULT_LENGTHS if packing else (width,)
    buckets = BucketConfig(lengths=lengths, max_tokens=max_tokens, max_segments=MAX_SEGMENTS if packing else 1)
    inference = TextInference(task_row_fn(model, type(task)), tokenizer, width, buckets=buckets, packing=packing,
                              mesh=mesh, vocab_size=model.config.vocab_size)
    sequences, token_inputs = example_sequences(arrays)
    outputs = inference.run_sequences(inference.runner.place_params(params), sequences, token_inputs=token_inputs)
    if task.prediction_unit == "segments":
        return outputs.segments
    return {name: repad(values, width) for name, values in outputs.tokens.items()}


def _one_example_per_row(model, params, task, encoded, batch_size: int, mesh) -> dict[str, np.ndarray]:
    from bertjax.finetune import batches as batch_lib

    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    runner = Runner(task_row_fn(model, type(task)), mesh)
    batch_size = -(-batch_size // runner.devices) * runner.devices
    batches = list(batch_lib.eval_batches(encoded.arrays, batch_size))
    outputs = runner.run(runner.place_params(params), (batch for batch, _ in batches), max_segments=1)
    pieces = [{k: np.asarray(v)[:real] for k, v in out["rows"].items()} for out, (_, real) in zip(outputs, batches)]
    return {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
