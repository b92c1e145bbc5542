"""Learning-rate schedules: exact values at the steps where their pieces meet."""

import numpy as np
import pytest

from bertjax.train.run_config import ScheduleConfig
from bertjax.train.schedules import StepClock, build_schedule, warmup_steps


def _values(config: ScheduleConfig, steps, total=110, peak=1.0, clock=None):
    schedule = build_schedule(config, peak, total, clock)
    return [float(schedule(s)) for s in steps]


def test_linear_warmup_then_linear_decay():
    got = _values(ScheduleConfig(name="linear", warmup=10), [0, 5, 10, 60, 110, 150])
    np.testing.assert_allclose(got, [0.0, 0.5, 1.0, 0.5, 0.0, 0.0], atol=1e-7)


def test_linear_decays_to_final_ratio():
    got = _values(ScheduleConfig(name="linear", warmup=10, final_lr_ratio=0.1), [10, 60, 110], peak=2.0)
    np.testing.assert_allclose(got, [2.0, 1.1, 0.2], rtol=1e-6)


@pytest.mark.parametrize("shape, at_quarter", [("linear", 0.75), ("1-sqrt", 0.5)])
def test_warmup_stable_decay(shape, at_quarter):
    # warmup 10, plateau to step 80, then 20 steps of decay: a quarter of the way down the decay (step 85) the
    # linear shape keeps 3/4 of the peak and 1-sqrt keeps 1 - sqrt(1/4) = 1/2.
    config = ScheduleConfig(name="wsd", warmup=10, decay=20, decay_shape=shape)
    got = _values(config, [0, 5, 10, 50, 80, 85, 100], total=100)
    np.testing.assert_allclose(got, [0.0, 0.5, 1.0, 1.0, 1.0, at_quarter, 0.0], atol=1e-6)


def test_cosine():
    got = _values(ScheduleConfig(name="cosine", warmup=10, final_lr_ratio=0.0), [10, 60, 110])
    np.testing.assert_allclose(got, [1.0, 0.5, 0.0], atol=1e-6)


def test_constant_after_warmup():
    np.testing.assert_allclose(_values(ScheduleConfig(name="constant", warmup=4), [0, 2, 4, 100]),
                               [0.0, 0.5, 1.0, 1.0], atol=1e-7)


def test_durations_in_tokens_across_phases():
    # 100 steps: steps 0-89 carry 1000 tokens each (90k), steps 90-99 carry 4000 (40k); 130k tokens in all.
    clock = StepClock([0, 90], [1000, 4000])
    np.testing.assert_allclose([clock.position(45), clock.position(92)], [45.0, 98.0])  # in 1000-token units
    assert clock.tokens_at(100) == 130_000
    # Warmup 10k tokens = 10 steps; decay the last 40k tokens = the last 10 steps (the 512-token phase).
    config = ScheduleConfig(name="wsd", unit="tokens", warmup=10_000, decay=40_000)
    got = _values(config, [5, 10, 89, 90, 95, 100], total=100, clock=clock)
    np.testing.assert_allclose(got, [0.5, 1.0, 1.0, 1.0, 0.5, 0.0], atol=1e-6)


def test_schedule_errors_name_the_key():
    with pytest.raises(ValueError, match="schedule.name"):
        build_schedule(ScheduleConfig(name="triangle"), 1.0, 10)
    with pytest.raises(ValueError, match="schedule.decay"):
        build_schedule(ScheduleConfig(name="wsd", warmup=1), 1.0, 10)
    with pytest.raises(ValueError, match="schedule.warmup"):
        build_schedule(ScheduleConfig(name="linear", warmup=20), 1.0, 10)


def test_durations_in_tokens_are_linear_in_tokens_while_the_batch_grows():
    # A batch warmup's staircase: steps 0-9 carry 100 tokens (1000 in all), 10-19 carry 200 (3000), then 400.
    clock = StepClock([0, 10, 20], [100, 200, 400])
    # Warmup 3000 tokens ends at step 20; at step 10 a third of them are trained (the step count says half).
    warmup = ScheduleConfig(name="constant", unit="tokens", warmup=3000)
    got = _values(warmup, [0, 5, 10, 15, 20, 25], total=30, clock=clock)
    np.testing.assert_allclose(got, [0.0, 1 / 6, 1 / 3, 2 / 3, 1.0, 1.0], atol=1e-6)
    # A decay over the last 5000 of the run's 7000 tokens starts at step 15 (2000 tokens) and is linear in tokens.
    decay = ScheduleConfig(name="wsd", unit="tokens", warmup=1000, decay=5000, decay_shape="linear")
    got = _values(decay, [10, 15, 20, 25, 30], total=30, clock=clock)
    np.testing.assert_allclose(got, [1.0, 1.0, 0.8, 0.4, 0.0], atol=1e-6)


@pytest.mark.parametrize("name", ["linear", "wsd", "cosine", "constant"])
def test_durations_in_tokens_at_a_constant_batch_equal_the_same_schedule_in_steps_bit_for_bit(name):
    # 128 tokens a step: warmup 1280 tokens = 10 steps, decay 2560 tokens = 20 steps, 100 steps in all.
    steps = list(range(0, 106))
    in_steps = _values(ScheduleConfig(name=name, warmup=10, decay=20), steps, total=100)
    in_tokens = _values(ScheduleConfig(name=name, unit="tokens", warmup=1280, decay=2560), steps, total=100,
                        clock=StepClock([0], [128]))
    assert np.asarray(in_tokens, np.float32).tobytes() == np.asarray(in_steps, np.float32).tobytes()


def test_warmup_ratio_gives_whole_steps_rounded_up_as_transformers_trainer():
    # TrainingArguments.get_warmup_steps: ceil(ratio * steps). MRPC at batch 32 x 3 epochs: 345 steps -> 35.
    assert [warmup_steps(0.1, n) for n in (345, 234, 16, 10, 0)] == [35, 24, 2, 1, 0]
    assert warmup_steps(0.0, 100) == 0 and warmup_steps(1.0, 7) == 7
