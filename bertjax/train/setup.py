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
from bertjax.data import batch_spec
from bertjax.train import feed as feed_lib
from bertjax.train import mesh as mesh_lib
from bertjax.train.objectives import Objective, ObjectiveError, build_objective
from bertjax.train.optimizers import build_optimizer
from bertjax.train.run_config import ConfigError, RunConfig, ScheduleConfig
from bertjax.train.schedules import StepClock, build_phased_schedule, build_schedule
from bertjax.train.state import TrainState, abstract_state, create_train_state, state_shardings
from bertjax.train.step import JittedStep, make_eval_step, make_train_step
from bertjax.train.unused_params import unused_parameters


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
    unused: frozenset[str] = frozenset()  # parameters no phase's loss depends on: weight decay skips them

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
                       attention_platform: str | None = None, seq_len_key: str = "data.seq_len",
                       sep_id: int | None = None) -> EncoderConfig:
    """The preset with its overrides; vocabulary size and pad id follow the tokenizer unless overridden, and so
    does what depends on them: a family that numbers positions after the padding id (RoBERTa's offset pad + 1,
    which its export requires) and a Longformer's separator id (where its heads put global attention by default).

    `attention_platform` resolves "auto" attention for a platform other than this machine's (compile-check).
    `seq_len_key` names the setting `max_seq_len` comes from in the error when it does not fit (a phase's).
    """
    overrides = dict(config.model.overrides)
    overrides.setdefault("vocab_size", vocab_size)
    overrides.setdefault("pad_token_id", pad_id)
    if overrides["vocab_size"] < vocab_size:
        raise ConfigError(f"model.overrides.vocab_size ({overrides['vocab_size']}) is smaller than the tokenizer's "
                          f"vocabulary ({vocab_size})")
    preset = get_config(config.model.preset)
    if preset.position_offset and preset.position_offset == preset.pad_token_id + 1:
        overrides.setdefault("position_offset", overrides["pad_token_id"] + 1)
    model_config = get_config(config.model.preset, **overrides)
    chosen = overrides.get("longformer")
    if sep_id is not None and model_config.longformer is not None and not (
            chosen is not None and (not isinstance(chosen, dict) or "sep_token_id" in chosen)):
        longformer = dataclasses.replace(model_config.longformer, sep_token_id=sep_id)
        model_config = model_config.replace(longformer=longformer)
    if model_config.param_dtype != "float32":  # as fine-tuning and train-embedder keep them
        raise ConfigError(f"model.overrides.param_dtype={model_config.param_dtype!r}: pretraining keeps float32 "
                          "master weights (in bfloat16 most updates round away: a norm scale stays exactly 1 at lr "
                          "5e-4); model.overrides.dtype=bfloat16 computes in bfloat16")
    if attention_platform is not None and model_config.attention_implementation == "auto":
        # The platform's best implementation that serves this model's attention (ALiBi needs one that adds it).
        from bertjax.ops.attention import required_features, resolve_implementation
        windows = {model_config.layer_window(i) for i in range(model_config.num_layers)} - {None}
        features = required_features(heads=model_config.num_heads, kv_heads=model_config.kv_heads,
                                     local_window=min(windows) if windows else None,
                                     alibi=model_config.position_embedding == "alibi")
        model_config = model_config.replace(
            attention_implementation=resolve_implementation("auto", features, attention_platform))
    disentangled = model_config.disentangled
    if attention_platform is not None and disentangled is not None and disentangled.implementation == "auto":
        # Else DeBERTa's "auto" would resolve at trace time for this machine's backend, not the target's.
        from bertjax.ops import disentangled_attention
        model_config = model_config.replace(disentangled=disentangled.replace(
            implementation=disentangled_attention.resolve_implementation(
                "auto", max_seq_len, disentangled.block_size, attention_platform)))
    longest = max_seq_len + model_config.position_offset
    if longest > model_config.max_position_embeddings:
        raise ConfigError(f"{seq_len_key} ({max_seq_len}) does not fit the model's max_position_embeddings "
                          f"({model_config.max_position_embeddings}); lower it or raise "
                          "model.overrides.max_position_embeddings")
    return model_config


def _kernels(model: EncoderConfig) -> list[tuple[str, str, str, dict, list[str]]]:
    """(field, chosen name, its interpret field, {name: platforms} of the registry's platform-bound kernels, every
    name the field takes) for each kernel choice of the model; each registry declares its own platforms."""
    from bertjax.ops import disentangled_attention, glu, normalize
    from bertjax.ops.attention import IMPLEMENTATIONS as ATTENTION  # (bertjax.ops.attention is also the function)

    kernels = [
        ("attention_implementation", model.attention_implementation, "attention_interpret",
         {n: i.platforms for n, i in ATTENTION.items() if i.platforms is not None}, ["auto", *ATTENTION]),
        ("norm_implementation", model.norm_implementation, "norm_interpret", normalize.PLATFORMS,
         list(normalize.IMPLEMENTATIONS)),
        ("glu_implementation", model.glu_implementation, "glu_interpret", glu.PLATFORMS, list(glu.IMPLEMENTATIONS)),
    ]
    if model.disentangled is not None:
        kernels.append(("disentangled.implementation", model.disentangled.implementation, "attention_interpret",
                        disentangled_attention.PLATFORMS, ["auto", *disentangled_attention.IMPLEMENTATIONS]))
    return kernels


def check_kernels_run_on(config: RunConfig, platform: str) -> None:
    """Every kernel the run's model (and each phase's) names must compile for `platform` (this machine's backend, or
    the one compile-check compiles for), unless it runs in interpret mode: checked before any workdir file is
    written, naming the key, where Pallas would fail in the first step with a message naming neither."""
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

        for field, name, interpret, platforms, names in _kernels(model):
            if name in platforms and platform not in platforms[name] and not getattr(model, interpret):
                able = [names[0]] * (names[0] == "auto") + sorted(
                    n for n in names if n != "auto" and (n not in platforms or platform in platforms[n]))
                raise ConfigError(f"{key(field)}: {name!r} runs only on {'/'.join(sorted(platforms[name]))}, but "
                                  f"this run's platform is {platform}; what runs on {platform}: {able} (or set "
                                  f"{key(interpret)}=true to run the Pallas kernel in interpret mode: slow, for "
                                  "tests)")


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


def schedule_change_on_resume(config: RunConfig, held_steps: int, batch_shards: int, step: int) -> str | None:
    """The warning for a resume whose train.steps differs from the workdir's (`held_steps`) and so moves the
    learning rate of the next update, `step`: a `fraction` schedule stretches over the new length (a finished run
    extended climbs back up its decay), a linear or cosine decay ends elsewhere. None when the rate is the same."""
    held = dataclasses.replace(config, train=dataclasses.replace(config.train, steps=held_steps))
    try:
        before = float(_schedule(held, feed_lib.plan_phases(held, batch_shards), lenient=False)(step))
    except (ValueError, ConfigError):  # the old length no longer plans (phases of token budgets ignore it)
        return None
    after = float(_schedule(config, feed_lib.plan_phases(config, batch_shards), lenient=False)(step))
    if abs(after - before) <= 1e-6 * max(abs(after), abs(before)):
        return None
    how = ("stretches the learning-rate schedule (schedule.unit: fraction: its warmup and decay are shares of "
           "train.steps)" if config.schedule.unit == "fraction" else "moves the end of the learning-rate schedule")
    return (f"train.steps {held_steps} -> {config.train.steps} {how}: the update after the resumed step {step} runs "
            f"at learning rate {after:.3g}, where train.steps={held_steps} would give {before:.3g}")


def setup_run(config: RunConfig, *, vocab_size: int, pad_id: int, devices: Sequence | None = None,
              attention_platform: str | None = None, compile_only: bool = False,
              sep_id: int | None = None) -> RunSetup:
    """Everything a run needs but the data feed and the state itself.

    `compile_only`: no weights are loaded (a teacher is abstract) and a schedule that no longer fits an
    overridden batch falls back to a constant rate (compile-check).
    """
    check_kernels_run_on(config, attention_platform or jax.default_backend())
    mesh = mesh_lib.build_mesh(config.mesh, devices)
    phases = feed_lib.plan_phases(config, mesh_lib.batch_shards(mesh))
    objectives = _phase_objectives(config, phases, vocab_size, pad_id, attention_platform, sep_id)
    objective = objectives[0]
    for phase, phase_objective in zip(phases, objectives):
        check_objective_data(phase_objective, [phase] if len(phases) > 1 else phases)
    feed_lib.check_batch_fits(phases, mesh, config.optimizer.accumulation_steps)
    schedule = _schedule(config, phases, lenient=compile_only)
    try:
        frozen, frozen_shardings = objective.frozen_params(mesh, abstract=compile_only)
    except ObjectiveError as error:
        raise ConfigError(str(error)) from None
    unused = _unused_parameters(objectives, phases, frozen)
    optimizer = build_optimizer(config.optimizer, schedule, unused)
    _, shardings = state_shardings(objective.init_params, optimizer, mesh)
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
                    phase_steps=phase_steps, unused=unused)


def _unused_parameters(objectives: list[Objective], phases: list, frozen: Any) -> frozenset[str]:
    """The parameters no phase's loss depends on, which weight decay leaves alone as PyTorch's optimizers do
    (Longformer's global projections when no token attends globally): traced on each distinct objective's batch."""
    abstract_frozen = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), frozen)
    unused = None
    for phase, objective in {id(o): (p, o) for p, o in zip(phases, objectives)}.values():
        batch = {name: jax.ShapeDtypeStruct(shape, dtype)
                 for name, (shape, dtype) in batch_spec(phase.data, process_count=1).items()}
        found = unused_parameters(
            lambda params, frozen, batch, key: objective.loss_sums(params, frozen, batch, key, deterministic=False),
            objective.abstract_params(), abstract_frozen, batch, jax.random.key(0))
        unused = found if unused is None else unused & found
    return unused


def _phase_objectives(config: RunConfig, phases: list, vocab_size: int, pad_id: int,
                      attention_platform: str | None, sep_id: int | None) -> list[Objective]:
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
            own = config.train.phases and "seq_len" in config.train.phases[longest.index].data
            seq_len_key = f"train.phases[{longest.index}].data.seq_len" if own else "data.seq_len"
            try:
                model_config = build_model_config(
                    phased, vocab_size=vocab_size, pad_id=pad_id, attention_platform=attention_platform,
                    max_seq_len=longest.data.seq_len, seq_len_key=seq_len_key, sep_id=sep_id)
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
