"""The in-batch-negatives loss against numpy and sentence-transformers, its mesh version on 8 fake devices against
one device, and GradCache gradients against uncached ones."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.embeddings.contrastive import (cached_loss_and_grads, multiple_negatives_ranking_loss,
                                            uncached_loss_and_grads)
from train_helpers import REPO, cpu_env


def numpy_mnrl(a, p, n=None, scale=20.0, symmetric=False, similarity="cosine"):
    """float64 reference: cross-entropy of scale * cos(anchor, [positives; negatives]) with target = own positive."""
    a, p = np.asarray(a, np.float64), np.asarray(p, np.float64)
    rows = [p] if n is None else [p, np.asarray(n, np.float64).reshape(-1, a.shape[1])]
    c = np.concatenate(rows)
    if similarity == "cosine":
        unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
        a, p, c = unit(a), unit(p), unit(c)

    def ce(scores):
        top = scores.max(axis=1, keepdims=True)
        log_z = np.log(np.exp(scores - top).sum(axis=1)) + top[:, 0]
        return np.mean(log_z - scores[np.arange(len(scores)), np.arange(len(scores))])

    forward = ce(scale * a @ c.T)
    if not symmetric:
        return forward
    return (forward + ce(scale * p @ a.T)) / 2


@pytest.fixture(scope="module")
def embeddings():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 8)).astype(np.float32)
    p = (a + 0.5 * rng.normal(size=(6, 8))).astype(np.float32)
    n = rng.normal(size=(6, 8)).astype(np.float32)
    return a, p, n


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("hard_negatives", [False, True])
def test_loss_equals_numpy(embeddings, symmetric, hard_negatives):
    a, p, n = embeddings
    n = n if hard_negatives else None
    got = multiple_negatives_ranking_loss(a, p, n, scale=20.0, symmetric=symmetric)
    np.testing.assert_allclose(float(got), numpy_mnrl(a, p, n, 20.0, symmetric), rtol=1e-5, atol=1e-5)


def test_loss_dot_similarity_and_several_negatives(embeddings):
    a, p, n = embeddings
    several = np.stack([n, n[::-1]], axis=1)  # [batch, 2, dim]
    got = multiple_negatives_ranking_loss(a, p, several, scale=0.5, similarity="dot")
    np.testing.assert_allclose(float(got), numpy_mnrl(a, p, several, 0.5, similarity="dot"), rtol=1e-5, atol=1e-5)


def test_loss_equals_sentence_transformers(embeddings):
    torch = pytest.importorskip("torch")
    losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    a, p, n = embeddings
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x))  # noqa: E731
    mnrl = losses.MultipleNegativesRankingLoss(None, scale=20.0)
    symmetric = losses.MultipleNegativesRankingLoss(None, scale=20.0, directions=("query_to_doc", "doc_to_query"),
                                                    partition_mode="per_direction")
    checks = [(mnrl.compute_loss_from_embeddings([t(a), t(p)], None), multiple_negatives_ranking_loss(a, p)),
              (mnrl.compute_loss_from_embeddings([t(a), t(p), t(n)], None), multiple_negatives_ranking_loss(a, p, n)),
              # an n-tuple (anchor, positive, negative_1, negative_2), as train-embedder reads one
              (mnrl.compute_loss_from_embeddings([t(a), t(p), t(n), t(n[::-1])], None),
               multiple_negatives_ranking_loss(a, p, np.stack([n, n[::-1]], axis=1))),
              (symmetric.compute_loss_from_embeddings([t(a), t(p)], None),
               multiple_negatives_ranking_loss(a, p, symmetric=True))]
    for reference, got in checks:
        np.testing.assert_allclose(float(got), float(reference), rtol=1e-5, atol=1e-5)


def test_loss_rejects_mismatched_shapes(embeddings):
    a, p, n = embeddings
    with pytest.raises(ValueError, match="anchors and positives"):
        multiple_negatives_ranking_loss(a, p[:4])
    with pytest.raises(ValueError, match="negatives must be"):
        multiple_negatives_ranking_loss(a, p, n[:3])
    with pytest.raises(ValueError, match="similarity"):
        multiple_negatives_ranking_loss(a, p, similarity="l2")


def test_mesh_loss_on_8_devices_equals_one_device():
    """Subprocess: 8 fake CPU devices need XLA flags before JAX starts."""
    run = subprocess.run([sys.executable, str(REPO / "tests" / "embedder_sharding_script.py")], env=cpu_env(devices=8),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert results["devices"] == 8
    for case in results["cases"]:
        name = case["name"]
        # Loss: equal to the one-device loss (and numpy) to float32 rounding.
        np.testing.assert_allclose(case["mesh_loss"], case["one_device_loss"], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(case["one_device_loss"], case["numpy_loss"], rtol=1e-5, atol=1e-6, err_msg=name)
        assert case["max_grad_difference"] <= 1e-5, name
    # train-embedder's own step (GradCache, symmetric, hard negatives) on 8 devices equals it on one.
    step = results["train_step"]
    np.testing.assert_allclose(step["mesh_loss"], step["one_device_loss"], rtol=1e-5, atol=1e-6)
    # SGD with learning rate 1: the parameter difference is the gradient difference (measured 3.8e-6; float32
    # sums in another order over 8 devices).
    assert step["max_param_difference"] <= 2e-5, step


# ---------------------------------------------------------------------------------------------------------------
# GradCache on a real (tiny) encoder.

@pytest.fixture(scope="module")
def tiny_encoder():
    import bertjax
    from bertjax.embeddings import EncoderForEmbedding, PoolingConfig
    from bertjax.models import init_params

    config = bertjax.get_config("bert-tiny", vocab_size=40, dropout_rate=0.1, hidden_size=16, num_layers=1,
                                num_heads=2, intermediate_size=24)
    model = EncoderForEmbedding(config, pooling=PoolingConfig(modes=("mean",)))
    params = jax.jit(lambda key: init_params(model, key))(jax.random.key(0))  # one compile, not op by op
    rng = np.random.default_rng(1)
    lengths = rng.integers(3, 8, size=(8, 3))
    ids = rng.integers(5, 40, size=(8, 3, 8)).astype(np.int32)
    segments = (np.arange(8)[None, None, :] < lengths[..., None]).astype(np.int32)
    return model, params, {"input_ids": jnp.asarray(ids * segments), "segment_ids": jnp.asarray(segments)}


def _embed_fn(model, deterministic):
    def embed(params, rows, key):
        ids, segments = rows["input_ids"], rows["segment_ids"]  # [n, columns, seq]
        n, columns, seq = ids.shape
        out = model.apply({"params": params}, ids.reshape(n * columns, seq), segments.reshape(n * columns, seq), 1,
                          deterministic=deterministic, rngs=None if deterministic else {"dropout": key})
        return out.reshape(n, columns, -1)
    return embed


def _loss_of(symmetric):
    return lambda e: multiple_negatives_ranking_loss(e[:, 0], e[:, 1], e[:, 2], symmetric=symmetric)


def test_gradcache_gradients_equal_uncached(tiny_encoder):
    model, params, rows = tiny_encoder
    symmetric = True  # the loss with every term: both directions and hard negatives
    embed = _embed_fn(model, deterministic=True)
    key = jax.random.key(3)
    loss, grads = jax.jit(lambda p: uncached_loss_and_grads(embed, _loss_of(symmetric), p, rows, key))(params)
    cached = jax.jit(lambda p: cached_loss_and_grads(embed, _loss_of(symmetric), p, rows, key, chunks=4))
    cached_loss, cached_grads = cached(params)
    np.testing.assert_allclose(float(cached_loss), float(loss), rtol=1e-6, atol=1e-6)
    differences = jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), cached_grads, grads)
    assert max(jax.tree.leaves(differences)) <= 1e-5, differences
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) > 1e-3  # gradients that say something


def test_gradcache_replays_dropout(tiny_encoder):
    """With dropout on, each chunk's second forward pass draws the masks of its first: the gradient equals that of
    differentiating through the first pass directly (chunk by chunk, same keys)."""
    model, params, rows = tiny_encoder
    embed = _embed_fn(model, deterministic=False)
    key = jax.random.key(5)
    chunks = 2
    loss_of = _loss_of(False)

    def direct(p):  # the same per-chunk keys, differentiated end to end
        from bertjax.embeddings.contrastive import merge_chunks, split_chunks
        micro = split_chunks(rows, chunks)
        pieces = [embed(p, jax.tree.map(lambda x: x[c], micro), jax.random.fold_in(key, c)) for c in range(chunks)]
        return loss_of(merge_chunks(jnp.stack(pieces)))

    loss, grads = jax.jit(jax.value_and_grad(direct))(params)
    cached_loss, cached_grads = jax.jit(lambda p: cached_loss_and_grads(embed, loss_of, p, rows, key, chunks))(params)
    np.testing.assert_allclose(float(cached_loss), float(loss), rtol=1e-6)
    assert max(jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), cached_grads, grads))) <= 1e-5


def test_gradcache_memory_is_that_of_one_chunk():
    """XLA's accounting of the compiled steps (bench/embedder_memory.py at test size): a cached batch of 256 pairs
    in chunks of 16 needs about the temporaries of an uncached batch of 16, far less than an uncached 256."""
    from bench.embedder_memory import step_memory

    small, large, cached = (r["temp_mib"] for r in step_memory("bert-tiny", seq=32, batch=256, chunk=16))
    assert cached <= 1.5 * small, (small, cached)
    assert large >= 5 * cached, (large, cached)


def test_a_zero_embedding_keeps_the_gradient_finite():
    """unit_rows divided by max(norm, 1e-12): the norm's gradient at a zero row is NaN, so one zero embedding (a ReLU
    Dense layer's, say) made every parameter's gradient NaN; sentence-transformers' stays finite. The loss is the
    same either way."""
    rng = np.random.default_rng(0)
    anchors, positives = (jnp.asarray(rng.normal(size=(4, 8)), jnp.float32) for _ in range(2))
    anchors = anchors.at[1].set(0.0)
    loss, grads = jax.value_and_grad(multiple_negatives_ranking_loss, argnums=(0, 1))(anchors, positives)
    assert np.isfinite(float(loss)) and all(np.isfinite(np.asarray(g)).all() for g in grads)
    # Row 1 scores 0 against every positive: its term is log(4).
    unit = positives / jnp.linalg.norm(positives, axis=1, keepdims=True)
    others = np.array([0, 2, 3])
    scores = 20.0 * (anchors[others] / jnp.linalg.norm(anchors[others], axis=1, keepdims=True)) @ unit.T
    terms = jax.nn.logsumexp(scores, axis=1) - scores[jnp.arange(3), jnp.asarray(others)]
    np.testing.assert_allclose(float(loss), float((jnp.sum(terms) + np.log(4)) / 4), rtol=1e-6)
