"""Multiple choice (SWAG, RACE-style): a question and its choices -> the index of the right choice.

Each choice is laid out as `[CLS] question [SEP] choice [SEP]`; inputs are [examples, choices, max_length] and
the model scores each choice with one logit. Every question of a file must have the same number of choices (one
compiled shape); `label` is the 0-based index of the right choice.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from bertjax.finetune import metrics
from bertjax.finetune.encoding import encode_texts_and_cuts
from bertjax.finetune.readers import require_columns, text_cell, text_list
from bertjax.finetune.tasks.base import Encoded, Labels, Task, cross_entropy, is_number, softmax


class MultipleChoice(Task):
    name = "multiple-choice"
    head = "multiple_choice"
    main_metric = "accuracy"
    # Prediction stays one question per row: the model takes [questions, choices, seq] and scores a question's
    # choices side by side; packed segments have no choices axis (each choice would be a separate example).
    prediction_unit = None
    pools_sequence = True  # each choice's row pools to one score
    defaults = {"train": {"learning_rate": 2e-5, "batch_size": 16, "epochs": 3}, "data": {"max_length": 128}}

    def _choices(self, rows, source):
        require_columns(rows, source, {"data.question_column": self.data.question_column,
                                       "data.choices_column": self.data.choices_column})
        choices = [text_list(row[self.data.choices_column], f"{source}, row {i + 1}, choices")
                   for i, row in enumerate(rows)]
        counts = sorted({len(c) for c in choices})
        if len(counts) != 1 or counts[0] < 2:
            raise ValueError(f"{source}: every question needs the same number (>= 2) of choices; found {counts}")
        return choices

    def _answers(self, rows, source, count):
        require_columns(rows, source, {"data.label_column": self.data.label_column})
        out = []
        for i, row in enumerate(rows):
            value = row[self.data.label_column]
            if not is_number(value) or not float(value).is_integer() or not 0 <= int(float(value)) < count:
                raise ValueError(f"{source}, row {i + 1}: label {value!r} is not a choice index in [0, {count})")
            out.append(int(float(value)))
        return np.asarray(out, np.int32)

    def fit_labels(self, rows, source, known):
        self._answers(rows, source, len(self._choices(rows, source)[0]))
        return Labels(names=())  # one logit per choice: nothing to name

    def encode(self, tokenizer, rows, labels, source, *, with_targets, training=False):
        choices = self._choices(rows, source)
        count = len(choices[0])
        questions = [text_cell(row, self.data.question_column, "data.question_column", f"{source}, row {i + 1}")
                     for i, row in enumerate(rows) for _ in range(count)]
        flat, cut = encode_texts_and_cuts(tokenizer, questions, [c for row in choices for c in row],
                                          self.data.max_length, self.data.truncation, source,
                                          where=lambda i: f"{source}, row {i // count + 1}, choice {i % count + 1}")
        arrays = {k: v.reshape(len(rows), count, -1) for k, v in flat.items()}
        examples = [None] * len(rows)
        if with_targets:
            arrays["labels"] = self._answers(rows, source, count)
            examples = list(arrays["labels"])
        return Encoded(arrays, examples, truncated=int(cut.reshape(len(rows), count).any(1).sum()))

    def loss_sums(self, output, batch):
        losses = cross_entropy(output.logits, batch["labels"])
        return jnp.sum(losses * batch["weight"]), jnp.sum(batch["weight"])

    @classmethod
    def host_outputs(cls, output):
        return {"logits": output.logits.astype(jnp.float32)}

    def metrics(self, outputs, encoded, labels):
        return {"accuracy": metrics.accuracy(outputs["logits"].argmax(-1), np.asarray(encoded.examples))}

    def predictions(self, outputs, encoded, labels):
        return [{"label": int(row.argmax()), "scores": [float(p) for p in row]} for row in softmax(outputs["logits"])]
