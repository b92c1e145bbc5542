"""Schedule phases as fractions of the run: the shipped tiny config takes `train.steps=N` alone for any N >= 1,
and a schedule that truly cannot fit says how to fix it (issue 14, point 2)."""

from __future__ import annotations

import numpy as np
import pytest

from bertjax.train import feed as feed_lib
from bertjax.train.run_config import ConfigError, ScheduleConfig, load_run_config
from bertjax.train.schedules import StepClock, build_schedule
from train_helpers import REPO

CONFIGS = REPO / "configs" / "pretrain"


def _schedule(config):
    phases = feed_lib.plan_phases(config)
    clock = StepClock(feed_lib.boundaries(phases), feed_lib.tokens_per_step(phases))
    return build_schedule(config.schedule, config.optimizer.learning_rate, config.train.steps, clock)


def test_fractions_equal_the_same_schedule_in_steps():
    steps = np.arange(0, 201)
    in_steps = build_schedule(ScheduleConfig(name="wsd", warmup=20, decay=80, decay_shape="1-sqrt"), 2.0, 200)
    fractions = build_schedule(ScheduleConfig(name="wsd", unit="fraction", warmup=0.1, decay=0.4,
                                              decay_shape="1-sqrt"), 2.0, 200)
    np.testing.assert_allclose(np.asarray(fractions(steps)), np.asarray(in_steps(steps)), rtol=1e-6, atol=1e-7)
    # total as a fraction: a linear schedule that reaches its end halfway through the run
    half = build_schedule(ScheduleConfig(name="linear", unit="fraction", warmup=0.1, total=0.5), 1.0, 100)
    np.testing.assert_allclose([float(half(s)) for s in (5, 10, 30, 50, 80)], [0.5, 1.0, 0.5, 0.0, 0.0], atol=1e-6)


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 24, 599, 600, 601, 100_000])
def test_tiny_config_takes_any_number_of_steps(steps):
    config = load_run_config(CONFIGS / "tiny.yaml", [f"train.steps={steps}"])
    assert config.schedule.unit == "fraction"
    schedule = _schedule(config)
    rates = np.asarray(schedule(np.arange(steps + 1)))
    peak = config.optimizer.learning_rate
    assert np.isfinite(rates).all() and rates.min() >= 0.0 and rates.max() <= peak * (1 + 1e-6)
    assert rates[-1] == pytest.approx(0.0, abs=1e-9)  # decayed to the end of the run, however long
    if steps >= 10:  # 10% warmup, a plateau at the peak until 60% of the run, then the decay
        assert rates[int(0.3 * steps)] == pytest.approx(peak)


def test_tiny_config_at_its_own_length_keeps_the_recipe():
    config = load_run_config(CONFIGS / "tiny.yaml")
    schedule = _schedule(config)
    peak = config.optimizer.learning_rate
    # 600 steps: warmup 60, plateau to 360, then 240 steps of 1-sqrt decay (the recipe it had in steps)
    np.testing.assert_allclose([float(schedule(s)) for s in (30, 60, 360, 420, 600)],
                               [peak / 2, peak, peak, peak * 0.5, 0.0], rtol=1e-5, atol=1e-9)


def test_schedule_longer_than_the_run_names_the_fix():
    config = load_run_config(CONFIGS / "bert-base.yaml", ["train.steps=5000"])  # 10k warmup steps
    with pytest.raises(ValueError, match=r"schedule.warmup \(10000 steps\) do not fit a run of 5000 steps.*"
                                         r"schedule.unit=fraction"):
        _schedule(config)
    wsd = ScheduleConfig(name="wsd", warmup=10, decay=95)
    with pytest.raises(ValueError, match=r"warmup \+ schedule.decay \(10 \+ 95 steps\).*schedule.decay=0.2"):
        build_schedule(wsd, 1.0, 100)
    with pytest.raises(ValueError, match="sum to at most 1"):
        build_schedule(ScheduleConfig(name="wsd", unit="fraction", warmup=0.5, decay=0.6), 1.0, 100)


def test_fraction_above_one_is_a_config_error():
    with pytest.raises(ConfigError, match=r"schedule.warmup \(60.0\) is a fraction of the run"):
        load_run_config(CONFIGS / "tiny.yaml", ["schedule.warmup=60"])
    with pytest.raises(ConfigError, match="schedule.decay must be >= 0"):
        load_run_config(CONFIGS / "tiny.yaml", ["schedule.decay=-0.1"])


def test_a_setting_the_schedule_does_not_read_is_a_config_error():
    """tiny.yaml's wsd decay kept after switching to linear used to be recorded in config.yaml and do nothing."""
    with pytest.raises(ConfigError, match=r"schedule.decay: 0.4 does nothing for the 'linear' schedule .*\['wsd'\]"):
        load_run_config(CONFIGS / "tiny.yaml", ["schedule.name=linear"])
    with pytest.raises(ConfigError, match="schedule.final_lr_ratio: 0.1 does nothing for the 'constant' schedule"):
        load_run_config(CONFIGS / "tiny.yaml", ["schedule.name=constant", "schedule.decay=null",
                                                "schedule.decay_shape=linear", "schedule.final_lr_ratio=0.1"])
    with pytest.raises(ConfigError, match="schedule.name: unknown schedule 'cosin'"):
        load_run_config(CONFIGS / "tiny.yaml", ["schedule.name=cosin"])
    config = load_run_config(CONFIGS / "tiny.yaml", ["schedule.name=cosine", "schedule.decay=null",
                                                     "schedule.decay_shape=linear"])
    assert config.schedule.name == "cosine"
    with pytest.raises(ConfigError, match="tokenizer.max_lines must be at least 1"):
        load_run_config(CONFIGS / "tiny.yaml", ["tokenizer.max_lines=-5"])


def test_a_resume_that_stretches_a_fraction_schedule_warns_with_the_rate_before_and_after():
    from bertjax.train.setup import schedule_change_on_resume

    # tiny.yaml finished its 600 steps at the end of its decay; 800 steps move the decay to steps 480-800, so the
    # update after step 600 runs high up the decay again.
    config = load_run_config(CONFIGS / "tiny.yaml", ["train.steps=800"])
    finished = load_run_config(CONFIGS / "tiny.yaml")
    after, before = float(_schedule(config)(600)), float(_schedule(finished)(600))
    assert after > 100 * before
    note = schedule_change_on_resume(config, 600, 1, 600)
    assert note == (f"train.steps 600 -> 800 stretches the learning-rate schedule (schedule.unit: fraction: its warmup "
                    f"and decay are shares of train.steps): the update after the resumed step 600 runs at learning "
                    f"rate {after:.3g}, where train.steps=600 would give {before:.3g}")
    # The same schedule in steps, resumed on its plateau: the decay moves, the rate of the next update does not.
    in_steps = load_run_config(CONFIGS / "tiny.yaml", ["schedule.unit=steps", "schedule.warmup=60",
                                                       "schedule.decay=240", "train.steps=800"])
    assert schedule_change_on_resume(in_steps, 600, 1, 300) is None
