"""The embedder's validation metrics (recall@k, MRR@k): ranks known by construction, the k cutoff, ties (counted
against the answer), the query chunks, and sentence-transformers' InformationRetrievalEvaluator on the same vectors."""

import numpy as np
import pytest

from bertjax.embeddings.retrieval_metrics import pair_corpus, retrieval_metrics

# Corpus row j is the unit vector e_j, so a query's dot score with row j is its j-th coordinate: each query below
# spells out its scores over the 6 corpus rows.
CORPUS = np.eye(6, dtype=np.float32)
QUERIES = np.array([[5, 4, 3, 2, 1, 0],   # gold 0: rank 1
                    [5, 4, 3, 2, 1, 0],   # gold 2: rank 3 = k, found
                    [5, 4, 3, 2, 1, 0],   # gold 3: rank 4 = k + 1, missed
                    [4, 4, 3, 2, 1, 0],   # gold 1: tied with row 0 at the top, rank 2 (a tie counts against it)
                    [5, 4, 3, 3, 3, 0]],  # gold 4: tied with rows 2 and 3, rank 5, missed
                   np.float32)
GOLD = np.array([0, 2, 3, 1, 4])


def test_recall_and_mrr_at_k_by_hand_and_over_query_chunks():
    """recall@k counts an answer at rank k and not one at rank k + 1; MRR@k adds 1 / rank for each answer found.
    The queries are scored in chunks (1024 at a time in `bertjax train-embedder`), and every chunk must use its
    own queries' answers: chunks of 1, 2 or 3 queries give the same metrics as one chunk."""
    metrics = retrieval_metrics(QUERIES, CORPUS, GOLD, k=3, similarity="dot")
    assert metrics == pytest.approx({"recall@3": 3 / 5, "mrr@3": (1 + 1 / 3 + 0 + 1 / 2 + 0) / 5})
    at_4 = retrieval_metrics(QUERIES, CORPUS, GOLD, k=4, similarity="dot")
    assert at_4 == pytest.approx({"recall@4": 4 / 5, "mrr@4": (1 + 1 / 3 + 1 / 4 + 1 / 2 + 0) / 5})
    at_1 = retrieval_metrics(QUERIES, CORPUS, GOLD, k=1, similarity="dot")
    assert at_1 == pytest.approx({"recall@1": 1 / 5, "mrr@1": 1 / 5})
    for chunk in (1, 2, 3):
        assert retrieval_metrics(QUERIES, CORPUS, GOLD, k=3, similarity="dot", chunk=chunk) == metrics, chunk
    # Cosine ranks the same (one corpus row per axis, any query norm).
    assert retrieval_metrics(QUERIES, CORPUS, GOLD, k=3, chunk=2) == pytest.approx(metrics)
    texts, gold = pair_corpus(["a", "b", "a", "c"], negatives=["d", "b"])
    assert texts == ["a", "b", "c", "d"] and gold.tolist() == [0, 1, 0, 2]


def test_a_collapsed_or_nan_model_scores_as_badly_as_it_retrieves():
    """Ties counted in the answer's favour gave a model mapping every text to one vector (or texts cut to the same
    tokens) recall@1 = MRR@1 = 1.0, and NaN embeddings the same (every comparison with NaN is False)."""
    gold = np.arange(20)
    collapsed = np.ones((20, 4), np.float32)
    assert retrieval_metrics(collapsed, collapsed, gold, k=1) == {"recall@1": 0.0, "mrr@1": 0.0}
    at_20 = retrieval_metrics(collapsed, collapsed, gold, k=20)
    assert at_20 == pytest.approx({"recall@20": 1.0, "mrr@20": 1 / 20})
    nan = np.full((20, 4), np.nan, np.float32)
    assert retrieval_metrics(nan, nan, gold, k=20) == {"recall@20": 0.0, "mrr@20": 0.0}


def test_metrics_equal_sentence_transformers_information_retrieval_evaluator():
    """On random (tie-free) vectors, scored in chunks, the metrics equal InformationRetrievalEvaluator's
    accuracy@k (recall with one relevant text per query) and mrr@k for the same embeddings."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("sentence_transformers")
    try:
        from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
    except ImportError:  # sentence-transformers before 6
        from sentence_transformers.evaluation import InformationRetrievalEvaluator
    from sentence_transformers.util import cos_sim

    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(30, 8)).astype(np.float32)
    gold = rng.integers(0, 30, 23)
    queries = (corpus[gold] + 1.5 * rng.normal(size=(23, 8))).astype(np.float32)  # some answers found, some not

    class Precomputed:  # the evaluator embeds the queries through the model; the corpus is passed in
        def encode_query(self, sentences, **_):
            return torch.from_numpy(queries)

    ks = [1, 3, 10]
    evaluator = InformationRetrievalEvaluator(
        queries={f"q{i}": f"q{i}" for i in range(23)}, corpus={f"c{j:02d}": f"c{j:02d}" for j in range(30)},
        relevant_docs={f"q{i}": {f"c{g:02d}"} for i, g in enumerate(gold)}, mrr_at_k=ks, accuracy_at_k=ks,
        ndcg_at_k=ks, precision_recall_at_k=ks, map_at_k=ks, score_functions={"cosine": cos_sim}, write_csv=False)
    expected = evaluator.compute_metrices(Precomputed(), corpus_embeddings=torch.from_numpy(corpus))["cosine"]
    assert 0 < expected["accuracy@k"][3] < 1
    for k in ks:
        got = retrieval_metrics(queries, corpus, gold, k=k, chunk=4)
        assert got == pytest.approx({f"recall@{k}": expected["accuracy@k"][k], f"mrr@{k}": expected["mrr@k"][k]},
                                    abs=1e-12), k
