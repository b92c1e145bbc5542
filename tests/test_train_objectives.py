"""Losses against numpy references, and the analytic FLOP count against XLA's own count of the compiled step."""

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.config import get_config
from bertjax.models import MODEL_CLASSES
from bertjax.train import flops, objectives


def _numpy_cross_entropy(logits, labels):
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]


def test_mlm_loss_counts_only_real_predictions():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32)
    labels = rng.integers(0, 11, (3, 5)).astype(np.int32)
    weights = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    loss, weight, correct = objectives.mlm_sums(jnp.asarray(logits), labels, weights)
    ce = _numpy_cross_entropy(logits, labels)
    np.testing.assert_allclose(float(loss), (ce * weights).sum(), rtol=1e-6)
    assert float(weight) == 9.0
    assert float(correct) == float(((logits.argmax(-1) == labels) * weights).sum())


def test_nsp_ignores_padding_rows_and_totals_add_up():
    rng = np.random.default_rng(1)
    nsp_logits = rng.normal(size=(4, 2)).astype(np.float32)
    labels = np.array([0, 1, -1, 1], np.int32)  # -1: a padding row of an evaluation batch
    loss, count, _ = objectives.nsp_sums(jnp.asarray(nsp_logits), labels)
    keep = labels >= 0
    np.testing.assert_allclose(float(loss), _numpy_cross_entropy(nsp_logits[keep], labels[keep]).sum(), rtol=1e-6)
    assert float(count) == 3.0
    norm = objectives.normalisers({"masked_weights": np.ones((4, 2), np.float32), "nsp_labels": labels}, True)
    assert float(norm.mlm_weight) == 8.0 and float(norm.nsp_count) == 3.0


def test_microbatch_sums_divided_by_whole_batch_counts_equal_the_whole_batch_loss():
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(size=(4, 3, 7)).astype(np.float32))
    labels = rng.integers(0, 7, (4, 3)).astype(np.int32)
    weights = (rng.random((4, 3)) < 0.7).astype(np.float32)
    whole = objectives.mlm_sums(logits, labels, weights)
    halves = [objectives.mlm_sums(logits[i::2], labels[i::2], weights[i::2]) for i in range(2)]
    np.testing.assert_allclose(float(halves[0][0] + halves[1][0]) / float(whole[1]), float(whole[0] / whole[1]),
                               rtol=1e-6)


def test_analytic_flops_match_xla_cost_analysis():
    # A global-attention model (XLA computes every score then, as the analytic count assumes).
    config = get_config("bert-base", hidden_size=256, num_layers=2, num_heads=4, intermediate_size=1024,
                        vocab_size=1000, dropout_rate=0.0)
    model = MODEL_CLASSES["masked_lm"](config)
    batch, seq, predictions = 4, 128, 20
    ids = jnp.zeros((batch, seq), jnp.int32)
    positions = jnp.zeros((batch, predictions), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids))["params"]
    grad = jax.jit(jax.grad(lambda p: model.apply({"params": p}, ids, masked_positions=positions).logits.sum()))
    cost = grad.lower(params).compile().cost_analysis()
    xla_flops = (cost[0] if isinstance(cost, list) else cost)["flops"]
    ours = flops.train_flops(config, seq_len=seq, tokens=batch * seq, predictions=batch * predictions,
                             rows=batch, with_nsp=False)
    # XLA also counts elementwise work (softmax, GELU, norms), a few percent here.
    assert 0.97 < xla_flops / ours < 1.10, (xla_flops, ours)


def test_local_layers_count_their_window_and_padding_is_not_work():
    config = get_config("modernbert-base")
    global_layer = 4 * config.num_heads * config.head_dim * 1024
    local_layer = 4 * config.num_heads * config.head_dim * 129  # |i - j| <= 64
    dense = get_config("modernbert-base", global_attention_every=1)
    saved = flops.forward_flops_per_token(dense, 1024) - flops.forward_flops_per_token(config, 1024)
    local_layers = sum(not config.is_global_layer(i) for i in range(config.num_layers))
    assert saved == local_layers * (global_layer - local_layer)
    full = flops.train_flops(config, seq_len=1024, tokens=1024, predictions=300, rows=1, with_nsp=False)
    half = flops.train_flops(config, seq_len=1024, tokens=512, predictions=300, rows=1, with_nsp=False)
    assert half < full and np.isclose(full - half, 3 * 512 * flops.forward_flops_per_token(config, 1024))
