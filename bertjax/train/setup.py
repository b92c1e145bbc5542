"""One run setup from a run config: model config, objective, phases, mesh, schedule, optimizer, state shardings
and the jitted steps. The pretraining loop, `bertjax compile-check`, the train-step benchmark and the sharding
test all build their run here, so what they compile is the same program.

    setup = setup_run(config, vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id)
    state = setup.fresh_state()                      # or restore into setup.abstract_state()
    state, metrics = setup.train_step(state, setup.frozen, batch)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax

from bertjax.config import EncoderConfig, get_config
from bertjax.train import feed as feed_lib
from bertjax.train import mesh as mesh_lib
from bertjax.train.objectives import Objective, ObjectiveError, build_objective
from bertjax.train.optimizers import build_optimizer
from bertjax.train.run_config import ConfigError, RunConfig, ScheduleConfig
from bertjax.train.schedules import StepClock, build_phased_schedule, build_schedule
from bertjax.train.state import TrainState, abstract_state, create_train_state, state_shardings
from bertjax.train.step import JittedStep, make_eval_step, make_train_step


@dataclasses.dataclass
class RunSetup:
    config: RunConfig
    model_config: EncoderConfig
    objective: Objective
    phases: list  # bertjax.train.feed.Phase
    mesh: Any
    schedule: Any
    optimizer: Any
    shardings: TrainState  # where every leaf of the train state lives
    frozen: Any  # the objective's frozen parameters, placed ({} for most objectives; abstract for compile-only)
    frozen_shardings: Any
    train_step: JittedStep  # of the first phase
    eval_step: JittedStep
    phase_steps: list  # (train_step, eval_step) of each phase: phases changing the model (RoPE) have their own

    def steps_for(self, phase) -> tuple[JittedStep, JittedStep]:
        return self.phase_steps[phase.index]

    def fresh_state(self) -> TrainState:
        """Initial state for train.seed, warm-started by the objective (a student from its teacher)."""
        state, _ = create_train_state(self.objective.init_params, self.optimizer, self.mesh, self.config.train.seed)
        warm = jax.jit(self.objective.warm_start, out_shardings=self.shardings.params)
        params = warm(state.params, self.frozen)
        if self.config.model.init_from is not None:
            from bertjax.train.init_from import initial_params
            params = initial_params(self.config.model.init_from, self.model_config, params, self.shardings.params)
        return state.replace(params=params)

    def abstract_state(self) -> TrainState:
        """ShapeDtypeStructs with shardings: what a checkpoint restores into, or what AOT compiles against."""
        return abstract_state(self.objective.init_params, self.optimizer, self.mesh)


def build_model_config(config: RunConfig, *, vocab_size: int, pad_id: int, max_seq_len: int,
                       attention_platform: str | None = None, seq_len_key: str = "data.seq_len") -> EncoderConfig:
    """The preset with its overrides; vocabulary size and pad id follow the tokenizer unless overridden.

    `attention_platform` resolves "auto" attention for a platform other than this machine's (compile-check).
    `seq_len_key` names the setting `max_seq_len` comes from in the error when it does not fit (a phase's).
    """
    overrides = dict(config.model.overrides)
    overrides.setdefault("vocab_size", vocab_size)
    overrides.setdefault("pad_token_id", pad_id)
    if overrides["vocab_size"] < vocab_size:
        raise ConfigError(f"model.overrides.vocab_size ({overrides['vocab_size']}) is smaller than the tokenizer's "
                          f"vocabulary ({vocab_size})")
    model_config = get_config(config.model.preset, **overrides)
    if attention_platform is not None and model_config.attention_implementation == "auto":
        # The platform's best implementation that serves this model's attention (ALiBi needs one that adds it).
        from bertjax.ops.attention import required_features, resolve_implementation
        windows = {model_config.layer_window(i) for i in range(model_config.num_layers)} - {None}
        features = required_features(heads=model_config.num_heads, kv_heads=model_config.kv_heads,
                                     local_window=min(windows) if windows else None,
                                     alibi=model_config.position_embedding == "alibi")
        model_config = model_config.replace(
            attention_implementation=resolve_implementation("auto", features, attention_platform))
    longest = max_seq_len + model_config.position_offset
    if longest > model_config.max_position_embeddings:
        raise ConfigError(f"{seq_len_key} ({max_seq_len}) does not fit the model's max_position_embeddings "
                          f"({model_config.max_position_embeddings}); lower it or override the model's")
    return model_config


# Kernels of the model's other fields that compile for one platform only (their registries, bertjax.ops.normalize
# and bertjax.ops.glu, name modules only): field -> (its interpret field, {implementation: platforms}). Attention's
# platforms are declared with its implementations (bertjax.ops.attention.IMPLEMENTATIONS).
OTHER_KERNEL_PLATFORMS: dict[str, tuple[str, dict[str, frozenset[str]]]] = {
    "norm_implementation": ("norm_interpret", {"pallas_gpu": frozenset({"gpu"})}),
    "glu_implementation": ("glu_interpret", {"pallas_gpu": frozenset({"gpu"})}),
}
DISENTANGLED_PLATFORMS = {"pallas_gpu": frozenset({"gpu"})}  # DeBERTa's disentangled.implementation


def check_kernels_run_on(config: RunConfig, platform: str) -> None:
    """Every kernel the run's model (and each phase's) names must compile for `platform` (this machine's backend, or
    the one compile-check compiles for), unless it runs in interpret mode: checked before any workdir file is
    written, naming the key, where Pallas would fail in the first step with a message naming neither."""
    from bertjax.ops.attention import IMPLEMENTATIONS, runs_on_platform

    sources = [({}, None)] + [(phase.model, i) for i, phase in enumerate(config.train.phases) if phase.model]
    for phase_model, index in sources:
        try:
            model = get_config(config.model.preset, **{**config.model.overrides, **phase_model})
        except ValueError:
            continue  # run_config refuses it, naming the key

        def key(field: str) -> str:
            if index is not None and field.split(".")[0] in phase_model:
                return f"train.phases[{index}].model.{field}"
            return f"model.overrides.{field}"

        refused = None
        implementation = IMPLEMENTATIONS.get(model.attention_implementation)
        if implementation is not None and not implementation.runs_on(platform) and not model.attention_interpret:
            refused = ("attention_implementation", "attention_interpret", model.attention_implementation,
                       implementation.platforms, runs_on_platform(platform))
        for field, (interpret, platforms) in OTHER_KERNEL_PLATFORMS.items():
            name = getattr(model, field)
            if refused is None and name in platforms and platform not in platforms[name] \
                    and not getattr(model, interpret):
                able = sorted(n for n in ("xla", *platforms) if n not in platforms or platform in platforms[n])
                refused = (field, interpret, name, platforms[name], able)
        dis = model.disentangled
        if refused is None and dis is not None and dis.implementation in DISENTANGLED_PLATFORMS \
                and platform not in DISENTANGLED_PLATFORMS[dis.implementation] and not model.attention_interpret:
            refused = ("disentangled.implementation", "attention_interpret", dis.implementation,
                       DISENTANGLED_PLATFORMS[dis.implementation], ["auto", "blockwise", "dense"])
        if refused is not None:
            field, interpret, name, platforms, able = refused
            raise ConfigError(f"{key(field)}: {name!r} runs only on {'/'.join(sorted(platforms))}, but this run's "
                              f"platform is {platform}; what runs on {platform}: {able} (or set {key(interpret)}=true "
                              "to run the Pallas kernel in interpret mode: slow, for tests)")


def check_objective_data(objective: Objective, phases: list) -> None:
    """Every phase's data must produce the batch keys the objective reads (before anything compiles)."""
    from bertjax.data import batch_spec

    for phase in phases:
        where = "data" if len(phases) == 1 else f"train.phases[{phase.index}].data"
        try:
            objective.check_data(phase.data, set(batch_spec(phase.data)), where)
        except ObjectiveError as error:
            raise ConfigError(str(error)) from None


def _schedule(config: RunConfig, phases: list, lenient: bool):
    clock = StepClock(feed_lib.boundaries(phases), feed_lib.tokens_per_step(phases))
    try:
        return build_phased_schedule(config.schedule, config.optimizer.learning_rate, phases, clock)
    except ValueError as error:
        if not lenient:
            raise
        # The schedule's numbers do not change the compiled program (the step computes the rate from a traced
        # step count), so a schedule that no longer fits an overridden batch need not block a compile check.
        print(f"note: {error}; compiling with a constant learning rate instead")
        return build_schedule(ScheduleConfig(name="constant"), config.optimizer.learning_rate,
                              feed_lib.total_steps(phases))


def setup_run(config: RunConfig, *, vocab_size: int, pad_id: int, devices: Sequence | None = None,
              attention_platform: str | None = None, compile_only: bool = False) -> RunSetup:
    """Everything a run needs but the data feed and the state itself.

    `compile_only`: no weights are loaded (a teacher is abstract) and a schedule that no longer fits an
    overridden batch falls back to a constant rate (compile-check).
    """
    check_kernels_run_on(config, attention_platform or jax.default_backend())
    mesh = mesh_lib.build_mesh(config.mesh, devices)
    phases = feed_lib.plan_phases(config, mesh_lib.batch_shards(mesh))
    objectives = _phase_objectives(config, phases, vocab_size, pad_id, attention_platform)
    objective = objectives[0]
    for phase, phase_objective in zip(phases, objectives):
        check_objective_data(phase_objective, [phase] if len(phases) > 1 else phases)
    feed_lib.check_batch_fits(phases, mesh, config.optimizer.accumulation_steps)
    schedule = _schedule(config, phases, lenient=compile_only)
    optimizer = build_optimizer(config.optimizer, schedule)
    _, shardings = state_shardings(objective.init_params, optimizer, mesh)
    try:
        frozen, frozen_shardings = objective.frozen_params(mesh, abstract=compile_only)
    except ObjectiveError as error:
        raise ConfigError(str(error)) from None
    steps: dict[int, tuple[JittedStep, JittedStep]] = {}  # phases with the same model share their jitted steps
    for phase_objective in objectives:
        if id(phase_objective) not in steps:
            steps[id(phase_objective)] = (
                make_train_step(phase_objective, optimizer, schedule, mesh, shardings, frozen_shardings,
                                accumulation_steps=config.optimizer.accumulation_steps, seed=config.train.seed,
                                nonfinite=config.train.nonfinite),
                make_eval_step(phase_objective, mesh, shardings.params, frozen_shardings))
    phase_steps = [steps[id(o)] for o in objectives]
    return RunSetup(config=config, model_config=objective.model_config, objective=objective, phases=phases,
                    mesh=mesh, schedule=schedule, optimizer=optimizer, shardings=shardings, frozen=frozen,
                    frozen_shardings=frozen_shardings, train_step=phase_steps[0][0], eval_step=phase_steps[0][1],
                    phase_steps=phase_steps)


def _phase_objectives(config: RunConfig, phases: list, vocab_size: int, pad_id: int,
                      attention_platform: str | None) -> list[Objective]:
    """The objective of each phase: the run's model with the phase's `model` fields (RoPE thetas), one object per
    distinct model. A phase may change how the model computes, never the shapes of its parameters."""
    by_model: dict[str, Objective] = {}
    objectives = []
    for phase in phases:
        key = repr(sorted(phase.model.items()))
        if key not in by_model:
            where = "model" if not phase.model else f"train.phases[{phase.index}].model"
            try:
                phased = dataclasses.replace(config, model=dataclasses.replace(
                    config.model, overrides={**config.model.overrides, **phase.model}))
            except ConfigError as error:  # run_config checks a phase's model fields; this is a safety net
                raise ConfigError(f"{where}: {error}") from None
            # The longest rows this model trains on, and the setting that asks for them (a phase's, when phased).
            longest = max((p for p in phases if repr(sorted(p.model.items())) == key), key=lambda p: p.data.seq_len)
            seq_len_key = (f"train.phases[{longest.index}].data.seq_len" if config.train.phases
                           else "data.seq_len")
            try:
                model_config = build_model_config(
                    phased, vocab_size=vocab_size, pad_id=pad_id, attention_platform=attention_platform,
                    max_seq_len=longest.data.seq_len, seq_len_key=seq_len_key)
                by_model[key] = build_objective(config.objective, model_config, config.model.remat_policy)
            except ObjectiveError as error:
                raise ConfigError(str(error)) from None
            except ConfigError:  # names its key already (a phase's data.seq_len)
                raise
            except ValueError as error:  # a phase's model fields that the preset refuses
                if not phase.model:
                    raise
                raise ConfigError(f"{where}: {error}") from None
            if objectives:
                _check_same_parameters(objectives[0], by_model[key], where)
        objectives.append(by_model[key])
    return objectives


def _check_same_parameters(first: Objective, other: Objective, where: str) -> None:
    shapes = [jax.tree.map(lambda x: (x.shape, x.dtype), o.abstract_params()) for o in (first, other)]
    if shapes[0] != shapes[1]:
        raise ConfigError(f"{where}: a phase may change how the model computes (RoPE theta, window, positions it "
                          "accepts) but not the shapes of its parameters")
