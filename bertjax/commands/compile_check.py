"""`bertjax compile-check --config PATH --topology v5p:2x2x2 [key=value ...]`: compile the full sharded train
step of a run config for a TPU slice or for NVIDIA GPUs (`--topology h100`, `h100:8`, `h200`), on a machine
without one, and print what each chip would hold.

The step is the one `bertjax pretrain` runs (same model, optimizer, mesh rules, shardings and donation), lowered
for abstract arguments and compiled by XLA for the topology's chips (`jax.experimental.topologies`: libtpu for TPU,
bertjax/tpu_aot.py; JAX's CUDA plugin for GPU, bertjax/gpu_aot.py). Nothing is allocated and no data is read: the
vocabulary size is the config's (tokenizer.vocab_size unless the model overrides it). "auto" attention means what
it means on that platform (the Pallas kernels). Every phase with its own row length or batch is compiled.
"""

from __future__ import annotations

import argparse
import time

HELP = "ahead-of-time compile a run config's sharded train step for a TPU or GPU topology, print per-chip memory"

# HBM per chip, GiB, by the topology name's generation prefix (for the "fits" line).
HBM_GIB = {"v4": 32, "v5e": 16, "v5litepod": 16, "v5p": 95, "v6e": 32}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="PATH",
                        help="a YAML run config file, or the name of one shipped with bertjax (configs/pretrain/: "
                        "tiny, modernbert-base, ...)")
    parser.add_argument("--topology", default="v5p:2x2x2", help='TPU slice, e.g. "v5p:2x2x2", "v5e:4x4" '
                        '(default v5p:2x2x2, 8 chips), or GPUs on one host: "h100", "h100:8", "h200"')
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. data.global_batch_size=64 mesh.fsdp=8")


def run(args: argparse.Namespace) -> int:
    import jax

    from bertjax import gpu_aot, tpu_aot
    from bertjax.data import batch_sharding, batch_spec
    from bertjax.train import mesh as mesh_lib
    from bertjax.train.run_config import load_run_config
    from bertjax.train.setup import setup_run
    from bertjax.train.state import count_params, unsplit_parameters_note

    config = load_run_config(args.config, args.overrides)
    on_gpu = gpu_aot.is_gpu_topology(args.topology)
    # A missing compiler is a one-line error of the command (what to install), not a traceback.
    if on_gpu and not gpu_aot.cuda_plugin_available():
        raise ValueError(gpu_aot.INSTALL_HINT)
    if not on_gpu and not tpu_aot.libtpu_available():
        raise ValueError(tpu_aot.INSTALL_HINT)
    devices = gpu_aot.gpu_devices(args.topology) if on_gpu else tpu_aot.topology_devices(args.topology)
    # The run trains its tokenizer (vocabulary of tokenizer.vocab_size, [PAD] = 0) unless the model overrides these.
    setup = setup_run(config, vocab_size=config.tokenizer.vocab_size, pad_id=0, devices=devices,
                      attention_platform="gpu" if on_gpu else "tpu", compile_only=True)
    model_config, mesh, objective = setup.model_config, setup.mesh, setup.objective
    state = setup.abstract_state()

    kind = devices[0].device_kind
    print(f"{config.model.preset}, objective {objective.name} ({count_params(state.params) / 1e6:.1f}M trainable "
          f"parameters, {model_config.dtype} compute, attention {model_config.attention_implementation}"
          f"{' on the stacked q/k/v' if model_config.attention_fused_qkv else ''}, norm "
          f"{model_config.norm_implementation}, GLU {model_config.glu_implementation}, remat "
          f"{config.model.remat_policy}) on {args.topology}: {len(devices)} x {kind}, mesh {dict(mesh.shape)}")
    note = unsplit_parameters_note(objective.init_params, mesh)
    if note is not None:
        print(f"warning: {note}")
    hbm = next((gib for prefix, gib in HBM_GIB.items() if args.topology.lower().startswith(prefix + ":")), None)
    if on_gpu:  # what JAX's allocator may take of the card, not the card
        hbm = gpu_aot.device_memory_gib(args.topology) * gpu_aot.jax_memory_fraction()
    # How each platform's program names a Pallas kernel call (Mosaic on TPU, Triton on GPU).
    kernel_marker = "__gpu$xla.gpu.triton" if on_gpu else "tpu_custom_call"
    seen, failed = {}, False
    for phase in setup.phases:
        # Phases with the same shapes and the same model (RoPE thetas) run the same program: compiled once.
        train_step = setup.steps_for(phase)[0]
        key = (phase.data.seq_len, phase.data.global_batch_size, phase.data.predictions_per_row, id(train_step))
        if key in seen:
            print(f"\nphase {phase.index}: the same program as phase {seen[key]} (same shapes and model)")
            continue
        seen[key] = phase.index
        batch = {name: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, mesh_lib.BATCH_AXES))
                 for name, (shape, dtype) in batch_spec(phase.data, process_count=1).items()}
        start = time.perf_counter()
        try:
            lowered = train_step.lower(state, setup.frozen, batch)
            compiled = gpu_aot.compile_lowered(lowered) if on_gpu else lowered.compile()
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
        model_flops = objective.train_flops(seq_len=phase.data.seq_len, tokens=tokens,
                                            predictions=phase.data.global_batch_size * phase.data.predictions_per_row,
                                            rows=phase.data.global_batch_size)
        print(f"\nphase {phase.index}: {phase.data.global_batch_size} rows x {phase.data.seq_len} tokens "
              f"(compiled in {seconds:.0f} s; {model_flops / len(devices) / 1e12:.1f} TFLOP per chip per step)")
        kernels = compiled.as_text().count(kernel_marker)
        print(f"  Pallas kernel calls in the program ({'Triton' if on_gpu else 'Mosaic'}): {kernels}")
        print(tpu_aot.memory_report(compiled))
        stats = compiled.memory_analysis()
        if hbm is not None and stats is not None:
            used = tpu_aot.device_bytes(stats) / 2**30
            where = (f"the {hbm:.1f} GiB JAX may use of each GPU (XLA_PYTHON_CLIENT_MEM_FRACTION "
                     f"{gpu_aot.jax_memory_fraction():g})" if on_gpu else f"{hbm} GiB of HBM per chip")
            print(f"  {'fits' if used < hbm else 'does NOT fit'} in {where} ({100 * used / hbm:.0f}%)")
    return 1 if failed else 0
