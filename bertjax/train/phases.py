"""The run's step plan: phases (data, model RoPE settings, learning rate) and, inside each, segments of steps at
one global batch size (a batch warmup is a staircase of segments).

A phase lasts a share of train.steps (`fraction`) or a token budget (`tokens`, ModernBERT's 1.719T / 250B / 50B);
with token budgets the steps follow from the batch sizes, so the plan is computed here once, from the config and
the number of batch shards (a warmup grows the batch by one row per device at a time), and is the same on every
resume. Learning-rate schedules count tokens through the plan (bertjax.train.schedules.StepClock), so they stay
right while the batch grows.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bertjax.train.run_config import ConfigError, RunConfig, ScheduleConfig, data_config_class, parse_dataclass, to_dict


@dataclasses.dataclass(frozen=True)
class Segment:
    start: int  # first step
    end: int  # one past the last
    global_batch_size: int  # rows per step over all processes


@dataclasses.dataclass(frozen=True)
class Phase:
    index: int
    start: int  # first step of the phase
    end: int  # one past its last step
    data: Any  # bertjax.data.DataConfig; data.global_batch_size is the phase's final batch
    name: str = ""
    model: dict = dataclasses.field(default_factory=dict)  # EncoderConfig fields replaced in this phase
    learning_rate: float | None = None  # this phase's peak (None: the optimizer's)
    schedule: ScheduleConfig | None = None  # this phase's own schedule (None: the run's continues)
    segments: tuple[Segment, ...] = ()

    @property
    def label(self) -> str:
        return self.name or f"phase {self.index}"

    @property
    def tokens_per_step(self) -> int:
        """At the phase's final batch."""
        return self.data.global_batch_size * self.data.seq_len

    def batch_at(self, step: int) -> int:
        """Global rows of update `step` (0-based)."""
        for segment in self.segments:
            if segment.start <= step < segment.end:
                return segment.global_batch_size
        return self.segments[-1].global_batch_size

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({segment.global_batch_size for segment in self.segments})


def plan_phases(config: RunConfig, batch_shards: int = 1) -> list[Phase]:
    """The run's phases (one when train.phases is empty), covering steps [0, total_steps(phases)).

    `batch_shards`: devices the batch is split over (data * fsdp); a batch warmup grows by that many rows times
    optimizer.accumulation_steps a stair, so that every stair splits into the microbatches of every shard.
    """
    if not config.train.phases:
        steps = config.train.steps
        return [Phase(0, 0, steps, config.data, segments=(Segment(0, steps, config.data.global_batch_size),))]
    base = to_dict(config.data)
    phases, start, cumulative = [], 0, 0.0
    for i, spec in enumerate(config.train.phases):
        where = f"train.phases[{i}]"
        data = parse_dataclass(data_config_class(), {**base, **spec.data}, f"{where}.data")
        end = None
        if spec.fraction is not None:
            cumulative += spec.fraction
            end = config.train.steps if i == len(config.train.phases) - 1 else int(round(cumulative * config.train.steps))
        segments = _segments(spec, data, start, end, batch_shards * config.optimizer.accumulation_steps, where)
        schedule = None if spec.schedule is None else parse_dataclass(ScheduleConfig, spec.schedule, f"{where}.schedule")
        end = segments[-1].end if segments else start
        phases.append(Phase(i, start, end, data, name=spec.name, model=dict(spec.model),
                            learning_rate=spec.learning_rate, schedule=schedule, segments=tuple(segments)))
        start = end
    return phases


def _segments(spec, data, start: int, end: int | None, shards: int, where: str) -> list[Segment]:
    """Steps at each batch size: the warmup's staircase (rows grow with the phase's trained tokens), then the final
    batch until the phase ends (`end`, or when `spec.tokens` are trained)."""
    final, seq_len = data.global_batch_size, data.seq_len
    warmup = spec.batch_warmup
    if warmup is not None:
        if warmup.start % shards or final % shards or warmup.start >= final:
            raise ConfigError(f"{where}.batch_warmup.start ({warmup.start}) must be below the phase's "
                              f"data.global_batch_size ({final}), both multiples of the batch shards (data*fsdp) "
                              f"times optimizer.accumulation_steps ({shards})")
        increments = (final - warmup.start) // shards
    segments: list[Segment] = []
    step, tokens = start, 0.0

    def add(rows: int, steps: int) -> None:
        nonlocal step, tokens
        if steps > 0:
            segments.append(Segment(step, step + steps, rows))
            step, tokens = step + steps, tokens + steps * rows * seq_len

    def room(rows: int, wanted: int) -> int:
        """`wanted` steps cut to what is left of the phase."""
        if end is not None:
            return min(wanted, end - step)
        return min(wanted, math.ceil((spec.tokens - tokens) / (rows * seq_len)))

    while warmup is not None and (step < end if end is not None else tokens < spec.tokens):
        k = int(increments * tokens / warmup.tokens)
        if k >= increments:
            break
        rows = warmup.start + k * shards
        threshold = warmup.tokens * (k + 1) / increments
        add(rows, room(rows, max(1, math.ceil((threshold - tokens) / (rows * seq_len)))))
    add(final, room(final, end - step if end is not None else math.ceil(max(spec.tokens - tokens, 0) / (final * seq_len))))
    if not segments:
        raise ConfigError(f"{where}: the phase gets no steps; give it a larger share or token budget")
    return segments


def phase_at(phases: list[Phase], step: int) -> Phase:
    """The phase that trains step `step` (0-based: the step-th update); past the end, the last one."""
    for phase in phases:
        if phase.start <= step < phase.end:
            return phase
    return phases[-1]


def total_steps(phases: list[Phase]) -> int:
    return phases[-1].end


def clock_segments(phases: list[Phase]) -> tuple[list[int], list[int]]:
    """(first step, tokens per step) of every constant-batch segment: what bertjax.train.schedules.StepClock reads."""
    starts, tokens = [], []
    for phase in phases:
        for segment in phase.segments:
            starts.append(segment.start)
            tokens.append(segment.global_batch_size * phase.data.seq_len)
    return starts, tokens
