"""The fine-tuning metrics, written out in numpy so that their definitions can be read here and nowhere else.

Classification: `accuracy`, `f1_macro` (unweighted mean of per-class F1 over the classes seen in labels or
predictions, as scikit-learn's `f1_score(average="macro")`), `mcc` (multi-class Matthews correlation, as
scikit-learn's `matthews_corrcoef`), and for two classes `f1`, the F1 of the positive class (label id 1: "1" of
0/1 labels; scikit-learn's `f1_score` default, what GLUE reports for MRPC and QQP). Regression: `pearson`,
`spearman` (Pearson of average ranks), `mse`.
Token classification: entity-level `precision`, `recall`, `f1` over BIO / IOB2 tags, chunked as seqeval's default
(lenient) mode does, so an `I-X` without a `B-X` still opens an entity. Question answering: `exact_match` and `f1`
with the official SQuAD normalisation, the maximum over the gold answers, on a 0-100 scale as the official script
and transformers' run_qa report them (the other metrics are fractions, as run_glue reports them).
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

import numpy as np


# ---------------------------------------------------------------------------------------------------------------
# Classification.

def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    return float(np.mean(predictions == labels)) if labels.size else 0.0


def _confusion(predictions: Sequence[int], labels: Sequence[int]) -> np.ndarray:
    """[class, class] counts (rows: true label, columns: prediction) over the classes that occur in either."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    classes = np.union1d(predictions, labels)
    true = np.searchsorted(classes, labels)
    pred = np.searchsorted(classes, predictions)
    matrix = np.zeros((classes.size, classes.size), np.int64)
    np.add.at(matrix, (true, pred), 1)
    return matrix


def f1_macro(predictions: Sequence[int], labels: Sequence[int]) -> float:
    matrix = _confusion(predictions, labels)
    if matrix.size == 0:
        return 0.0
    tp = np.diag(matrix).astype(np.float64)
    denominator = matrix.sum(0) + matrix.sum(1)  # 2TP + FP + FN
    f1 = np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)
    return float(f1.mean())


def f1_binary(predictions: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the `positive` class: 2TP / (2TP + FP + FN); 0 when it is neither predicted nor present."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    tp = float(np.sum((predictions == positive) & (labels == positive)))
    denominator = float(np.sum(predictions == positive) + np.sum(labels == positive))
    return 2 * tp / denominator if denominator else 0.0


def mcc(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation in its multi-class form (Gorodkin's R_K); 0 when either side has a single class."""
    matrix = _confusion(predictions, labels).astype(np.float64)
    true, pred = matrix.sum(1), matrix.sum(0)
    correct, total = np.trace(matrix), matrix.sum()
    denominator = np.sqrt((total ** 2 - pred @ pred) * (total ** 2 - true @ true))
    return float((correct * total - true @ pred) / denominator) if denominator > 0 else 0.0


# ---------------------------------------------------------------------------------------------------------------
# Regression.

def mse(predictions: Sequence[float], labels: Sequence[float]) -> float:
    difference = np.asarray(predictions, np.float64) - np.asarray(labels, np.float64)
    return float(np.mean(difference ** 2)) if difference.size else 0.0


def pearson(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Pearson correlation; 0 when either side is constant (undefined there, and no signal either way)."""
    x = np.asarray(predictions, np.float64)
    y = np.asarray(labels, np.float64)
    x, y = x - np.mean(x), y - np.mean(y)  # the means in float64 too: float32 ones lose a small spread
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator > 0 else 0.0


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(values.size, np.float64)
    ranks[order] = np.arange(1, values.size + 1)
    _, groups = np.unique(values, return_inverse=True)
    sums = np.bincount(groups, weights=ranks)
    counts = np.bincount(groups)
    return sums[groups] / counts[groups]


def spearman(predictions: Sequence[float], labels: Sequence[float]) -> float:
    return pearson(average_ranks(predictions), average_ranks(labels))


# ---------------------------------------------------------------------------------------------------------------
# Entities from BIO / IOB2 tags.

def _split_tag(tag: str) -> tuple[str, str]:
    """("B", "PER") for "B-PER"; ("O", "") for "O"; ("B", "_") for an untyped "B" (seqeval's one anonymous type);
    a bare type without a prefix counts as inside it."""
    if tag in ("O", ""):
        return "O", ""
    if tag in ("B", "I", "E", "S"):
        return tag, "_"
    prefix, _, kind = tag.partition("-")
    if prefix in ("B", "I", "E", "S") and kind:
        return prefix, kind
    return "I", tag


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, first, last) of each entity in one sentence's tags.

    An entity starts at a B (or S) tag, or at an I (or E) tag whose type differs from the previous tag's
    (seqeval's lenient chunking), and ends before the next O, B, S or type change.
    """
    found = []
    start, current = -1, ""
    previous = "O"
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, kind = _split_tag(tag)
        ends = current and (prefix in ("O", "B", "S") or kind != current or previous in ("E", "S"))
        if ends:
            found.append((current, start, i - 1))
            current = ""
        starts = prefix != "O" and (prefix in ("B", "S") or not current)
        if starts:
            start, current = i, kind
        previous = prefix
    return found


def entity_scores(predicted: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro-averaged entity precision, recall and F1 over sentences: an entity counts when type and span match."""
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predicted sentences for {len(gold)} gold ones")
    n_pred = n_gold = n_correct = 0
    for pred_tags, gold_tags in zip(predicted, gold):
        if len(pred_tags) != len(gold_tags):
            raise ValueError(f"a sentence has {len(pred_tags)} predicted tags for {len(gold_tags)} words")
        pred_set, gold_set = set(entities(pred_tags)), set(entities(gold_tags))
        n_pred += len(pred_set)
        n_gold += len(gold_set)
        n_correct += len(pred_set & gold_set)
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


# ---------------------------------------------------------------------------------------------------------------
# SQuAD.

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """The official SQuAD normalisation: lowercase, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1(prediction: str, gold: str) -> float:
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:  # SQuAD v2: "no answer" is right only against "no answer"
        return float(pred_tokens == gold_tokens)
    common = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> dict[str, float]:
    """exact_match and f1 (0-100), each the best over a question's gold answers; no gold answer means the
    question is unanswerable and only the empty prediction scores. With both kinds of question (SQuAD v2.0), also
    the official script's breakdown: HasAns_exact / HasAns_f1 over the answerable ones, NoAns_exact / NoAns_f1
    over the others."""
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions for {len(golds)} questions")
    if not predictions:
        return {"exact_match": 0.0, "f1": 0.0}
    exact, f1 = [], []
    for prediction, answers in zip(predictions, golds):
        # As the official SQuAD v2 script: golds that normalise to nothing ("The") are dropped.
        answers = [a for a in answers if normalize_answer(a)] or [""]
        exact.append(max(_exact(prediction, a) for a in answers))
        f1.append(max(_f1(prediction, a) for a in answers))
    scores = {"exact_match": 100.0 * float(np.mean(exact)), "f1": 100.0 * float(np.mean(f1))}
    answerable = np.asarray([bool(answers) for answers in golds])
    if answerable.any() and not answerable.all():
        for name, chosen in (("HasAns", answerable), ("NoAns", ~answerable)):
            scores[f"{name}_exact"] = 100.0 * float(np.mean(np.asarray(exact)[chosen]))
            scores[f"{name}_f1"] = 100.0 * float(np.mean(np.asarray(f1)[chosen]))
    return scores


def squad_best_thresholds(span_texts: Sequence[str], null_score_diffs: Sequence[float],
                          golds: Sequence[Sequence[str]]) -> dict[str, float]:
    """SQuAD v2's best_exact / best_f1 and the null-score-diff threshold reaching each (the official script's
    best_*_thresh, in score units): a question is answered with its best span (`span_texts`) when its null score
    minus that span's (`null_score_diffs`; +inf: no span) is at most the threshold, else with "". Every distinct
    threshold is tried, ties included, so the score reported is one that threshold gives (the official script can
    report a cut between equal scores, which no threshold reaches). Setting data.null_score_diff_threshold to the
    best_f1_thresh of the validation set makes prediction answer as the best_f1 counted."""
    if not (len(span_texts) == len(null_score_diffs) == len(golds)):
        raise ValueError(f"{len(span_texts)} spans, {len(null_score_diffs)} scores and {len(golds)} questions")
    if not golds:
        return {}
    diffs = np.asarray(null_score_diffs, np.float64)
    answered, empty = [], []  # per question: (exact, f1) answering its span, then answering ""
    for text, answers in zip(span_texts, golds):
        answers = [a for a in answers if normalize_answer(a)] or [""]
        answered.append((max(_exact(text, a) for a in answers), max(_f1(text, a) for a in answers)))
        empty.append((max(_exact("", a) for a in answers), max(_f1("", a) for a in answers)))
    gain = np.asarray(answered) - np.asarray(empty)  # what answering instead of "" changes, per question
    order = np.argsort(diffs, kind="stable")
    cuts = np.unique(diffs[np.isfinite(diffs)])
    # Answering every question whose diff is <= cut: the gains of the sorted prefix up to the last such question.
    ends = np.searchsorted(diffs[order], cuts, side="right")
    prefix = np.concatenate([np.zeros((1, 2)), np.cumsum(gain[order], axis=0)])
    totals = np.sum(empty, axis=0) + prefix[np.concatenate([[0], ends])]  # [1 + cuts, 2]: nothing answered first
    # Answering nothing needs a threshold below every diff: one less than the lowest (0 when there is none).
    thresholds = np.concatenate([[cuts[0] - 1.0 if len(cuts) else 0.0], cuts])
    scores = {}
    for column, name in enumerate(("exact", "f1")):
        best = int(np.argmax(totals[:, column]))  # the first best: the lowest such threshold
        scores[f"best_{name}"] = 100.0 * float(totals[best, column]) / len(golds)
        scores[f"best_{name}_thresh"] = float(thresholds[best])
    return scores


# ---------------------------------------------------------------------------------------------------------------
# Per task.

def classification_scores(predictions: Sequence[int], labels: Sequence[int],
                          num_labels: int | None = None) -> dict[str, float]:
    scores = {"accuracy": accuracy(predictions, labels), "f1_macro": f1_macro(predictions, labels),
              "mcc": mcc(predictions, labels)}
    if num_labels == 2:
        scores["f1"] = f1_binary(predictions, labels)
    return scores


def regression_scores(predictions: Sequence[float], labels: Sequence[float]) -> dict[str, float]:
    return {"pearson": pearson(predictions, labels), "spearman": spearman(predictions, labels),
            "mse": mse(predictions, labels)}
