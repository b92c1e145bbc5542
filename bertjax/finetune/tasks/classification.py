"""Sequence classification and regression: one text (or a pair) -> one label, or one number.

Regression when task.problem_type is regression, task.num_labels is 1, or (neither problem_type nor num_labels
given) the training labels are numbers that are not all integers (STS-B's similarity scores); integer labels are
classes, and whole numbers written as decimals (1.0, 2.0) too, with a note saying so.
task.problem_type=single_label_classification, or task.num_labels >= 2, makes any labels classes. With
data.packing, several short examples share a row (segment ids 1, 2, ...) and the model pools each one separately
(`max_segments`). Each row
has its text_pair or not (a missing or null one: a single text), in training and in `bertjax predict` alike.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from bertjax.finetune import metrics
from bertjax.finetune.encoding import encode_texts_and_cuts
from bertjax.finetune.packing import pack_rows, training_order
from bertjax.finetune.readers import is_null, require_columns, text_cell
from bertjax.finetune.tasks.base import (Encoded, Labels, Task, cross_entropy, fit_names, is_number, label_ids,
                                         sigmoid, softmax, written_as_float)

# The probability at which a multi-label checkpoint's label applies (its sigmoid is an independent yes/no).
MULTI_LABEL_THRESHOLD = 0.5


class SequenceClassification(Task):
    name = "sequence-classification"
    head = "sequence_classification"
    main_metric = "accuracy"  # regression: pearson
    prediction_unit = "segments"  # packed prediction: the head pools each packed example
    packs_training_rows = True
    pools_sequence = True
    truncation_effect = "each is predicted from the tokens that fit (the longer text of a pair is cut first)"
    defaults = {"train": {"learning_rate": 2e-5, "batch_size": 32, "epochs": 3}, "data": {"max_length": 128}}

    def label_settings(self, labels: Labels) -> dict:
        problem = ("regression" if labels.regression
                   else (self.task_config.problem_type or "single_label_classification"))
        return {"num_labels": labels.num_labels, "labels": labels.names or None, "problem_type": problem}

    def main_metric_for(self, labels: Labels) -> str:
        return "pearson" if labels.regression else "accuracy"

    def _columns(self, rows: list[dict], source: str, with_targets: bool) -> dict[str, str]:
        columns = {"data.text_column": self.data.text_column}
        if with_targets:
            columns["data.label_column"] = self.data.label_column
        require_columns(rows, source, columns)
        return columns

    def _texts(self, rows: list[dict], source: str) -> tuple[list[str], list[str | None]]:
        """(texts, pairs) per row: each row has its pair or not (a missing or null text_pair: a single text), as a
        transformers tokenizer given (text, None); a null text is an error naming the row."""
        texts, pairs = [], []
        for i, row in enumerate(rows):
            where = f"{source}, row {i + 1}"
            texts.append(text_cell(row, self.data.text_column, "data.text_column", where))
            pairs.append(text_cell(row, self.data.text_pair_column, "data.text_pair_column", where, optional=True))
        return texts, pairs

    def _label_values(self, rows: list[dict], source: str) -> list:
        values = [row[self.data.label_column] for row in rows]
        for i, value in enumerate(values):
            if is_null(value) or (isinstance(value, str) and not value.strip()):  # an empty CSV cell names no class
                raise ValueError(f"{source}, row {i + 1}: the label (column {self.data.label_column!r}) is "
                                 f"{'null' if is_null(value) else 'empty'}; every training or evaluation example "
                                 "needs one")
        return values

    def fit_labels(self, rows, source, known):
        self._columns(rows, source, with_targets=True)
        values = self._label_values(rows, source)
        problem_type = self.task_config.problem_type
        forced = problem_type == "regression" or self.task_config.num_labels == 1
        numeric = all(is_number(v) for v in values)
        # Classes were asked for by problem_type, or by num_labels >= 2: fractional numbers are then class names.
        classes_asked = problem_type is not None or (self.task_config.num_labels or 0) >= 2
        if forced or (numeric and not classes_asked and not all(float(v).is_integer() for v in values)):
            if not numeric:
                bad = next(v for v in values if not is_number(v))
                raise ValueError(f"{source}: regression needs numeric labels, got {bad!r} in column "
                                 f"{self.data.label_column!r}")
            self._check_finite(values, source)
            return Labels(regression=True, text_pairs=self._pair_layout(rows, source))
        names = fit_names(values, known)
        notes = ()
        if numeric and problem_type is None and any(written_as_float(v) for v in values):
            # 1.0, 2.0 ... may be scores (HF's run_glue reads a float column as regression) or class ids: say which.
            notes = (f"{source}: the labels are whole numbers written as decimals "
                     f"({next(v for v in values if written_as_float(v))!r}, ...): read as {len(names)} classes; for a "
                     "score to regress, set task.problem_type=regression",)
        if self.task_config.num_labels is not None and self.task_config.num_labels != len(names):
            raise ValueError(f"{source}: task.num_labels={self.task_config.num_labels} but the training labels are "
                             f"{len(names)}: {list(names)}")
        if len(names) < 2:
            raise ValueError(f"{source}: every training example has the label {names[0]!r}; classification needs "
                             "at least two classes")
        return Labels(names=names, text_pairs=self._pair_layout(rows, source), notes=notes)

    def _check_finite(self, values: list, source: str) -> None:
        for i, value in enumerate(values):
            if not math.isfinite(float(value)):  # "nan" or "inf" in a CSV cell: every loss after it would be NaN
                raise ValueError(f"{source}, row {i + 1}: regression needs a finite label, got {value!r} in column "
                                 f"{self.data.label_column!r}")

    def _pair_layout(self, rows, source) -> str:
        with_pair = sum(pair is not None for pair in self._texts(rows, source)[1])
        return "all" if with_pair == len(rows) else "none" if with_pair == 0 else "some"

    def encode(self, tokenizer, rows, labels, source, *, with_targets, training=False):
        self._columns(rows, source, with_targets)
        texts, pairs = self._texts(rows, source)
        if labels.text_pairs == "all" and all(pair is None for pair in pairs):
            raise ValueError(f"{source}: no row has a second text in column {self.data.text_pair_column!r} "
                             "(data.text_pair_column), but the model was trained on a text pair in every row; name "
                             "the column that holds it with data.text_pair_column=NAME")
        arrays, cut = encode_texts_and_cuts(tokenizer, texts, pairs, self.data.max_length, self.data.truncation,
                                            source)
        gold = None
        if with_targets:
            values = self._label_values(rows, source)
            if labels.regression:
                for i, value in enumerate(values):
                    if not is_number(value):
                        raise ValueError(f"{source}, row {i + 1}: regression needs a numeric label, got {value!r} "
                                         f"in column {self.data.label_column!r}")
                self._check_finite(values, source)
                gold = np.asarray([float(v) for v in values], np.float32)
            else:
                gold = label_ids(values, labels.names, source, self.data.label_column)
            arrays["labels"] = gold
        if self.data.packing:
            arrays = pack_rows(arrays, tokenizer.pad_id, training_order(len(rows)) if training else None)
        paired = sum(pair is not None for pair in pairs)
        notes = [f"{source}: {paired} of {len(rows)} rows have a second text (column {self.data.text_pair_column!r}"
                 "), but the model was trained on single texts: they are read as pairs"] \
            if labels.text_pairs == "none" and paired else []
        return Encoded(arrays, examples=[None] * len(rows) if gold is None else list(gold), truncated=int(cut.sum()),
                       notes=notes)

    # Packed rows carry [rows, K] labels and weights; unpacked ones [rows].
    @classmethod
    def model_kwargs(cls, batch, type_vocab_size):
        inputs = super().model_kwargs(batch, type_vocab_size)
        if "slot_weight" in batch:
            inputs["max_segments"] = batch["slot_weight"].shape[1]
        return inputs

    def _per_example(self, output, batch):
        """(predictions [n, labels], labels [n], weights [n]) flattened over packed slots when packed."""
        logits = output.logits.astype(jnp.float32)
        if "slot_weight" in batch:
            weights = batch["slot_weight"] * batch["weight"][:, None]
            return logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), weights.reshape(-1)
        return logits, batch["labels"], batch["weight"]

    def loss_sums(self, output, batch):
        logits, labels, weights = self._per_example(output, batch)
        if logits.shape[-1] == 1 and jnp.issubdtype(labels.dtype, jnp.floating):
            losses = (logits[:, 0] - labels) ** 2
        else:
            losses = cross_entropy(logits, labels.astype(jnp.int32))
        return jnp.sum(losses * weights), jnp.sum(weights)

    @classmethod
    def host_outputs(cls, output):
        return {"logits": output.logits.astype(jnp.float32)}

    def _example_logits(self, outputs, encoded):
        logits = outputs["logits"]
        if "slot_weight" in encoded.arrays:  # packed: the slots that hold an example, in example order
            order = encoded.arrays["slot_example"].reshape(-1)
            flat = logits.reshape(-1, logits.shape[-1])
            keep = order >= 0
            out = np.empty((len(encoded.examples), logits.shape[-1]), logits.dtype)
            out[order[keep]] = flat[keep]
            return out
        return logits

    def metrics(self, outputs, encoded, labels):
        logits = self._example_logits(outputs, encoded)
        gold = np.asarray(encoded.examples)
        if labels.regression:
            return metrics.regression_scores(logits[:, 0], gold)
        return metrics.classification_scores(logits.argmax(-1), gold, labels.num_labels)

    def predictions(self, outputs, encoded, labels):
        logits = self._example_logits(outputs, encoded)
        if labels.regression:
            return [{"score": float(x)} for x in logits[:, 0]]
        # Exclusive classes share one softmax; a multi-label checkpoint's labels are independent sigmoids, as
        # transformers' text-classification pipeline scores them for that problem_type.
        probabilities = sigmoid(logits) if labels.multi_label else softmax(logits)
        records = []
        for row in probabilities:
            best = int(row.argmax())
            record = {"label": labels.names[best], "score": float(row[best]),
                      "scores": {name: float(p) for name, p in zip(labels.names, row)}}
            if labels.multi_label:  # every label that applies, highest first
                record["labels"] = [labels.names[i] for i in np.argsort(-row, kind="stable")
                                    if row[i] >= MULTI_LABEL_THRESHOLD]
            records.append(record)
        return records
