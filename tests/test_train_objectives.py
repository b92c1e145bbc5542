"""Objectives against numpy references, the registry's errors, and the analytic FLOP count against XLA's."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.config import get_config
from bertjax.models import MODEL_CLASSES
from bertjax.models.params import init_boxed
from bertjax.train import flops
from bertjax.train.objectives import OBJECTIVES, build_objective, losses, objective_class
from bertjax.train.objectives.base import ObjectiveError, model_inputs
from bertjax.train.objectives.distillation import teacher_layer_map
from bertjax.train.run_config import ConfigError, run_config_from_dict
from bertjax.train.setup import setup_run

import flax.linen as nn


def _numpy_cross_entropy(logits, labels):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, np.asarray(labels)[..., None], -1)[..., 0]


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def tiny_batch(config, batch=3, seq=12, predictions=4, seed=0, pairs=False):
    """Two packed documents per row, padding at the end of the last row, `predictions` masked slots (the last
    row's last slot unused)."""
    rng = np.random.default_rng(seed)
    segment = np.ones((batch, seq), np.int32)
    segment[:, seq // 2:] = 2
    segment[-1, -3:] = 0
    positions = np.where(segment == 1, np.arange(seq), np.arange(seq) - seq // 2) * (segment > 0)
    ids = rng.integers(5, config.vocab_size, (batch, seq)).astype(np.int32)
    masked = np.sort(np.stack([rng.choice(seq - 3, predictions, replace=False) for _ in range(batch)]), 1)
    weights = np.ones((batch, predictions), np.float32)
    weights[-1, -1] = 0
    out = {"input_ids": ids, "segment_ids": segment, "positions": positions.astype(np.int32),
           "token_type_ids": np.zeros_like(ids), "masked_positions": masked.astype(np.int32),
           "masked_ids": rng.integers(5, config.vocab_size, (batch, predictions)).astype(np.int32),
           "masked_weights": weights}
    if pairs:
        out["nsp_labels"] = np.array([0, 1, -1][:batch], np.int32)
    return out


def objective_for(name, config, **options):
    cls = objective_class(name)
    return build_objective(cls.options_class(name=name, **options), config)


# The BERT-sized tests run op by op: their model's shapes recur from test to test, so after the first one JAX's
# per-operation cache serves them. ELECTRA's models are of other shapes and each of its tests would compile
# hundreds of operations afresh: those run under jax.jit (`compiled=True`), one compile per program.


def params_of(objective, seed=0, compiled=False):
    init = jax.jit(objective.init_params) if compiled else objective.init_params
    return nn.meta.unbox(init(jax.random.key(seed)))


def loss_of(objective, params, batch, frozen=None, key=0, compiled=False):
    def run(params, frozen, batch, key):
        sums = objective.loss_sums(params, frozen, batch, key, deterministic=True)
        return objective.loss(sums, objective.normalisers(batch)), sums

    loss, sums = (jax.jit(run) if compiled else run)(params, frozen or {}, batch, jax.random.key(key))
    return float(loss), sums


def compiled_apply(model, params, **inputs):
    """`model.apply({"params": params}, **inputs)` under jax.jit (the inputs are arrays)."""
    return jax.jit(lambda p, inputs: model.apply({"params": p}, **inputs))(params, inputs)


BERT = get_config("bert-tiny", vocab_size=50)


def test_registry_has_the_issue_objectives():
    assert {"mlm", "mlm_nsp", "mlm_sop", "electra", "distillation"} <= set(OBJECTIVES)


def test_mlm_loss_equals_numpy_mean_over_real_predictions():
    objective = objective_for("mlm", BERT)
    params, batch = params_of(objective), tiny_batch(BERT)
    loss, sums = loss_of(objective, params, batch)
    logits = objective.model.apply({"params": params}, **model_inputs(BERT, batch),
                                   masked_positions=batch["masked_positions"]).logits
    ce = _numpy_cross_entropy(logits, batch["masked_ids"])
    w = batch["masked_weights"]
    np.testing.assert_allclose(loss, (ce * w).sum() / w.sum(), rtol=1e-5)
    assert float(sums["mlm_weight"]) == w.sum() == 11


@pytest.mark.parametrize("name", ["mlm_nsp", "mlm_sop"])
def test_sentence_pair_loss_adds_the_mean_over_labelled_rows(name):
    objective = objective_for(name, BERT)
    params, batch = params_of(objective), tiny_batch(BERT, pairs=True)
    loss, _ = loss_of(objective, params, batch)
    out = objective.model.apply({"params": params}, **model_inputs(BERT, batch),
                                masked_positions=batch["masked_positions"])
    w = batch["masked_weights"]
    mlm = (_numpy_cross_entropy(out.logits, batch["masked_ids"]) * w).sum() / w.sum()
    keep = batch["nsp_labels"] >= 0  # -1: an evaluation padding row
    nsp = _numpy_cross_entropy(np.asarray(out.nsp_logits)[keep], batch["nsp_labels"][keep]).mean()
    np.testing.assert_allclose(loss, mlm + nsp, rtol=1e-5)


def test_microbatch_sums_divided_by_whole_batch_counts_equal_the_whole_batch_loss():
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(size=(4, 3, 7)).astype(np.float32))
    labels = rng.integers(0, 7, (4, 3)).astype(np.int32)
    weights = (rng.random((4, 3)) < 0.7).astype(np.float32)
    whole = losses.mlm_sums(logits, labels, weights)
    halves = [losses.mlm_sums(logits[i::2], labels[i::2], weights[i::2]) for i in range(2)]
    np.testing.assert_allclose(float(halves[0][0] + halves[1][0]) / float(whole[1]), float(whole[0] / whole[1]),
                               rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Distillation


def distillation_with_teacher(monkeypatch, student_config, teacher_config, teacher_params, **options):
    from bertjax.train.objectives import distillation
    teacher = MODEL_CLASSES["masked_lm"](teacher_config)
    monkeypatch.setattr(distillation, "load_teacher", lambda path: (teacher, teacher_params, None))
    return objective_for("distillation", student_config, teacher="unused", **options), teacher


@pytest.mark.parametrize("soft_targets", ["all_tokens", "masked"])
def test_distillation_loss_equals_numpy_reference(monkeypatch, soft_targets):
    """DistilBERT's loss (its distiller.py): KLDivLoss(batchmean) x T^2 over every real token by default, over the
    masked ones with --restrict_ce_to_mask; MLM at the masked ones; cosine at every real token."""
    teacher_config = BERT.replace(num_layers=3)
    teacher_params = init_boxed(MODEL_CLASSES["masked_lm"](teacher_config), jax.random.key(1))
    teacher_params = nn.meta.unbox(teacher_params)
    objective, teacher = distillation_with_teacher(monkeypatch, BERT, teacher_config, teacher_params,
                                                   alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0, temperature=2.0,
                                                   soft_targets=soft_targets)
    params, batch = params_of(objective), tiny_batch(BERT)
    frozen = {"teacher": teacher_params}
    loss, _ = loss_of(objective, params, batch, frozen)

    kwargs = dict(**model_inputs(BERT, batch))
    s = objective.model.apply({"params": params}, **kwargs)  # logits at every token
    t = teacher.apply({"params": teacher_params}, **kwargs)
    w = batch["masked_weights"]
    real = batch["segment_ids"] > 0
    log_ps, log_pt = _log_softmax(np.asarray(s.logits) / 2.0), _log_softmax(np.asarray(t.logits) / 2.0)
    per_token = (np.exp(log_pt) * (log_pt - log_ps)).sum(-1)
    at_masks = np.take_along_axis(per_token, batch["masked_positions"], axis=1)
    kl = (per_token[real].mean() if soft_targets == "all_tokens" else (at_masks * w).sum() / w.sum()) * 4.0
    masked_logits = np.take_along_axis(np.asarray(s.logits), batch["masked_positions"][..., None], axis=1)
    mlm = (_numpy_cross_entropy(masked_logits, batch["masked_ids"]) * w).sum() / w.sum()
    hs, ht = np.asarray(s.last_hidden_state, np.float64), np.asarray(t.last_hidden_state, np.float64)
    cos = (hs * ht).sum(-1) / np.linalg.norm(hs, axis=-1) / np.linalg.norm(ht, axis=-1)
    cosine = (1 - cos)[real].mean()
    np.testing.assert_allclose(loss, 5.0 * kl + 2.0 * mlm + 1.0 * cosine, rtol=1e-5)


def test_distillation_of_a_student_equal_to_its_teacher_has_zero_kl_and_cosine(monkeypatch):
    teacher_params = nn.meta.unbox(init_boxed(MODEL_CLASSES["masked_lm"](BERT), jax.random.key(3)))
    objective, _ = distillation_with_teacher(monkeypatch, BERT, BERT, teacher_params)
    frozen = {"teacher": teacher_params}
    student = objective.warm_start(params_of(objective), frozen)  # same depth: every layer copied
    _, sums = loss_of(objective, student, tiny_batch(BERT), frozen)
    metrics = objective.metrics(sums)
    assert abs(float(metrics["kl_loss"])) < 1e-6 and abs(float(metrics["cosine_loss"])) < 1e-6


def test_a_narrower_student_trains_without_the_cosine_term(monkeypatch):
    """The error for a narrower student says "set objective.alpha_cos: 0"; doing so failed on a shape mismatch,
    the cosine being computed at weight 0 anyway."""
    teacher_config = BERT.replace(hidden_size=BERT.hidden_size * 2, intermediate_size=BERT.intermediate_size * 2)
    teacher_params = nn.meta.unbox(init_boxed(MODEL_CLASSES["masked_lm"](teacher_config), jax.random.key(5)))
    objective, _ = distillation_with_teacher(monkeypatch, BERT, teacher_config, teacher_params, alpha_cos=0.0,
                                             student_init="random")
    loss, sums = loss_of(objective, params_of(objective), tiny_batch(BERT), {"teacher": teacher_params})
    assert np.isfinite(float(loss)) and float(objective.metrics(sums)["cosine_loss"]) == 0.0
    with pytest.raises(ValueError, match="objective.alpha_cos: the cosine loss compares hidden states"):
        distillation_with_teacher(monkeypatch, BERT, teacher_config, teacher_params)[0].check_compatible()


def test_a_missing_teacher_is_named_as_the_teacher(tmp_path):
    """It was "tokenizer path 'runs/nope' does not exist": the teacher's path doubles as the tokenizer's."""
    from bertjax.train.objectives.distillation import DistillationOptions

    with pytest.raises(ValueError, match=r"objective.teacher: '.*nope' does not exist"):
        DistillationOptions(teacher=str(tmp_path / "nope")).tokenizer_path()


def test_sentence_pair_objectives_refuse_a_model_that_cannot_hold_them():
    """RoBERTa (one token type: sentence B clamped to type 0 under jit), DistilBERT, ModernBERT, ELECTRA: one step
    trained, and the run could not be exported at its end."""
    for preset in ("roberta-tiny", "distilbert-tiny", "modernbert-tiny", "electra-tiny-discriminator"):
        with pytest.raises(ObjectiveError, match=r"objective.name='mlm_nsp' needs a BERT- or ALBERT-style model"):
            objective_for("mlm_nsp", get_config(preset, vocab_size=64))
    objective_for("mlm_sop", get_config("albert-tiny", vocab_size=64))


def test_student_takes_every_other_teacher_layer():
    assert teacher_layer_map(12, 6) == [0, 2, 4, 7, 9, 11]  # DistilBERT's choice
    assert teacher_layer_map(4, 2) == [0, 3] and teacher_layer_map(3, 1) == [0]


def test_warm_start_copies_the_mapped_teacher_layers(monkeypatch):
    teacher_config = BERT.replace(num_layers=4)
    teacher_params = nn.meta.unbox(init_boxed(MODEL_CLASSES["masked_lm"](teacher_config), jax.random.key(4)))
    objective, _ = distillation_with_teacher(monkeypatch, BERT, teacher_config, teacher_params)
    student = objective.warm_start(params_of(objective), {"teacher": teacher_params})
    chex_equal = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
    chex_equal(student["encoder"]["layers_1"], teacher_params["encoder"]["layers_3"])
    chex_equal(student["embeddings"], teacher_params["embeddings"])


def test_a_distilbert_student_starts_from_a_bert_teacher(monkeypatch):
    """DistilBERT's setting: a BERT teacher (token types, 2 layers) and a DistilBERT student (none, 1 layer)."""
    teacher_config = get_config("bert-tiny", vocab_size=50)
    student_config = get_config("distilbert-tiny", vocab_size=50, num_layers=1)
    teacher_params = nn.meta.unbox(init_boxed(MODEL_CLASSES["masked_lm"](teacher_config), jax.random.key(7)))
    objective, _ = distillation_with_teacher(monkeypatch, student_config, teacher_config, teacher_params)
    frozen = {"teacher": teacher_params}
    student = objective.warm_start(params_of(objective), frozen)
    np.testing.assert_array_equal(student["encoder"]["layers_0"]["mlp"]["wo"]["kernel"],
                                  teacher_params["encoder"]["layers_0"]["mlp"]["wo"]["kernel"])
    loss, _ = loss_of(objective, student, tiny_batch(student_config), frozen)
    assert np.isfinite(loss)


def test_teacher_with_another_vocabulary_is_refused(monkeypatch):
    teacher_config = BERT.replace(vocab_size=60)
    teacher_params = nn.meta.unbox(init_boxed(MODEL_CLASSES["masked_lm"](teacher_config), jax.random.key(5)))
    objective, _ = distillation_with_teacher(monkeypatch, BERT, teacher_config, teacher_params)
    with pytest.raises(ValueError, match="objective.teacher: the teacher's vocabulary"):
        objective.check_compatible()


# ---------------------------------------------------------------------------------------------------------------
# Registry errors through the run config and the run setup (before anything compiles)


def run_config(**sections):
    raw = {"model": {"preset": "bert-tiny"}, "data": {"seq_len": 16, "global_batch_size": 2},
           "train": {"steps": 2}}
    raw.update(sections)
    return run_config_from_dict(raw)


def test_unknown_objective_names_the_key():
    with pytest.raises(ConfigError, match=r"objective.name: unknown objective 'mlm_xyz'.*known"):
        run_config(objective={"name": "mlm_xyz"})


def test_unknown_or_mistyped_objective_option_names_the_key():
    with pytest.raises(ConfigError, match=r"unknown key objective.rtd_weigth"):
        run_config(objective={"name": "electra", "rtd_weigth": 3})
    with pytest.raises(ConfigError, match=r"objective.rtd_weight must be a number"):
        run_config(objective={"name": "electra", "rtd_weight": "high"})


def test_distillation_without_a_teacher_is_a_clear_error():
    with pytest.raises(ConfigError, match="missing required key objective.teacher"):
        run_config(objective={"name": "distillation"})


def test_objective_whose_batch_keys_the_data_does_not_produce_is_refused():
    config = run_config(objective={"name": "mlm_nsp"})  # data.sentence_objective defaults to none
    with pytest.raises(ConfigError, match=r"set data.sentence_objective: nsp"):
        setup_run(config, vocab_size=128, pad_id=0)
    config = run_config(objective={"name": "mlm_sop"}, data={"seq_len": 16, "global_batch_size": 2,
                                                             "packing": "pad", "sentence_objective": "nsp"})
    with pytest.raises(ConfigError, match=r"set data.sentence_objective: sop"):
        setup_run(config, vocab_size=128, pad_id=0)


# ---------------------------------------------------------------------------------------------------------------
# FLOPs


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
    ours = objective_for("mlm", config).train_flops(seq_len=seq, tokens=batch * seq,
                                                    predictions=batch * predictions, rows=batch)
    # XLA also counts elementwise work (softmax, GELU, norms), a few percent here.
    assert 0.97 < xla_flops / ours < 1.10, (xla_flops, ours)


def _matmul_flops(fn, *args) -> float:
    """2 x output elements x contracted size, summed over every dot_general of fn's jaxpr (sub-jaxprs included):
    an exact count of the matrix products a program performs, independent of bertjax's formulas."""
    def count(jaxpr, times):
        total = 0.0
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                (contracted, _), _ = eqn.params["dimension_numbers"]
                lhs = eqn.invars[0].aval.shape
                total += times * 2 * np.prod(eqn.outvars[0].aval.shape) * np.prod([lhs[i] for i in contracted])
            inner = times * eqn.params["length"] if eqn.primitive.name == "scan" else times
            for value in eqn.params.values():
                for item in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(item, jax.extend.core.ClosedJaxpr):
                        total += count(item.jaxpr, inner)
                    elif isinstance(item, jax.extend.core.Jaxpr):
                        total += count(item, inner)
        return total
    return count(jax.make_jaxpr(fn)(*args).jaxpr, 1)


@pytest.mark.parametrize("name, seq, overrides", [
    # v3: 8 log buckets, so 16 table rows at any length
    ("deberta-v3-tiny", 32, {}),
    # v1 (distances clamped at 64): a row of 24 tokens reads, and projects, only the 48 rows around the centre
    ("deberta-base", 24, dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, vocab_size=100,
                              disentangled=get_config("deberta-base").disentangled.replace(max_relative_positions=64))),
    ("deberta-base", 40, dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, vocab_size=100,
                              disentangled=get_config("deberta-base").disentangled.replace(max_relative_positions=16))),
    # XLNet's content stream: its position scores against the 2 * seq encodings (and its two segment vectors), and
    # the encodings' projection per layer
    ("xlnet-tiny", 24, {}),
])
def test_relative_position_attention_counts_every_matmul_of_its_step(name, seq, overrides):
    config = get_config(name, dropout_rate=0.0, **overrides)
    model = MODEL_CLASSES["masked_lm"](config)
    batch, predictions = 2, 5
    ids = jnp.ones((batch, seq), jnp.int32)
    positions = jnp.zeros((batch, predictions), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids))["params"]
    # The forward pass: training is counted as 3x it by convention (test_analytic_flops_match_xla_cost_analysis).
    forward = lambda p: model.apply({"params": p}, ids, masked_positions=positions).logits
    ours = flops.mlm_forward_flops(config, seq_len=seq, tokens=batch * seq, predictions=batch * predictions)
    assert ours == pytest.approx(_matmul_flops(forward, params), rel=1e-9)


def test_xlnet_query_stream_reads_the_content_streams_keys_and_values():
    config = get_config("xlnet-tiny")
    objective = objective_for("permutation_lm", config)
    ratio = objective.options.prediction_ratio
    content = flops.mlm_forward_flops(config, seq_len=64, tokens=128, predictions=128 / ratio)
    query = flops.forward_flops_per_token(config, 64) - config.num_layers * 4 * config.hidden_size ** 2
    counted = objective.train_flops(seq_len=64, tokens=128, predictions=0, rows=2)
    assert counted == pytest.approx(3 * (content + 128 / ratio * query))


def test_peak_is_the_datasheet_dense_bf16_figure_of_the_device_form_factor():
    peaks = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12, "NVIDIA H100 NVL": 835e12,
             "NVIDIA H200": 989e12, "NVIDIA H200 NVL": 835e12, "NVIDIA GH200 480GB": 989e12, "NVIDIA B200": 2.25e15,
             "NVIDIA GB200": 2.5e15, "NVIDIA A100-SXM4-80GB": 312e12, "NVIDIA L40S": 362e12, "NVIDIA L40": 181e12,
             "NVIDIA L4": 121e12, "TPU v5 lite": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12,
             "Tesla V100-SXM2-16GB": None, "cpu": None}
    for kind, peak in peaks.items():
        device = type("Device", (), {"device_kind": kind})()
        assert flops.peak_flops_per_device(device) == peak, kind


def test_local_layers_count_their_window_and_padding_is_not_work():
    config = get_config("modernbert-base")
    global_layer = 4 * config.num_heads * config.head_dim * 1024
    local_layer = 4 * config.num_heads * config.head_dim * 129  # |i - j| <= 64
    dense = get_config("modernbert-base", global_attention_every=1, local_window=None)
    saved = flops.forward_flops_per_token(dense, 1024) - flops.forward_flops_per_token(config, 1024)
    local_layers = sum(not config.is_global_layer(i) for i in range(config.num_layers))
    assert saved == local_layers * (global_layer - local_layer)
    objective = objective_for("mlm", config)
    full = objective.train_flops(seq_len=1024, tokens=1024, predictions=300, rows=1)
    half = objective.train_flops(seq_len=1024, tokens=512, predictions=300, rows=1)
    assert half < full and np.isclose(full - half, 3 * 512 * flops.forward_flops_per_token(config, 1024))


@pytest.mark.parametrize("soft_targets", ["all_tokens", "masked"])
def test_distillation_counts_the_teacher_forward_once(monkeypatch, soft_targets):
    """Both models' vocabulary heads run where the soft targets are: every token, or the masked ones."""
    teacher_config = BERT.replace(num_layers=4)
    teacher_params = nn.meta.unbox(init_boxed(MODEL_CLASSES["masked_lm"](teacher_config), jax.random.key(6)))
    objective, _ = distillation_with_teacher(monkeypatch, BERT, teacher_config, teacher_params,
                                             soft_targets=soft_targets)
    scored = 64.0 if soft_targets == "all_tokens" else 10.0
    counts = dict(seq_len=32, tokens=64.0, predictions=10.0, rows=2.0)
    student = objective_for("mlm", BERT).train_flops(**{**counts, "predictions": scored})
    teacher = flops.mlm_forward_flops(teacher_config, seq_len=32, tokens=64.0, predictions=scored)
    assert objective.train_flops(**counts) == pytest.approx(student + teacher)


def test_options_are_frozen_dataclasses_named_like_the_registry():
    for name, cls in OBJECTIVES.items():
        assert cls.name == name and dataclasses.is_dataclass(cls.options_class)


# ---------------------------------------------------------------------------------------------------------------
# ELECTRA

from bertjax.train.objectives.electra import generator_config, replace_at, sample_replacements  # noqa: E402

ELECTRA = get_config("electra-tiny-discriminator", vocab_size=50)


def test_generator_is_a_fraction_of_the_discriminator_sharing_its_embedding_size():
    """By default the sizes of the ELECTRA paper's Table 6 (1/4 small, 1/3 base, 1/4 large): the default had small
    and base swapped. The feed-forward width follows the rounded head ratio (small's FFN was 341 for 1 of 4 heads)."""
    small = get_config("electra-small-discriminator")
    g = generator_config(small, None)  # 1/4: 1 head of 64
    assert (g.hidden_size, g.num_heads, g.intermediate_size) == (64, 1, 256)
    base = get_config("electra-base-discriminator")
    for size in (None, 1 / 3):
        g = generator_config(base, size)
        assert (g.hidden_size, g.num_heads, g.intermediate_size, g.num_layers, g.embed_dim) == (256, 4, 1024, 12, 768)
    g = generator_config(get_config("electra-large-discriminator"), None)
    assert (g.hidden_size, g.num_heads, g.intermediate_size) == (256, 4, 1024)
    g = generator_config(base, 1 / 4)
    assert (g.hidden_size, g.num_heads, g.intermediate_size) == (192, 3, 768)


def test_sampled_replacements_follow_the_generator_distribution():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    draws = jax.vmap(lambda k: sample_replacements(k, logits, 1.0))(jax.random.split(jax.random.key(0), 20000))
    counts = np.bincount(np.asarray(draws).ravel(), minlength=4)
    expected = 20000 * np.array([0.5, 0.3, 0.15, 0.05])
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 16.27, (counts, chi2)  # 3 degrees of freedom, p = 0.001
    # temperature sharpens: T = 0.5 squares the probabilities (renormalised)
    draws = jax.vmap(lambda k: sample_replacements(k, logits, 0.5))(jax.random.split(jax.random.key(1), 20000))
    frequency = np.bincount(np.asarray(draws).ravel(), minlength=4) / 20000
    sharpened = np.array([0.5, 0.3, 0.15, 0.05]) ** 2
    np.testing.assert_allclose(frequency, sharpened / sharpened.sum(), atol=0.015)


def test_replacements_never_touch_padding_or_unused_slots():
    ids = jnp.asarray([[7, 8, 9, 0, 0]])
    positions = jnp.asarray([[1, 4, 3]])  # slots 2 and 3 point at padding, but are unused
    used = jnp.asarray([[True, False, False]])
    out = replace_at(ids, positions, used, jnp.asarray([[42, 43, 44]]))
    np.testing.assert_array_equal(out, [[7, 42, 9, 0, 0]])


def test_electra_loss_equals_numpy_reference_and_shares_embeddings():
    objective = objective_for("electra", ELECTRA, rtd_weight=50.0, temperature=1e-4)  # ~argmax sampling
    params, batch = params_of(objective, compiled=True), tiny_batch(ELECTRA)
    assert "word_embeddings" not in params["generator"]["embeddings"]  # read from the discriminator
    loss, sums = loss_of(objective, params, batch, compiled=True)

    generator, discriminator = objective.exports(params)["generator"], objective.exports(params)["discriminator"]
    gen = compiled_apply(generator[0], generator[1], **model_inputs(ELECTRA, batch),
                         masked_positions=batch["masked_positions"])
    w = batch["masked_weights"]
    mlm = (_numpy_cross_entropy(gen.logits, batch["masked_ids"]) * w).sum() / w.sum()
    sampled = np.asarray(gen.logits).argmax(-1)
    corrupted, original = np.array(batch["input_ids"]), np.array(batch["input_ids"])
    for row in range(w.shape[0]):
        for slot in range(w.shape[1]):
            if w[row, slot]:
                corrupted[row, batch["masked_positions"][row, slot]] = sampled[row, slot]
                original[row, batch["masked_positions"][row, slot]] = batch["masked_ids"][row, slot]
    real = batch["segment_ids"] > 0
    labels = (corrupted != original) & real
    disc = compiled_apply(discriminator[0], discriminator[1], **model_inputs(ELECTRA, batch, corrupted))
    z = np.asarray(disc.logits, np.float64)
    bce = np.maximum(z, 0) - z * labels + np.log1p(np.exp(-np.abs(z)))
    np.testing.assert_allclose(loss, mlm + 50.0 * bce[real].mean(), rtol=1e-5)
    metrics = objective.metrics(sums)
    np.testing.assert_allclose(float(metrics["replacement_rate"]), labels[real].mean(), rtol=1e-6)
    predicted = (z > 0) & real
    np.testing.assert_allclose(float(metrics["rtd_recall"]), (predicted & labels).sum() / max(labels.sum(), 1),
                               rtol=1e-6)


def test_electra_generator_gets_no_gradient_through_the_samples():
    """The RTD loss alone (generator MLM weight removed) leaves the generator's own parameters untouched."""
    objective = objective_for("electra", ELECTRA, rtd_weight=1.0)
    params, batch = params_of(objective, compiled=True), tiny_batch(ELECTRA)

    def rtd_only(p):
        sums = objective.loss_sums(p, {}, batch, jax.random.key(0), deterministic=True)
        return sums["rtd_loss"]

    grads = jax.jit(jax.grad(rtd_only))(params)
    generator_norm = sum(float(jnp.abs(g).sum()) for g in jax.tree.leaves(grads["generator"]))
    assert generator_norm == 0.0
    assert float(jnp.abs(grads["discriminator"]["embeddings"]["word_embeddings"]["embedding"]).sum()) > 0


def test_electra_sample_equal_to_the_original_counts_as_original(monkeypatch):
    """In real batches a masked slot holds [MASK] (80%), a random token (10%) or the original token (10%). The
    generator often samples the original token. The paper (and the module docstring) label such a position
    "original": the target is `corrupted != original token`, never `corrupted != masked input`. The batch here is
    built as the data pipeline builds it, and the sampler is pinned. Even slots draw the original token and odd
    slots another one. The numpy reference counts only the odd used slots as replaced."""
    from bertjax.train.objectives import electra

    batch = tiny_batch(ELECTRA, seed=3)
    mask_id = 4
    rows, slots = np.nonzero(batch["masked_weights"])
    positions = batch["masked_positions"][rows, slots]
    kept = (rows + slots) % 5 == 0  # some slots keep the original token, the rest hold [MASK]
    batch["input_ids"][rows, positions] = np.where(kept, batch["masked_ids"][rows, slots], mask_id)
    other = 5 + (batch["masked_ids"] - 5 + 1) % (ELECTRA.vocab_size - 5)  # never the original token
    samples = np.where(np.arange(batch["masked_ids"].shape[1]) % 2 == 0, batch["masked_ids"], other)
    monkeypatch.setattr(electra, "sample_replacements", lambda key, logits, temperature: jnp.asarray(samples))

    objective = objective_for("electra", ELECTRA, rtd_weight=1.0)
    _, sums = loss_of(objective, params_of(objective, compiled=True), batch, compiled=True)
    expected = int((slots % 2 == 1).sum())  # the used slots whose sample differs from the original token
    assert 0 < expected < len(slots)
    assert float(sums["replaced"]) == expected
    real = (batch["segment_ids"] > 0).sum()
    np.testing.assert_allclose(float(objective.metrics(sums)["replacement_rate"]), expected / real, rtol=1e-6)


def test_a_teacher_with_fewer_positions_than_the_rows_is_named(monkeypatch):
    """It was "input_ids: sequence length 128 exceeds the model's max_position_embeddings (64)" from inside the
    step: "the model" read as the student, whose limit was 128."""
    from bertjax.data.pipeline import DataConfig

    teacher_config = BERT.replace(max_position_embeddings=16)
    teacher_params = nn.meta.unbox(init_boxed(MODEL_CLASSES["masked_lm"](teacher_config), jax.random.key(6)))
    objective, _ = distillation_with_teacher(monkeypatch, BERT, teacher_config, teacher_params)
    produced = set(objective.batch_keys)
    with pytest.raises(ObjectiveError, match=r"data.seq_len \(32\) does not fit the teacher's "
                                             r"max_position_embeddings \(16, objective.teacher unused\)"):
        objective.check_data(DataConfig(seq_len=32), produced, "data")
    objective.check_data(DataConfig(seq_len=16), produced, "data")


def test_teacher_layers_into_layers_that_attend_otherwise_are_warned_and_a_deeper_student_named(monkeypatch,
                                                                                                caplog):
    """tiny-distilbert: teacher layer 3 (global) was copied into student layer 1 (local) without a word; a student
    deeper than its teacher was refused only when the state was first created, as a bare message."""
    import logging

    teacher_config = get_config("modernbert-tiny", vocab_size=64, num_layers=4, global_attention_every=3)
    student_config = get_config("modernbert-tiny", vocab_size=64, num_layers=2, global_attention_every=3)
    teacher_params = nn.meta.unbox(init_boxed(MODEL_CLASSES["masked_lm"](teacher_config), jax.random.key(7)))
    objective, _ = distillation_with_teacher(monkeypatch, student_config, teacher_config, teacher_params)
    with caplog.at_level(logging.WARNING):
        objective.check_compatible()
    assert "student layer 1 (window" in caplog.text and "from teacher layer 3 (global)" in caplog.text
    deeper = get_config("modernbert-tiny", vocab_size=64, num_layers=6)
    objective, _ = distillation_with_teacher(monkeypatch, deeper, teacher_config, teacher_params)
    with pytest.raises(ObjectiveError, match="objective.student_init=teacher_layers: the student has 6 layers, more "
                                             "than the teacher's 4; lower model.overrides.num_layers"):
        objective.check_compatible()
