"""Learning-rate schedules, chosen by name from `SCHEDULES`. Each maps the update count (0-based) to a rate.

- "linear": linear warmup to the peak, then linear decay to the end (BERT).
- "wsd": warmup-stable-decay (trapezoidal): warmup, a long plateau at the peak, then a final decay whose shape is
  linear or 1-sqrt (ModernBERT).
- "cosine": warmup, then a half cosine down to the end.
- "constant": warmup, then the peak.

Durations are given in steps, in tokens, or as fractions of the run (`schedule.unit`); fractions are shares of
train.steps and keep a recipe valid for any run length. A schedule in tokens is a function of the tokens trained
before each update (StepClock.position, which follows the batch as it grows and the rows as they lengthen between
phases), so its warmup and decays are linear in tokens, as in ModernBERT's recipe, not in steps. Every schedule is
called with the update count and compiled into the step.
"""

from __future__ import annotations

import math
from typing import Callable

import jax.numpy as jnp
import numpy as np

from bertjax.train.run_config import ScheduleConfig

Schedule = Callable  # step (int or traced int) -> learning rate (float32)


def warmup_steps(ratio: float, total_steps: int) -> int:
    """Whole warmup steps for a warmup ratio, rounded up as transformers' TrainingArguments.get_warmup_steps: a
    recipe moved from Trainer then has its learning rate at every step (fine-tuning, train-embedder)."""
    return math.ceil(ratio * total_steps)


def _warmup(step, peak: float, warmup: float):
    """peak * step / warmup during warmup (the first update gets 0, as BERT and Hugging Face do)."""
    return peak * step / max(warmup, 1e-12)


def _fraction(step, start: float, length: float):
    """Progress through [start, start + length] clipped to [0, 1]."""
    return jnp.clip((step - start) / max(length, 1e-12), 0.0, 1.0)


def linear(peak: float, *, warmup: float, total: float, final: float, **_) -> Schedule:
    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        decay = peak + (final - peak) * _fraction(step, warmup, total - warmup)
        return jnp.where(step < warmup, _warmup(step, peak, warmup), decay)
    return schedule


def cosine(peak: float, *, warmup: float, total: float, final: float, **_) -> Schedule:
    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        x = _fraction(step, warmup, total - warmup)
        decay = final + (peak - final) * 0.5 * (1.0 + jnp.cos(jnp.pi * x))
        return jnp.where(step < warmup, _warmup(step, peak, warmup), decay)
    return schedule


def constant(peak: float, *, warmup: float, **_) -> Schedule:
    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        return jnp.where(step < warmup, _warmup(step, peak, warmup), jnp.float32(peak))
    return schedule


# Decay shapes of the final phase of "wsd": progress x in [0, 1] -> remaining share of (peak - final).
DECAY_SHAPES: dict[str, Callable] = {
    "linear": lambda x: 1.0 - x,
    "1-sqrt": lambda x: 1.0 - jnp.sqrt(x),
}


def warmup_stable_decay(peak: float, *, warmup: float, total: float, final: float, decay: float | None,
                        decay_shape: str, **_) -> Schedule:
    if decay is None:
        raise ValueError("schedule.decay is required for the 'wsd' schedule (length of the final decay)")
    shape = DECAY_SHAPES[decay_shape]
    decay_start = total - decay

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        after = final + (peak - final) * shape(_fraction(step, decay_start, decay))
        return jnp.where(step < warmup, _warmup(step, peak, warmup), after)
    return schedule


# name -> builder(peak, warmup=, total=, final=, decay=, decay_shape=) -> schedule. Add a line to add a schedule.
SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "linear": linear,
    "wsd": warmup_stable_decay,
    "cosine": cosine,
    "constant": constant,
}


class StepClock:
    """Token counts of a run whose tokens per step can change (phases, a batch warmup's staircase of segments).

    `boundaries` are the first steps of each segment (starting with 0) and `tokens_per_step` their token counts.
    """

    def __init__(self, boundaries: list[int], tokens_per_step: list[int]):
        if len(boundaries) != len(tokens_per_step) or boundaries[0] != 0:
            raise ValueError("StepClock: one tokens_per_step per phase, first phase starting at step 0")
        self.boundaries = np.asarray(boundaries, np.float64)
        self.tokens_per_step = np.asarray(tokens_per_step, np.float64)
        lengths = np.diff(self.boundaries)
        self.start_tokens = np.concatenate([[0.0], np.cumsum(lengths * self.tokens_per_step[:-1])])
        # Positions count tokens in steps of the first segment: a run whose batch never changes reads its own step
        # count, bit for bit, and float32 keeps a unit of resolution over the step counts runs have.
        self.unit = float(self.tokens_per_step[0])

    def tokens_at(self, step: float) -> float:
        phase = int(np.searchsorted(self.boundaries, step, side="right") - 1)
        return float(self.start_tokens[phase] + (step - self.boundaries[phase]) * self.tokens_per_step[phase])

    def in_units(self, tokens: float) -> float:
        """A token count on the scale of `position`."""
        return tokens / self.unit

    def position(self, step):
        """Tokens trained before update `step` (an int or a traced int), in units of the first segment's tokens per
        step: piecewise linear in the step, with a kink wherever the tokens per step change."""
        step = jnp.asarray(step, jnp.float32)
        starts = jnp.asarray(self.boundaries, jnp.float32)
        segment = jnp.clip(jnp.searchsorted(starts, step, side="right") - 1, 0, len(self.boundaries) - 1)
        offsets = jnp.asarray(self.start_tokens / self.unit, jnp.float32)
        rates = jnp.asarray(self.tokens_per_step / self.unit, jnp.float32)
        return offsets[segment] + (step - starts[segment]) * rates[segment]


def _lengths(config: ScheduleConfig, total_steps: int, clock: StepClock | None) -> tuple[float, float, float | None]:
    """(total, warmup, decay) of the schedule on the scale it is evaluated on: steps for `steps` and `fraction`,
    StepClock.position's token units for `tokens`."""
    if config.unit == "steps":
        total = float(total_steps if config.total is None else config.total)
        return total, config.warmup, config.decay
    if config.unit == "fraction":
        # Fractions of the run: the schedule stretches with train.steps (the tiny config's 10% warmup).
        total = total_steps * (1.0 if config.total is None else config.total)
        return total, config.warmup * total_steps, None if config.decay is None else config.decay * total_steps
    if clock is None:
        raise ValueError("schedule.unit 'tokens' needs the run's tokens per step")
    total_tokens = clock.tokens_at(total_steps) if config.total is None else config.total
    total = clock.in_units(total_tokens)
    # A decay length in tokens ends with the run: it starts where total_tokens - decay tokens are done.
    decay = None if config.decay is None else total - clock.in_units(max(total_tokens - config.decay, 0.0))
    return total, clock.in_units(config.warmup), decay


def _does_not_fit(config: ScheduleConfig, total_steps: int, with_decay: bool) -> ValueError:
    """The error for a schedule longer than the run, with the ways out."""
    keys = "schedule.warmup + schedule.decay" if with_decay else "schedule.warmup"
    amount = f"{config.warmup:g} + {config.decay:g}" if with_decay else f"{config.warmup:g}"
    if config.unit == "fraction":
        return ValueError(f"{keys} ({amount}) exceed the whole run: as fractions of train.steps they must sum to at "
                          "most 1")
    run = f"{total_steps} steps" if config.unit == "steps" else f"{total_steps} steps' tokens"
    example = "schedule.unit=fraction schedule.warmup=0.1" + (" schedule.decay=0.2" if with_decay else "")
    return ValueError(f"{keys} ({amount} {config.unit}) do not fit a run of {run}: shorten them, raise train.steps, "
                      f"or give them as fractions of the run, which fit any length (e.g. {example})")


def build_schedule(config: ScheduleConfig, peak: float, total_steps: int, clock: StepClock | None = None) -> Schedule:
    """The schedule of `config` for a run of `total_steps` updates at peak learning rate `peak`."""
    if config.name not in SCHEDULES:
        raise ValueError(f"schedule.name: unknown schedule {config.name!r}; known: {sorted(SCHEDULES)}")
    total, warmup, decay = _lengths(config, total_steps, clock)
    if warmup < 0 or warmup > total:
        raise _does_not_fit(config, total_steps, with_decay=False)
    if decay is not None and warmup + decay > total + 1e-9:
        raise _does_not_fit(config, total_steps, with_decay=True)
    schedule = SCHEDULES[config.name](peak, warmup=warmup, total=total, final=peak * config.final_lr_ratio,
                                      decay=decay, decay_shape=config.decay_shape)
    if config.unit != "tokens":
        return schedule
    return lambda step: schedule(clock.position(step))


def build_phased_schedule(config: ScheduleConfig, peak: float, phases: list, clock: StepClock) -> Schedule:
    """The run's schedule, with each phase that sets its own `learning_rate` or `schedule` taking over its steps.

    A phase without its own schedule follows the run's (at its own peak when it sets one: ModernBERT's context
    extension drops to a lower constant rate); a phase with one runs it from its own start, its lengths relative to
    the phase (fractions of the phase, its tokens, its steps): the decay phase's 1-sqrt to 0.001 of its peak.
    """
    from bertjax.train.phases import clock_segments, total_steps

    total = total_steps(phases)
    run = build_schedule(config, peak, total, clock)
    if all(p.learning_rate is None and p.schedule is None for p in phases):
        return run
    pieces = []
    for phase in phases:
        phase_peak = peak if phase.learning_rate is None else phase.learning_rate
        if phase.schedule is None:
            pieces.append((phase.start, run if phase_peak == peak else build_schedule(config, phase_peak, total, clock)))
            continue
        starts, tokens = clock_segments([phase])
        local = StepClock([s - phase.start for s in starts], tokens)
        try:
            own = build_schedule(phase.schedule, phase_peak, phase.end - phase.start, local)
        except ValueError as error:
            raise ValueError(f"train.phases[{phase.index}].schedule: {error}") from None
        pieces.append((phase.start, lambda step, own=own, start=phase.start: own(jnp.asarray(step) - start)))

    def schedule(step):
        rate = pieces[0][1](step)
        for start, piece in pieces[1:]:
            rate = jnp.where(jnp.asarray(step) >= start, piece(step), rate)
        return rate
    return schedule
