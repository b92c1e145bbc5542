"""Fine-tuning metrics against hand-computed values and, where installed, independent references: scikit-learn
(accuracy, macro F1, MCC, binary F1), scipy (Pearson, Spearman), seqeval (entity precision, recall, F1)."""

import numpy as np
import pytest

from bertjax.finetune import metrics as m


def test_classification_by_hand():
    labels = [0, 0, 1, 1, 2, 2]
    preds = [0, 1, 1, 1, 2, 0]
    assert m.accuracy(preds, labels) == pytest.approx(4 / 6)
    # class 0: tp 1 fp 1 fn 1 -> 0.5; class 1: tp 2 fp 1 fn 0 -> 0.8; class 2: tp 1 fp 0 fn 1 -> 2/3
    assert m.f1_macro(preds, labels) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    # binary MCC = (tp*tn - fp*fn) / sqrt(...) with tp=2 tn=1 fp=1 fn=1 (positive class 1)
    binary_labels, binary_preds = [1, 1, 1, 0, 0], [1, 1, 0, 1, 0]
    expected = (2 * 1 - 1 * 1) / np.sqrt(3 * 3 * 2 * 2)
    assert m.mcc(binary_preds, binary_labels) == pytest.approx(expected)
    # positive-class F1 = 2*2 / (2*2 + 1 + 1); the negative class would give 2*1 / (2*1 + 1 + 1)
    assert m.f1_binary(binary_preds, binary_labels) == pytest.approx(4 / 6)
    assert m.f1_binary(binary_preds, binary_labels, positive=0) == pytest.approx(2 / 4)
    assert m.f1_binary([0, 0], [0, 0]) == 0.0
    assert "f1" in m.classification_scores(binary_preds, binary_labels, 2)
    assert "f1" not in m.classification_scores(preds, labels, 3)


def test_binary_f1_against_scikit_learn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    labels, preds = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    assert m.f1_binary(preds, labels) == pytest.approx(sklearn_metrics.f1_score(labels, preds))


def test_classification_against_scikit_learn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 4, 300)
    preds = np.where(rng.random(300) < 0.6, labels, rng.integers(0, 5, 300))  # class 4 only ever predicted
    assert m.accuracy(preds, labels) == pytest.approx(sklearn_metrics.accuracy_score(labels, preds))
    assert m.f1_macro(preds, labels) == pytest.approx(sklearn_metrics.f1_score(labels, preds, average="macro"))
    assert m.mcc(preds, labels) == pytest.approx(sklearn_metrics.matthews_corrcoef(labels, preds))


def test_mcc_multiclass_and_degenerate():
    labels = [0, 1, 2, 0, 1, 2, 0]
    assert m.mcc(labels, labels) == pytest.approx(1.0)
    assert m.mcc([0] * 7, labels) == 0.0  # one predicted class: undefined, reported 0 (as scikit-learn)
    # Multi-class formula by hand on a 3x3 confusion matrix.
    preds = [0, 2, 2, 0, 1, 1, 1]
    c = np.zeros((3, 3))
    for t, p in zip(labels, preds):
        c[t, p] += 1
    t_k, p_k, s = c.sum(1), c.sum(0), c.sum()
    expected = (np.trace(c) * s - t_k @ p_k) / np.sqrt((s ** 2 - p_k @ p_k) * (s ** 2 - t_k @ t_k))
    assert m.mcc(preds, labels) == pytest.approx(expected)


def test_regression_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    y = x + rng.normal(size=50)
    y[:5] = y[5]  # ties for spearman
    assert m.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert m.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
    assert m.mse([1.0, 2.0], [0.0, 4.0]) == pytest.approx(2.5)
    assert m.pearson([1, 1, 1], [1, 2, 3]) == 0.0


def test_entities_seqeval_chunking():
    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-ORG", "B-MISC"]
    assert m.entities(tags) == [("PER", 0, 1), ("LOC", 3, 4), ("LOC", 5, 5), ("ORG", 6, 6), ("MISC", 7, 7)]
    assert m.entities(["O", "O"]) == []
    assert m.entities(["B-X", "B-X", "I-X"]) == [("X", 0, 0), ("X", 1, 2)]


def test_entity_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-LOC"]]
    scores = m.entity_scores(pred, gold)
    # gold entities 3, predicted 4, correct 2 (PER 0-1, ORG 0-0)
    assert scores["precision"] == pytest.approx(2 / 4)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))


def test_entity_scores_against_seqeval():
    """Random BIO / IOB2 sequences, stray I- tags and type changes included, scored as seqeval's default mode."""
    seqeval = pytest.importorskip("seqeval.metrics")
    from seqeval.metrics.sequence_labeling import get_entities
    rng = np.random.default_rng(3)
    tags = np.array(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
    gold = [list(tags[rng.integers(0, 5, rng.integers(1, 12))]) for _ in range(200)]
    pred = [[t if rng.random() < 0.7 else str(rng.choice(tags)) for t in sentence] for sentence in gold]
    ours = m.entity_scores(pred, gold)
    assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, pred))
    assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, pred))
    assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, pred))
    for sentence in gold[:50]:
        assert m.entities(sentence) == get_entities(sentence)
    # Untyped tags (B/I/O without a type) are one anonymous type, seqeval's "_".
    gold, pred = [["B", "I", "I", "O", "B", "O"], ["O", "B", "I", "O"]], [["B", "I", "I", "O", "B", "O"],
                                                                          ["O", "B", "O", "O"]]
    ours = m.entity_scores(pred, gold)
    assert (ours["precision"], ours["recall"], ours["f1"]) == pytest.approx(
        (seqeval.precision_score(gold, pred), seqeval.recall_score(gold, pred), seqeval.f1_score(gold, pred)))
    assert m.entities(gold[0]) == get_entities(gold[0])


def test_squad_normalisation_and_scores():
    assert m.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert m.normalize_answer("an apple and a pear") == "apple and pear"
    scores = m.squad_scores(["the Eiffel Tower", "in Paris France", ""],
                            [["Eiffel Tower", "tower"], ["Paris"], []])
    # q1: exact; q2: f1 = 2*(1/3)*1/(1/3+1) = 0.5; q3: unanswerable, empty prediction right
    assert scores["exact_match"] == pytest.approx(100 * 2 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 0.5 + 1) / 3)
    # SQuAD v2.0's breakdown, as its official script reports it: answerable questions, then unanswerable ones.
    assert (scores["HasAns_exact"], scores["HasAns_f1"], scores["NoAns_exact"], scores["NoAns_f1"]) == \
        pytest.approx((50.0, 75.0, 100.0, 100.0))
    assert "HasAns_f1" not in m.squad_scores(["x"], [["x"]])  # v1.1: every question has an answer
    assert m.squad_scores(["x"], [[]])["f1"] == 0.0
    # As the official v2 script: a gold that normalises to nothing is dropped, not matched by an empty answer.
    assert m.squad_scores([""], [["The", "Paris"]]) == {"exact_match": 0.0, "f1": 0.0}
    assert m.squad_scores([""], [["The"]]) == {"exact_match": 100.0, "f1": 100.0}  # only it: unanswerable


def test_squad_best_thresholds_by_hand_and_against_every_threshold():
    # q1 answerable, its span right (diff -2); q2 unanswerable, a span offered (diff 1); q3 answerable, its span half
    # right (diff 3). Below -2 nothing is answered: only q2 scores (1/3). At -2 q1 scores too (2/3); at 1 q2 is lost
    # (1/3); at 3 q3 adds f1 0.5 (f1 1.5/3, exact 1/3). Both best at -2: 2/3.
    texts, diffs, golds = ["Paris", "a cat", "Eiffel"], [-2.0, 1.0, 3.0], [["Paris"], [], ["Eiffel Tower"]]
    scores = m.squad_best_thresholds(texts, diffs, golds)
    assert scores == pytest.approx({"best_exact": 100 * 2 / 3, "best_exact_thresh": -2.0,
                                    "best_f1": 100 * 2 / 3, "best_f1_thresh": -2.0})
    assert m.squad_best_thresholds(["x"], [0.5], [[]])["best_f1_thresh"] == -0.5  # answer nothing: below all

    # Against answering at every threshold (each diff, and below them all) with squad_scores, ties included.
    rng = np.random.default_rng(0)
    words = ["paris", "tower", "the cat", "blue sky", "x"]
    for _ in range(20):
        n = int(rng.integers(1, 12))
        texts = [str(rng.choice(words)) for _ in range(n)]
        golds = [[] if rng.random() < 0.4 else [str(rng.choice(words))] for _ in range(n)]
        diffs = [float(v) for v in rng.integers(-3, 3, n)]  # integers: ties are common
        diffs = [np.inf if rng.random() < 0.1 else d for d in diffs]  # no span at all: never answered
        got = m.squad_best_thresholds(texts, diffs, golds)
        finite = sorted({d for d in diffs if np.isfinite(d)})
        for name, key in (("exact", "exact_match"), ("f1", "f1")):
            by_threshold = {}
            for t in [min(finite, default=1.0) - 1.0] + finite:
                answered = [text if d <= t else "" for text, d in zip(texts, diffs)]
                by_threshold.setdefault(m.squad_scores(answered, golds)[key], t)  # the lowest reaching it
            best = max(by_threshold)
            assert got[f"best_{name}"] == pytest.approx(best)
            assert got[f"best_{name}_thresh"] == by_threshold[best]
