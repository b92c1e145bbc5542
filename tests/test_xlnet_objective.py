"""XLNet's permutation language model: the factorisation orders (checked against their definition with numpy),
the objective's loss through the query stream, and a tiny run whose held-out loss falls. The sharded step on 8 fake
devices equal to one device: tests/test_train_sharding.py, in its shared subprocess."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.train.objectives.permutation import sample_permutation, span_targets

RATIO, MAX_SPAN = 6, 5


def packed_segments(batch: int = 4, seq: int = 48) -> np.ndarray:
    """Rows packing 1-3 documents, some ending in padding."""
    segments = np.zeros((batch, seq), np.int32)
    layouts = [(48,), (20, 28), (10, 15, 13), (30,)]
    for r, lengths in enumerate(layouts[:batch]):
        at = 0
        for k, n in enumerate(lengths):
            segments[r, at:at + n] = k + 1
            at += n
    return segments


def test_every_target_sees_only_its_predecessors_and_non_targets_see_all_non_targets():
    segments = packed_segments()
    num_predict = 12
    plm = jax.jit(sample_permutation, static_argnames=("ratio", "max_span", "num_predict"))(
        jax.random.key(3), jnp.asarray(segments), ratio=RATIO, max_span=MAX_SPAN, num_predict=num_predict)
    perm = np.asarray(plm.perm_mask) > 0
    mapping, weights = np.asarray(plm.target_mapping), np.asarray(plm.target_weights)
    positions = np.asarray(plm.target_positions)
    for b in range(segments.shape[0]):
        target = perm[b].any(axis=0)  # a column is ever hidden exactly when it is a target
        real = segments[b] > 0
        assert not (target & ~real).any()  # padding is never predicted
        # nor the [CLS] and [SEP] at both ends of each document piece (XLNet never predicts functional tokens)
        ends = np.flatnonzero(np.diff(segments[b], prepend=0) != 0)
        ends = np.concatenate([ends, np.flatnonzero(np.diff(segments[b], append=0) != 0)])
        assert not target[ends[segments[b][ends] > 0]].any()
        assert 1 <= target.sum() <= num_predict
        non_targets = np.flatnonzero(~target)
        # Non-targets see every non-target and no target.
        for i in non_targets:
            np.testing.assert_array_equal(perm[b, i], target)
        # Targets: "sees" is a strict total order: the k-th target in the order sees exactly the k before it.
        targets = np.flatnonzero(target)
        visible = {i: set(targets[~perm[b, i, targets]]) for i in targets}
        order = sorted(targets, key=lambda i: len(visible[i]))
        for k, i in enumerate(order):
            assert visible[i] == set(order[:k]), (b, i, k)
            assert not (perm[b, i] & ~target).any()  # and every non-target
        # Slots: the targets in position order, one-hot rows, unused slots empty.
        used = weights[b] > 0
        np.testing.assert_array_equal(positions[b, :target.sum()], targets)
        np.testing.assert_array_equal(mapping[b][used], np.eye(segments.shape[1])[positions[b][used]])
        assert not mapping[b][~used].any()


def test_targets_of_one_drawn_rank_still_form_an_order(monkeypatch):
    """float32 draws repeat (1 row in about 50,000): two targets of one rank must not hide each other, which no
    factorisation order does; ties go by position. Every draw equal forces it for every pair."""
    segments = packed_segments()
    monkeypatch.setattr(jax.random, "uniform", lambda key, shape, *args, **kwargs: jnp.zeros(shape))
    plm = sample_permutation(jax.random.key(3), jnp.asarray(segments), ratio=RATIO, max_span=MAX_SPAN, num_predict=12)
    perm = np.asarray(plm.perm_mask) > 0
    for b in range(segments.shape[0]):
        targets = np.flatnonzero(perm[b].any(axis=0))
        assert len(targets) >= 2
        for k, i in enumerate(targets):  # in position order: each sees exactly the targets before it
            assert set(targets[~perm[b, i, targets]]) == set(targets[:k]), (b, i)


def test_targets_are_spans_covering_one_in_k_tokens():
    segments = np.ones((64, 240), np.int32)
    target = np.asarray(jax.jit(span_targets, static_argnums=(2, 3))(jax.random.key(0), jnp.asarray(segments),
                                                                      RATIO, MAX_SPAN))
    # 15360 tokens (the standard error is about 0.003), less the two ends of each row, never targets
    assert abs(target.mean() - 1 / RATIO * (238 / 240)) < 0.01 and not target[:, [0, -1]].any()
    runs = [len(run) for row in target for run in "".join("1" if t else "0" for t in row).split("0") if run]
    # Spans of 1..5 tokens (two adjacent windows may join their spans into one run of up to 10).
    assert max(runs) <= 2 * MAX_SPAN and np.mean(np.asarray(runs) <= MAX_SPAN) > 0.8
    ones = np.mean(np.asarray(runs) == 1)
    assert 0.35 < ones < 0.5  # p(1) = 1 / (1 + 1/2 + 1/3 + 1/4 + 1/5) = 0.44


def test_tiny_xlnet_config_learns_with_permutation_lm(tmp_path):
    """configs/pretrain/tiny-xlnet.yaml at test sizes: the held-out permutation-LM loss falls."""
    from bertjax.train.metrics import read_metrics
    from test_train_objective_runs import assert_learns, run

    result = run(tmp_path / "xlnet", "tiny-xlnet.yaml", "model.overrides.num_layers=2")
    assert_learns(result)
    last = read_metrics(result.workdir)[-1]
    assert "plm_accuracy" in last and "eval_plm_loss" in last


def test_objective_refuses_a_model_without_a_query_stream():
    from bertjax.config import get_config
    from bertjax.train.objectives import ObjectiveError, build_objective
    from bertjax.train.objectives.permutation_lm import PermutationLMOptions

    with pytest.raises(ObjectiveError, match="permutation_lm' needs XLNet's two-stream attention"):
        build_objective(PermutationLMOptions(), get_config("bert-tiny"))


def test_compile_check_compiles_xlnet_base_for_v5e(capsys):
    """`bertjax compile-check` on configs/pretrain/xlnet-base.yaml, shrunk: the sharded permutation-LM step (orders
    drawn on the device, both streams) compiles for a v5e 2x2 slice (full size: docs/benchmarks.md)."""
    from bertjax import tpu_aot
    from bertjax.cli import main

    if not tpu_aot.libtpu_available():
        pytest.skip(tpu_aot.INSTALL_HINT)
    overrides = ["model.overrides.hidden_size=64", "model.overrides.num_layers=2", "model.overrides.num_heads=4",
                 "model.overrides.intermediate_size=128", "data.global_batch_size=8", "data.seq_len=64",
                 "model.overrides.max_position_embeddings=64", "tokenizer.vocab_size=512", "mesh.data=2",
                 "mesh.fsdp=2"]
    assert main(["compile-check", "--config", "configs/pretrain/xlnet-base.yaml", "--topology", "v5e:2x2",
                 *overrides]) == 0
    out = capsys.readouterr().out
    assert "objective permutation_lm" in out and "fits in 16 GiB" in out
