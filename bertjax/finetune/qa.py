"""Extractive question answering: contexts cut into overlapping windows, answers mapped to token spans through
character offsets, and start/end logits mapped back to answer text.

A row is `[CLS] question [SEP] context-window [SEP]` (in the tokenizer's own layout: RoBERTa's
`<s> question </s></s> window </s>`); where the layout ends with its [CLS] (XLNet's `A <sep> B <sep> <cls>`, a
tokenizer that pads on the left), the context comes first, `window <sep> question <sep> <cls>`, as transformers'
run_qa lays it out then. A context longer than the room left by the question is
split into windows that share `doc_stride` tokens, so an answer cut by one window's edge lies whole in the next.
A window that does not hold the whole answer (and an unanswerable question, SQuAD v2) is labelled with the
[CLS] position (0, as BERT does; XLNet's last), as run_qa labels it. Prediction takes, per question, the best-scoring
valid span (start <= end, at most max_answer_length tokens, inside the context) over all its windows; with
unanswerable questions allowed, the empty answer wins when the [CLS] score beats every span by more than
`null_score_diff_threshold` (0 by default; transformers' run_qa option of that name; SQuAD v2's evaluation reports
the best one as best_f1_thresh).
"""

from __future__ import annotations

import dataclasses
import numpy as np

from bertjax.finetune.encoding import layout

NO_OFFSET = -1  # offset of a row position outside the context (question, specials, padding)


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offset in the context


@dataclasses.dataclass(frozen=True)
class Windows:
    """The rows of one question: arrays [windows, max_length]."""

    input_ids: np.ndarray
    segment_ids: np.ndarray
    token_type_ids: np.ndarray
    offsets: np.ndarray  # [windows, max_length, 2] character span in the context, NO_OFFSET outside it
    start_positions: np.ndarray  # [windows] row position of the answer's first token, cls_index when absent
    end_positions: np.ndarray
    cls_index: np.ndarray  # [windows] row position of [CLS]: the empty answer's start and end
    question_cut: bool = False  # the question was longer than half a row and lost its end


def answer_in_context(context: str, answer: Answer) -> bool:
    # The bounds first: a negative start would slice from the end of the context (Python's negative indices).
    return bool(answer.text) and 0 <= answer.start <= len(context) - len(answer.text) and \
        context[answer.start:answer.start + len(answer.text)] == answer.text


def check_doc_stride(max_length: int, doc_stride: int, specials: int) -> None:
    """Consecutive windows share doc_stride tokens, so it must be less than the context room of every row: what
    max_length leaves after the longest question (half of it) and the special tokens. A larger stride would make
    the windows advance by a token at a time."""
    room = max_length - max_length // 2 - specials
    if doc_stride >= room:
        raise ValueError(f"data.doc_stride ({doc_stride}) must be less than the context room of a row: "
                         f"data.max_length ({max_length}) minus the question (up to half of it) and {specials} "
                         f"special tokens leaves {room}; lower data.doc_stride (e.g. to {max(1, room // 2)}) or "
                         "raise data.max_length")


def window_starts(length: int, room: int, stride: int) -> list[int]:
    """First context token of each window: windows of `room` tokens, consecutive ones sharing `stride`."""
    step = max(1, room - stride)
    starts = [0]
    while starts[-1] + room < length:
        starts.append(starts[-1] + step)
    return starts


def make_windows(tokenizer, question: str, context: str, answer: Answer | None, *, max_length: int,
                 doc_stride: int, truncation: bool = True, what: str = "question") -> Windows:
    """Rows for one question. `answer` None: unanswerable (or unknown, at prediction time)."""
    template = tokenizer.special_template
    check_doc_stride(max_length, doc_stride, template.specials(pair=True))
    question_ids = [int(t) for t in tokenizer.encode(question)]
    max_question = max_length // 2  # leave the context at least half of each row
    question_cut = len(question_ids) > max_question
    if question_cut:
        if not truncation:
            raise ValueError(f"{what}: the question is {len(question_ids)} tokens, more than half of "
                             f"data.max_length={max_length}; raise data.max_length or set data.truncation=true")
        question_ids = question_ids[:max_question]
    context_ids, context_offsets = tokenizer.encode_with_offsets(context)
    room = max_length - len(question_ids) - template.specials(pair=True)
    stride = doc_stride  # < room: check_doc_stride
    span = None
    if answer is not None:
        end_char = answer.start + len(answer.text)
        inside = np.nonzero((context_offsets[:, 0] < end_char) & (context_offsets[:, 1] > answer.start))[0]
        span = (int(inside[0]), int(inside[-1])) if inside.size else None
    context_first = template.ends_with(tokenizer.cls_id)
    rows, offsets, starts, ends, nulls = [], [], [], [], []
    for begin in window_starts(len(context_ids), room, stride):
        window = [int(t) for t in context_ids[begin:begin + room]]
        first, second = (window, question_ids) if context_first else (question_ids, window)
        rows.append(layout(tokenizer, first, second, max_length))
        # Row positions of the first context token and of the empty answer: XLNet's <cls> at the end, else the
        # first position, BERT's [CLS] (also where a tokenizer that names none has its last token taken for it).
        first_context = template.text_start(0 if context_first else 1, len(first), pair=True)
        null = template.position_of(tokenizer.cls_id, len(first), len(second)) if context_first else 0
        row_offsets = np.full((max_length, 2), NO_OFFSET, np.int32)
        row_offsets[first_context:first_context + len(window)] = context_offsets[begin:begin + len(window)]
        offsets.append(row_offsets)
        nulls.append(null)
        if span is not None and span[0] >= begin and span[1] < begin + len(window):
            starts.append(first_context + span[0] - begin)
            ends.append(first_context + span[1] - begin)
        else:
            starts.append(null)
            ends.append(null)
    return Windows(input_ids=np.stack([r["input_ids"] for r in rows]),
                   segment_ids=np.stack([r["segment_ids"] for r in rows]),
                   token_type_ids=np.stack([r["token_type_ids"] for r in rows]),
                   offsets=np.stack(offsets), start_positions=np.asarray(starts, np.int32),
                   end_positions=np.asarray(ends, np.int32), cls_index=np.asarray(nulls, np.int32),
                   question_cut=question_cut)


@dataclasses.dataclass(frozen=True)
class SpanPrediction:
    text: str
    start: int  # character offsets in the context; -1 for no answer
    end: int
    score: float  # start logit + end logit (the [CLS] score for no answer)
    # With unanswerable questions allowed: the null score minus the best span's (the empty answer was chosen when it
    # exceeds the threshold), and the best span's text whichever was chosen, for SQuAD v2's threshold search.
    null_score_diff: float | None = None
    best_span_text: str = ""


def best_span(start_logits: np.ndarray, end_logits: np.ndarray, offsets: np.ndarray, context: str, *,
              n_best: int, max_answer_length: int, allow_empty: bool, null_score_diff_threshold: float = 0.0,
              cls_index: np.ndarray | None = None) -> SpanPrediction:
    """The answer of one question from the logits of its windows ([windows, max_length] each); `cls_index`
    [windows]: where each window's empty answer is scored (default 0, BERT's [CLS])."""
    best = SpanPrediction("", -1, -1, -np.inf)
    null_score = np.inf
    nulls = np.zeros(len(start_logits), np.int64) if cls_index is None else np.asarray(cls_index)
    for starts, ends, window_offsets, null in zip(np.asarray(start_logits), np.asarray(end_logits),
                                                  np.asarray(offsets), nulls):
        # The [CLS] score of the window that most believes in an answer, as transformers' run_qa takes it.
        null_score = min(null_score, float(starts[null] + ends[null]))
        # The n_best among context tokens only: question tokens and padding (whose logits training never pushes
        # down) ranked with them could fill the n_best and leave a window without any candidate.
        valid = window_offsets[:, 0] != NO_OFFSET
        candidates_start = [i for i in np.argsort(np.where(valid, -starts, np.inf), kind="stable")[:n_best] if valid[i]]
        candidates_end = [j for j in np.argsort(np.where(valid, -ends, np.inf), kind="stable")[:n_best] if valid[j]]
        for i in candidates_start:
            for j in candidates_end:
                if j < i or j - i + 1 > max_answer_length:
                    continue
                score = float(starts[i] + ends[j])
                if score > best.score:
                    begin, finish = int(window_offsets[i, 0]), int(window_offsets[j, 1])
                    best = SpanPrediction(context[begin:finish], begin, finish, score)
    if not allow_empty:
        return best
    # No span at all (an empty context): the empty answer, whatever the threshold.
    diff = null_score - best.score if best.start >= 0 else np.inf
    if diff > null_score_diff_threshold:
        return SpanPrediction("", -1, -1, null_score, null_score_diff=diff, best_span_text=best.text)
    return dataclasses.replace(best, null_score_diff=diff, best_span_text=best.text)
