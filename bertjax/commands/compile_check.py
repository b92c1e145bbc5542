"""`bertjax compile-check --config PATH --topology v5p:2x2x2 [key=value ...]`: compile the full sharded train
step of a run config for a TPU slice, on a machine without one, and print what each chip would hold.

The step is the one `bertjax pretrain` runs (same model, optimizer, mesh rules, shardings and donation), lowered
for abstract arguments and compiled by XLA for the topology's chips (libtpu + `jax.experimental.topologies`, see
bertjax/tpu_aot.py). Nothing is allocated and no data is read: the vocabulary size is the config's
(tokenizer.vocab_size unless the model overrides it). "auto" attention means what it means on TPU (the Pallas
kernels). Every phase with its own row length or batch is compiled.
"""

from __future__ import annotations

import argparse
import time

HELP = "ahead-of-time compile a run config's sharded train step for a TPU topology and print per-chip memory"

# HBM per chip, GiB, by the topology name's generation prefix (for the "fits" line).
HBM_GIB = {"v4": 32, "v5e": 16, "v5litepod": 16, "v5p": 95, "v6e": 32}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="PATH", help="YAML run config (configs/pretrain/)")
    parser.add_argument("--topology", default="v5p:2x2x2", help='TPU slice, e.g. "v5p:2x2x2", "v5e:4x4" '
                        '(default v5p:2x2x2, 8 chips)')
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. data.global_batch_size=64 mesh.fsdp=8")


def run(args: argparse.Namespace) -> int:
    import jax

    from bertjax import tpu_aot
    from bertjax.ops.attention import AUTO_BY_PLATFORM
    from bertjax.data import batch_sharding, batch_spec
    from bertjax.models import MODEL_CLASSES
    from bertjax.train import feed as feed_lib
    from bertjax.train import flops as flops_lib
    from bertjax.train import mesh as mesh_lib
    from bertjax.train.optimizers import build_optimizer
    from bertjax.train.run_config import ScheduleConfig, load_run_config
    from bertjax.train.schedules import StepClock, build_schedule
    from bertjax.train.state import abstract_state, count_params
    from bertjax.train.step import make_train_step
    from bertjax.config import get_config

    config = load_run_config(args.config, args.overrides)
    # The run trains its tokenizer (vocabulary of tokenizer.vocab_size, [PAD] = 0) unless the model overrides these.
    overrides = {"vocab_size": config.tokenizer.vocab_size, "pad_token_id": 0, **config.model.overrides}
    if overrides.get("attention_implementation", "auto") == "auto":
        overrides["attention_implementation"] = AUTO_BY_PLATFORM["tpu"]
    model_config = get_config(config.model.preset, **overrides)
    model = MODEL_CLASSES[config.model.head](model_config, remat_policy=config.model.remat_policy)
    with_nsp = config.model.head == "pretraining"

    devices = tpu_aot.topology_devices(args.topology)
    mesh = mesh_lib.build_mesh(config.mesh, devices)
    phases = feed_lib.plan_phases(config)
    feed_lib.check_batch_fits(phases, mesh, config.optimizer.accumulation_steps)
    clock = StepClock(feed_lib.boundaries(phases), feed_lib.tokens_per_step(phases))
    try:
        schedule = build_schedule(config.schedule, config.optimizer.learning_rate, config.train.steps, clock)
    except ValueError as error:
        # The schedule's numbers do not change the compiled program (the step computes the rate from a traced
        # step count), so a schedule that no longer fits an overridden batch size need not block the check.
        print(f"note: {error}; compiling with a constant learning rate instead")
        schedule = build_schedule(ScheduleConfig(name="constant"), config.optimizer.learning_rate,
                                  config.train.steps)
    optimizer = build_optimizer(config.optimizer, schedule)
    state = abstract_state(model, optimizer, mesh)
    # `abstract_state` places the state by the mesh rules; the step is built from those same shardings.
    shardings = jax.tree.map(lambda x: x.sharding, state)
    step = make_train_step(model, optimizer, schedule, mesh, shardings, with_nsp=with_nsp,
                           accumulation_steps=config.optimizer.accumulation_steps, seed=config.train.seed)

    kind = devices[0].device_kind
    print(f"{config.model.preset} ({count_params(state.params) / 1e6:.1f}M parameters, {model_config.dtype} "
          f"compute, attention {model_config.attention_implementation}, remat {config.model.remat_policy}) on "
          f"{args.topology}: {len(devices)} x {kind}, mesh {dict(mesh.shape)}")
    hbm = next((gib for prefix, gib in HBM_GIB.items() if args.topology.startswith(prefix + ":")), None)
    seen, failed = set(), False
    for phase in phases:
        key = (phase.data.seq_len, phase.data.global_batch_size, phase.data.predictions_per_row)
        if key in seen:
            continue
        seen.add(key)
        batch = {name: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, mesh_lib.BATCH_AXES))
                 for name, (shape, dtype) in batch_spec(phase.data, process_count=1).items()}
        start = time.perf_counter()
        try:
            compiled = step.lower(state, batch).compile()
        except jax.errors.JaxRuntimeError as error:
            if "RESOURCE_EXHAUSTED" not in str(error):
                raise
            # XLA's buffer assignment found the step larger than a chip's HBM: the answer to this check.
            print(f"\nphase {phase.index}: {phase.data.global_batch_size} rows x {phase.data.seq_len} tokens does "
                  f"NOT fit: {str(error).splitlines()[0]}\n  try a smaller data.global_batch_size, more chips, "
                  f"mesh.fsdp, or model.remat_policy=full")
            failed = True
            continue
        seconds = time.perf_counter() - start
        tokens = phase.data.global_batch_size * phase.data.seq_len
        model_flops = flops_lib.train_flops(model_config, seq_len=phase.data.seq_len, tokens=tokens,
                                            predictions=phase.data.global_batch_size * phase.data.predictions_per_row,
                                            rows=phase.data.global_batch_size, with_nsp=with_nsp)
        print(f"\nphase {phase.index}: {phase.data.global_batch_size} rows x {phase.data.seq_len} tokens "
              f"(compiled in {seconds:.0f} s; {model_flops / len(devices) / 1e12:.1f} TFLOP per chip per step)")
        kernels = compiled.as_text().count("tpu_custom_call")
        print(f"  Pallas/Mosaic kernel calls in the program: {kernels}")
        print(tpu_aot.memory_report(compiled))
        stats = compiled.memory_analysis()
        if hbm is not None and stats is not None:
            used = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
                    + stats.temp_size_in_bytes) / 2**30
            print(f"  {'fits' if used < hbm else 'does NOT fit'} in {hbm} GiB of HBM per chip "
                  f"({100 * used / hbm:.0f}%)")
    return 1 if failed else 0
