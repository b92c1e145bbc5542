"""Extractive question answering (SQuAD v1.1 and v2): the answer is a span of the context.

Rows are windows of `bertjax.finetune.qa`; a question can have several. A training answer that is not at its
`answer_start` in the context is skipped and counted (the note says how many), never trained on at a wrong place.
Unanswerable questions (empty `answers`) are trained towards [CLS]; when the training file has any, prediction may
answer "" (SQuAD v2), otherwise it always picks a span.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from bertjax.finetune import metrics
from bertjax.finetune.qa import Answer, answer_in_context, best_span, make_windows
from bertjax.finetune.readers import as_list, as_mapping, is_null, require_columns, text_cell
from bertjax.finetune.tasks.base import Encoded, Labels, Task, cross_entropy

# A logit no answer position takes: exp of it minus any real logit is 0 in float32.
_ABSENT = -1e9


@dataclasses.dataclass(frozen=True)
class Question:
    id: str
    context: str
    answers: tuple[str, ...]  # gold texts; () for unanswerable or unknown


def _offset(value, where: str) -> int:
    """A character offset: an integer, or one written as 12.0 (pandas) or "12" (a CSV cell)."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not number.is_integer():
        raise ValueError(f"{where}: answers.answer_start holds {value!r}, not a character offset (an integer)")
    return int(number)


def _points_at_a_token(labels, present):
    """1.0 where a row's label is the index of one of its present tokens, else 0.0."""
    inside = (labels >= 0) & (labels < present.shape[-1])
    at = jnp.take_along_axis(present, jnp.clip(labels, 0, present.shape[-1] - 1)[:, None], axis=-1)[:, 0]
    return (inside & at).astype(jnp.float32)


class QuestionAnswering(Task):
    name = "question-answering"
    head = "question_answering"
    main_metric = "f1"
    prediction_unit = "tokens"  # packed prediction: start/end logits per token, cut back per window
    target_keys = ("start_positions", "end_positions")
    # Contexts are read whole, in windows; only a question longer than half a row is cut.
    truncation_cause = "have a question longer than half of data.max_length={length} tokens, cut to that half"
    truncation_effect = "their answers are looked for with the question's first tokens only"
    defaults = {"train": {"learning_rate": 3e-5, "batch_size": 32, "epochs": 2},
                "data": {"max_length": 384, "doc_stride": 128}}

    def _answers(self, row, where) -> list[Answer]:
        value = as_mapping(row[self.data.answers_column], f"{where}, answers")
        texts = as_list(value.get("text", []), f"{where}, answers.text")
        starts = as_list(value.get("answer_start", []), f"{where}, answers.answer_start")
        if len(texts) != len(starts):
            raise ValueError(f"{where}: answers has {len(texts)} texts but {len(starts)} answer_start values")
        return [Answer(str(t), _offset(s, where)) for t, s in zip(texts, starts)]

    def _columns(self, rows, source, with_targets):
        columns = {"data.question_column": self.data.question_column,
                   "data.context_column": self.data.context_column}
        if with_targets:
            columns["data.answers_column"] = self.data.answers_column
        require_columns(rows, source, columns)

    def fit_labels(self, rows, source, known):
        self._columns(rows, source, True)
        if self.task_config.unanswerable is not None:
            return Labels(unanswerable=self.task_config.unanswerable)
        empty = any(not self._answers(row, f"{source}, row {i + 1}") for i, row in enumerate(rows))
        return Labels(unanswerable=empty)

    def encode(self, tokenizer, rows, labels, source, *, with_targets, training=False):
        self._columns(rows, source, with_targets)
        keys = ("input_ids", "segment_ids", "token_type_ids", "offsets", "cls_index", "start_positions",
                "end_positions")
        parts: dict[str, list] = {k: [] for k in keys + ("window_example",)}
        questions, misplaced, cut = [], 0, 0
        for i, row in enumerate(rows):
            where = f"{source}, row {i + 1}"
            context = text_cell(row, self.data.context_column, "data.context_column", where)
            question = text_cell(row, self.data.question_column, "data.question_column", where)
            answers = self._answers(row, where) if with_targets else []
            located = [a for a in answers if answer_in_context(context, a)]
            if answers and not located:
                misplaced += 1
                if training:
                    continue  # never train towards a span that is not the answer
            windows = make_windows(tokenizer, question, context,
                                   located[0] if located else None, max_length=self.data.max_length,
                                   doc_stride=self.data.doc_stride, truncation=self.data.truncation, what=where)
            cut += windows.question_cut
            for key in keys:
                parts[key].append(getattr(windows, key))
            parts["window_example"].append(np.full(len(windows.input_ids), len(questions), np.int32))
            identifier = row.get(self.data.id_column)  # optional: the row's index when missing or null
            questions.append(Question(str(i) if is_null(identifier) else str(identifier), context,
                                      tuple(a.text for a in answers)))
        if not questions:
            raise ValueError(f"{source}: no usable question (every answer is missing from its context)")
        arrays = {k: np.concatenate(v) for k, v in parts.items()}
        if not with_targets:
            del arrays["start_positions"], arrays["end_positions"]
        notes = []
        if misplaced:
            what = "skipped for training" if training else "kept, scored against their gold texts"
            notes.append(f"{source}: {misplaced} of {len(rows)} questions have no answer text at their answer_start "
                         f"in the context ({what})")
        return Encoded(arrays, questions, notes, truncated=cut)

    def loss_sums(self, output, batch):
        # The softmax runs over the window's present tokens: a padding position is never an answer, and its logit
        # (the classifier's bias alone: padding's hidden state is not computed as a token's) would otherwise make
        # the loss depend on how much padding the batch happens to have. transformers includes padding here.
        # A label that is not one of the window's present tokens (a caller's -1, or a position past the window, which
        # transformers clamps and ignores) is left out of both the sum and the count, start and end each on its own:
        # counting it as a zero loss would shrink the mean by how many such labels a batch happens to hold.
        present = batch["segment_ids"] != 0
        sums, counts = [], []
        for logits, labels in ((output.start_logits, batch["start_positions"]),
                               (output.end_logits, batch["end_positions"])):
            counted = _points_at_a_token(labels, present) * batch["weight"]
            sums.append(jnp.sum(cross_entropy(jnp.where(present, logits, _ABSENT), labels) * counted))
            counts.append(jnp.sum(counted))
        return (sums[0] + sums[1]) / 2, (counts[0] + counts[1]) / 2

    @classmethod
    def host_outputs(cls, output):
        return {"start_logits": output.start_logits.astype(jnp.float32),
                "end_logits": output.end_logits.astype(jnp.float32)}

    def _spans(self, outputs, encoded, labels):
        owner = encoded.arrays["window_example"]
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(len(encoded.examples) + 1))
        for q, question in enumerate(encoded.examples):
            rows = order[bounds[q]:bounds[q + 1]]
            yield question, best_span(outputs["start_logits"][rows], outputs["end_logits"][rows],
                                      encoded.arrays["offsets"][rows], question.context, n_best=self.data.n_best,
                                      max_answer_length=self.data.max_answer_length,
                                      allow_empty=labels.unanswerable,
                                      null_score_diff_threshold=self.data.null_score_diff_threshold,
                                      cls_index=encoded.arrays["cls_index"][rows])

    def metrics(self, outputs, encoded, labels):
        spans = list(self._spans(outputs, encoded, labels))
        golds = [q.answers for q, _ in spans]
        scores = metrics.squad_scores([s.text for _, s in spans], golds)
        if labels.unanswerable:  # SQuAD v2: also the best the threshold could do, and that threshold
            scores.update(metrics.squad_best_thresholds([s.best_span_text for _, s in spans],
                                                        [s.null_score_diff for _, s in spans], golds))
        return scores

    def predictions(self, outputs, encoded, labels):
        # No span at all (an empty context) scores -inf: null in JSON, which has no infinities.
        finite = lambda value: value if value is not None and np.isfinite(value) else None  # noqa: E731
        records = []
        for q, s in self._spans(outputs, encoded, labels):
            record = {"id": q.id, "answer": s.text, "start": s.start, "end": s.end, "score": finite(s.score)}
            if labels.unanswerable:  # what data.null_score_diff_threshold is compared with
                record["null_score_diff"] = finite(s.null_score_diff)
            records.append(record)
        return records
