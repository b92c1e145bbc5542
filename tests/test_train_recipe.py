"""ModernBERT's recipe in miniature on CPU (configs/pretrain/modernbert-base.yaml's shape, tiny sizes): pretraining
at 32 tokens with a batch warmup (6 -> 8 rows), context extension at 64 tokens with global RoPE theta 160k and a
lower constant rate, then a 1-sqrt decay to 0.001 of that rate; MLM at 30%, held out at 15%. It runs end to end,
its held-out loss falls, metrics.jsonl records the phases, batch sizes and learning rates, and a run stopped once
in each phase (in the batch warmup, mid context extension, mid decay) resumes to the same losses bit for bit."""

import numpy as np
import pytest

from bertjax.train.loop import pretrain
from bertjax.train.metrics import read_metrics
from bertjax.train.run_config import run_config_from_dict
from train_helpers import small_tokenizer

ROPE_1024 = {"rope_theta_global": 10000.0, "rope_theta_local": 10000.0}
ROPE_8192 = {"rope_theta_global": 160000.0, "rope_theta_local": 10000.0}
PEAK, EXTENSION_LR, FINAL_RATIO = 3.0e-3, 1.0e-3, 0.001
RECIPE = {
    "model": {"preset": "modernbert-tiny",
              "overrides": {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 48,
                            "local_window": 8, "max_position_embeddings": 64}},
    "data": {"seq_len": 32, "global_batch_size": 8, "mlm_probability": 0.3, "mask_token_fraction": 0.8,
             "random_token_fraction": 0.1, "eval_mlm_probability": 0.15, "window_documents": 64},
    "optimizer": {"name": "stable_adamw", "learning_rate": PEAK, "b1": 0.9, "b2": 0.98, "eps": 1.0e-6,
                  "weight_decay": 1.0e-5},
    "schedule": {"name": "constant", "unit": "tokens", "warmup": 1024},
    "train": {"log_every": 1, "progress_bar": False, "phases": [
        # 2 steps of 6 rows, 1 of 7, then 6 of 8: 2048 tokens in 9 steps.
        {"name": "pretrain-32", "tokens": 2048, "data": {"seq_len": 32, "global_batch_size": 8}, "model": ROPE_1024,
         "batch_warmup": {"start": 6, "tokens": 512}},
        {"name": "context-extension-64", "tokens": 1024, "data": {"seq_len": 64, "global_batch_size": 4},
         "model": ROPE_8192, "learning_rate": EXTENSION_LR, "schedule": {"name": "constant"}},
        {"name": "decay", "tokens": 1024, "data": {"seq_len": 64, "global_batch_size": 4}, "model": ROPE_8192,
         "learning_rate": EXTENSION_LR, "schedule": {"name": "wsd", "unit": "fraction", "warmup": 0.0, "decay": 1.0,
                                                     "decay_shape": "1-sqrt", "final_lr_ratio": FINAL_RATIO}}]},
    "eval": {"every": 0, "batches": 2, "fill_mask_examples": 0},
    "checkpoint": {"every": 100, "keep": 2},
}
PHASE_STARTS = {0: ("pretrain-32", 6, 32), 9: ("context-extension-64", 4, 64), 13: ("decay", 4, 64)}
TOTAL = 17
STOPS = (2, 11, 15)  # before the batch grows to 7 rows, in context extension, in the decay

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    config = run_config_from_dict({**RECIPE, "tokenizer": {"path": str(small_tokenizer())}})
    reference = pretrain(config, root / "reference")
    results, pending = [], list(STOPS)
    shown = []  # every record on_log was given, by the stopped runs together

    def stop_once(step, record) -> bool:  # each stop once: the resumed run goes on past it
        shown.append((step, record))
        if pending and step == pending[0] and "loss" in record:
            return pending.pop(0) is not None
        return False

    while True:
        result = pretrain(config, root / "stopped", on_log=stop_once)
        results.append(result)
        if not result.preempted:
            break
    return reference, results, shown


def by_step(workdir):
    """The training record of each step (a phase's first record shares its step with the step before's)."""
    return {record["step"]: record for record in read_metrics(workdir) if "loss" in record}


def test_recipe_runs_and_metrics_record_phases_batches_and_rates(runs):
    reference, _, _ = runs
    assert reference.final_step == TOTAL and not reference.preempted
    assert reference.eval_loss_end < reference.eval_loss_start - 0.2, (reference.eval_loss_start,
                                                                        reference.eval_loss_end)
    records = read_metrics(reference.workdir)
    starts = {r["step"]: (r["phase_start"], r["batch_size"], r["seq_len"]) for r in records if "phase_start" in r}
    assert starts == PHASE_STARTS
    steps = by_step(reference.workdir)
    assert [steps[s]["batch_size"] for s in range(1, TOTAL + 1)] == [6, 6, 7] + [8] * 6 + [4] * 8
    assert [steps[s]["phase"] for s in range(1, TOTAL + 1)] == [0] * 9 + [1] * 4 + [2] * 4
    rates = np.array([steps[s]["learning_rate"] for s in range(1, TOTAL + 1)])
    # Phase 1: warmup over 1024 tokens (2 steps of 192 tokens, 1 of 224, then 256 a step), linear in the tokens
    # trained before each update, then the peak.
    np.testing.assert_allclose(rates[:5], PEAK * np.array([0, 192, 384, 608, 864]) / 1024, rtol=1e-6)
    np.testing.assert_allclose(rates[5:9], PEAK, rtol=1e-6)
    np.testing.assert_allclose(rates[9:13], EXTENSION_LR, rtol=1e-6)  # context extension: constant, lower
    # Decay: update j of n = 4 at rate * (r + (1 - r) * (1 - sqrt(j / n))).
    j = np.arange(4)
    np.testing.assert_allclose(rates[13:], EXTENSION_LR * (FINAL_RATIO + (1 - FINAL_RATIO) * (1 - np.sqrt(j / 4))),
                               rtol=1e-5)


def test_stopped_in_each_phase_resumes_to_the_same_run(runs):
    reference, results, shown = runs
    assert [r.final_step for r in results] == [*STOPS, TOTAL]
    assert [r.preempted for r in results] == [True, True, True, False]
    want, got = by_step(reference.workdir), by_step(results[-1].workdir)
    for key in ("loss", "learning_rate", "batch_size", "phase"):
        assert {s: r[key] for s, r in got.items()} == {s: r[key] for s, r in want.items()}, key
    assert sorted(got) == list(range(1, TOTAL + 1))
    assert results[-1].eval_loss_end == reference.eval_loss_end  # exact: the same parameters at the end
    starts = {r["step"]: r["phase_start"] for r in read_metrics(results[-1].workdir) if "phase_start" in r}
    assert starts == {s: name for s, (name, _, _) in PHASE_STARTS.items()}
    # on_log saw every record metrics.jsonl holds (the held-out loss at step 0 and the phase records too): a live
    # plot drawn from it started at the first logged step.
    written = [(r["step"], sorted(set(r) - {"step"})) for r in read_metrics(results[-1].workdir)]
    assert [(step, sorted(record)) for step, record in shown] == written
    assert shown[0][0] == 0 and "eval_loss" in shown[0][1]


def test_a_batch_warmup_grows_in_steps_every_microbatch_split_takes():
    """With gradient accumulation the stairs grow by batch shards x accumulation_steps rows: they grew by the shards
    alone, so every batch warmup with accumulation (modernbert-base.yaml on fewer chips) failed with an error naming
    a batch size no one wrote (769)."""
    from bertjax.train.feed import check_batch_fits
    from bertjax.train.mesh import build_mesh
    from bertjax.train.phases import plan_phases
    from bertjax.train.run_config import MeshConfig, to_dict

    config = run_config_from_dict({**RECIPE, "optimizer": {**RECIPE["optimizer"], "accumulation_steps": 2},
                                   "tokenizer": {"path": str(small_tokenizer())}})
    phases = plan_phases(config, batch_shards=1)
    assert [segment.global_batch_size for segment in phases[0].segments] == [6, 8]
    check_batch_fits(phases, build_mesh(MeshConfig(data=1)), accumulation_steps=2)
    odd = run_config_from_dict({**to_dict(config), "optimizer": {**RECIPE["optimizer"], "accumulation_steps": 4}})
    with pytest.raises(Exception, match=r"batch_warmup.start \(6\) .* times optimizer.accumulation_steps \(4\)"):
        plan_phases(odd, batch_shards=1)
