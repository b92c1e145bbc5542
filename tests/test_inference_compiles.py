"""A service calls the inference layer many times with varying inputs: compiled programs are reused across calls,
predictors and settings that do not change the shapes (audit: serving). Counted with `jax_log_compiles`."""

from __future__ import annotations

import logging

import jax
import numpy as np
import pytest

from bertjax.config import TaskConfig as HeadConfig
from bertjax.config import get_config
from test_inference import IdTokenizer, padded_examples, random_params


@pytest.fixture
def compiles():
    """A function returning how many XLA compilations happened since the fixture started."""
    messages = []

    class Counter(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler, logger = Counter(), logging.getLogger("jax")
    logger.addHandler(handler)
    jax.config.update("jax_log_compiles", True)
    try:
        yield lambda: sum(message.startswith("Compiling ") for message in messages)
    finally:
        jax.config.update("jax_log_compiles", False)
        logger.removeHandler(handler)


def test_predict_outputs_compiles_once_for_repeated_calls(compiles):
    """The task's row function was a new closure per call: every call compiled its programs again."""
    from bertjax.finetune.config import FinetuneDataConfig, FinetuneTaskConfig
    from bertjax.finetune.inference import predict_outputs
    from bertjax.finetune.tasks import Encoded, task_class
    from bertjax.models import MODEL_CLASSES

    config = get_config("bert-tiny", max_position_embeddings=64, pad_token_id=0, task=HeadConfig(num_labels=3))
    lengths = (3, 17, 5, 9)
    arrays = padded_examples(config, lengths, 32)
    encoded = Encoded(arrays, examples=[None] * len(lengths))
    for name in ("sequence-classification", "question-answering"):
        task = task_class(name)(FinetuneDataConfig(), FinetuneTaskConfig())
        model = MODEL_CLASSES[task.head](config)
        params = random_params(model)
        first = predict_outputs(model, params, task, encoded, IdTokenizer, max_tokens=128)
        before = compiles()
        again = predict_outputs(model, params, task_class(name)(FinetuneDataConfig(), FinetuneTaskConfig()),
                                encoded, IdTokenizer, max_tokens=128)
        assert compiles() == before, name
        for key in first:
            np.testing.assert_array_equal(first[key], again[key])


def test_fill_mask_top_k_values_and_new_predictors_share_programs(compiles):
    """Each top_k compiled a set of programs (a service taking top_k from requests compiled forever), and so did
    each new predictor of the same model."""
    import bertjax
    from bertjax.data import load_tokenizer
    from bertjax.inference.fill_mask import make_predictor
    from train_helpers import small_tokenizer

    tokenizer = load_tokenizer(small_tokenizer())
    config = get_config("bert-tiny", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    model = bertjax.EncoderForMaskedLM(config)
    params = random_params(model, seed=2)
    texts = ["The [MASK] statement ends a loop.", "[MASK]"]
    predictor = make_predictor(model, params, tokenizer)
    reference = predictor.many(texts, 8)
    before = compiles()
    for top_k in (1, 2, 3, 5, 7, 8):
        got = predictor.many(texts, top_k)
        assert [[options[:top_k] for options in text] for text in reference] == \
            [[options for options in text] for text in got]
    assert make_predictor(model, params, tokenizer).many(texts, 4) == [[o[:4] for o in t] for t in reference]
    assert predictor.many([], 3) == []  # an empty request, as Embedder.embed([])
    assert compiles() == before


def test_search_compiles_per_power_of_two_of_queries(compiles):
    from bertjax.embeddings.search import top_k_search

    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(100, 8)).astype(np.float32)
    queries = rng.normal(size=(8, 8)).astype(np.float32)
    scores, indices = top_k_search(queries[:5], corpus, 3)
    before = compiles()
    for count in (6, 7, 8, 5):  # all padded to 8 rows
        got_scores, got_indices = top_k_search(queries[:count], corpus, 3)
        assert got_scores.shape == (count, 3)
        np.testing.assert_array_equal(got_indices[:5], indices)
    assert compiles() == before
    # Each k runs the program of its power of two (3 and 4 share one); the first k of them are the top k.
    corpus[50:60] = corpus[40]  # ties, ranked by index
    for k in (4, 2, 1):
        top_k_search(queries, corpus, k)
    before = compiles()
    wide_scores, wide = top_k_search(queries, corpus, 4)
    assert compiles() == before
    for k in (3, 4):
        scores, indices = top_k_search(queries, corpus, k)
        np.testing.assert_array_equal(indices, wide[:, :k])
        np.testing.assert_array_equal(scores, wide_scores[:, :k])
    assert compiles() == before


def test_a_token_budget_below_the_packing_length_is_kept():
    """max_tokens 128 packed short texts into 512-token rows (one row over the budget four times)."""
    from bertjax.inference import BucketConfig
    from bertjax.inference.buckets import plan_buckets

    plan = plan_buckets(BucketConfig(max_tokens=128), model_max_length=512)
    assert plan.pack_length <= 128
    assert all(plan.rows[length] * length <= 128 for length in plan.lengths if length <= 128)
    assert plan_buckets(BucketConfig(), model_max_length=512).pack_length == 512
