"""bench/step_floor.py: the FLOPs and bytes of a compiled program's kernels, read from its optimized HLO, checked
against a program whose counts are known (one matrix product and one elementwise kernel, compiled here) and a
hand-written GPU module with a Pallas (Triton) kernel call."""

import jax
import jax.numpy as jnp
import pytest

from bench.step_floor import array_bytes, kernels_of, summary


def test_a_compiled_product_and_its_epilogue():
    program = jax.jit(lambda a, b: jax.nn.relu(a @ b) * 2)
    text = program.lower(jnp.ones((64, 32)), jnp.ones((32, 16))).compile().as_text()
    kernels = kernels_of(text)
    matmul = [k for k in kernels if k.kind == "matmul"]
    assert sum(k.flops for k in matmul) == 2 * 64 * 16 * 32
    assert all(k.writes == 64 * 16 * 4 for k in kernels)  # every kernel here writes one f32 [64, 16]
    other = [k for k in kernels if k.kind == "other"]
    assert other == [] or all(k.reads <= 64 * 16 * 4 for k in other)  # XLA may fuse the epilogue into the product


GPU_MODULE = """HloModule jit_step, entry_computation_layout={(bf16[8,128]{1,0}, bf16[128,64]{1,0})->bf16[8,64]{1,0}}

%gemm_fusion (p0: bf16[8,128], p1: bf16[128,64]) -> bf16[8,64] {
  %p0 = bf16[8,128]{1,0} parameter(0)
  %p1 = bf16[128,64]{1,0} parameter(1)
  ROOT %dot.1 = bf16[8,64]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%add_fusion (q0: bf16[8,64], q1: bf16[8,64]) -> bf16[8,64] {
  %q0 = bf16[8,64]{1,0} parameter(0)
  %q1 = bf16[8,64]{1,0} parameter(1)
  ROOT %add.1 = bf16[8,64]{1,0} add(%q0, %q1)
}

ENTRY %main (x: bf16[8,128], w: bf16[128,64]) -> bf16[8,64] {
  %x = bf16[8,128]{1,0} parameter(0)
  %w = bf16[128,64]{1,0} parameter(1)
  %mm = bf16[8,64]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm_fusion, metadata={op_name="jit(step)/jvp(M)/encoder/layers_3/mlp/dot_general"}
  %attn = (bf16[8,64]{1,0}, f32[8]{0}) custom-call(%mm, %mm), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(step)/pallas_call"}
  %o = bf16[8,64]{1,0} get-tuple-element(%attn), index=0
  ROOT %sum = bf16[8,64]{1,0} fusion(%o, %mm), kind=kLoop, calls=%add_fusion, metadata={op_name="jit(step)/transpose(jvp(M))/encoder/layers_7/mlp/add"}
}
"""


def test_kernel_kinds_bytes_and_sources_of_a_gpu_module():
    kernels = {k.name: k for k in kernels_of(GPU_MODULE)}
    assert set(kernels) == {"mm", "attn", "sum"}  # parameters and tuple elements launch nothing
    assert (kernels["mm"].kind, kernels["mm"].flops) == ("matmul", 2 * 8 * 64 * 128)
    assert kernels["mm"].reads == (8 * 128 + 128 * 64) * 2 and kernels["mm"].writes == 8 * 64 * 2
    assert kernels["attn"].kind == "attention" and kernels["attn"].writes == 8 * 64 * 2 + 8 * 4
    assert (kernels["sum"].kind, kernels["sum"].source) == ("other", "backward layers_N/mlp/add")
    text = summary(list(kernels.values()), bandwidth=1e9, matmul_rate=1e12)
    assert "other kernels: write 0.0 GB" in text and "backward layers_N/mlp/add" in text
    assert array_bytes("(bf16[2,3]{1,0}, f32[4]{0}, pred[])") == 2 * 3 * 2 + 4 * 4 + 1


def test_the_norm_kernel_is_counted_apart_from_attention():
    """bertjax's residual add + norm kernel is a Triton call too: its bytes are counted as the norm kernel's, not as
    attention, and the summary gives them their own line."""
    norm_call = ('  %norm = (bf16[8,64]{1,0}, bf16[8,64]{1,0}) custom-call(%mm, %mm), '
                 'custom_call_target="__gpu$xla.gpu.triton", backend_config={name = "bertjax_add_norm_forward"}, '
                 'metadata={op_name="jit(step)/layers_3/mlp_norm/pallas_call"}\n')
    module = GPU_MODULE.replace("  %o = ", norm_call + "  %o = ")
    kernels = {k.name: k for k in kernels_of(module)}
    assert kernels["norm"].kind == "norm" and kernels["attn"].kind == "attention"
    assert kernels["norm"].reads == kernels["norm"].writes == 2 * 8 * 64 * 2
    text = summary(list(kernels.values()), bandwidth=1e9, matmul_rate=1e12)
    assert "1 Pallas attention, 1 Pallas norm, 1 other" in text
    assert "Pallas norm kernels: write 0.0 GB" in text


def test_mosaic_gpu_attention_calls_count_as_pallas_attention():
    """pallas_gpu_mosaic's kernels are Mosaic GPU custom calls, counted as the Triton ones are."""
    module = GPU_MODULE.replace('custom_call_target="__gpu$xla.gpu.triton"', 'custom_call_target="mosaic_gpu_v2"')
    kernels = {k.name: k for k in kernels_of(module)}
    assert kernels["attn"].kind == "attention" and kernels["attn"].writes == 8 * 64 * 2 + 8 * 4
    assert "1 Pallas attention, 1 other" in summary(list(kernels.values()), bandwidth=1e9, matmul_rate=1e12)


def test_profile_joins_measured_kernels_to_model_code_and_floors():
    """bench/profile_step.py's table by model code: trace events matched to the compiled kernels by their HLO op,
    summed per source beside the floor of the same kernels; anything else is counted as unmatched."""
    from bench.profile_step import by_source

    kernels = kernels_of(GPU_MODULE)
    events = [{"name": "gemm_fusion", "dur": 3000.0, "args": {"hlo_op": "mm"}},  # microseconds, over 2 steps
              {"name": "loop_add_fusion", "dur": 700.0, "args": {"hlo_op": "sum"}},
              {"name": "loop_add_fusion", "dur": 300.0, "args": {"hlo_op": "while.1::sum"}},  # nested: innermost
              {"name": "sum", "dur": 600.0},  # no args: matched by its name
              {"name": "memcpy", "dur": 400.0}]
    table = by_source(events, kernels, steps=2, bandwidth=1e6, matmul_rate=1e9, top=5)
    # the product: max(131,072 FLOP at 1 GFLOP/s, 1,024 B written at 1 MB/s) = 1.02 ms either way;
    # the add: 1,024 B written .. 3,072 B read and written = 1.02 .. 3.07 ms
    assert table.splitlines()[1:] == [
        "     1.50   1.02..1.02   layers_N/mlp/dot_general",
        "     0.80   1.02..3.07   backward layers_N/mlp/add",
        "     0.20                events not matched to a kernel of the step",
        # what was missed, beside kernels the join could have matched: enough to fix the join from a log
        "#   unmatched event: memcpy {}",
        "#   kernels of the program, e.g.: " + ", ".join(kernel.name for kernel in kernels[:5])]


def test_profile_gives_each_kernels_rate_from_its_bytes_and_time():
    from bench.profile_step import by_kernel

    # microseconds over 2 steps; the add reads two and writes one bf16[8,64] (3,072 B) a call, the product reads
    # 18,432 B and writes 1,024 B (19,456 B)
    events = [{"name": "loop_add_fusion", "dur": 1.0, "args": {"hlo_op": "sum"}},
              {"name": "sum", "dur": 2.0},  # two calls of 1.5 us: 3,072 B / 1.5 us = 0.002 TB/s
              {"name": "gemm_fusion", "dur": 9.728e-3, "args": {"hlo_op": "mm"}},  # 19,456 B in 9.7 ns: 2 TB/s
              {"name": "memcpy", "dur": 9.0}]
    assert by_kernel(events, kernels_of(GPU_MODULE), steps=2, top=5).splitlines() == [
        "  ms/step  calls  us each  MB each   TB/s  kernel (model code)",
        "     0.00    1.0      1.5      0.0   0.00  sum (backward layers_N/mlp/add)",
        "     0.00    0.5      0.0      0.0   2.00  mm (layers_N/mlp/dot_general)"]


def test_profile_events_name_their_kernel_by_hlo_op_or_by_name():
    """The join's candidates: the innermost op of `hlo_op` first, then the event's name as the HLO has it or as
    the emitted kernel has it (".N" written "_N")."""
    from bench.profile_step import kernel_names

    assert kernel_names({"name": "k", "args": {"hlo_op": "while.3::fusion.7"}})[0] == "fusion.7"
    assert "loop_add_fusion.42" in kernel_names({"name": "loop_add_fusion_42"})
    assert kernel_names({"name": "nvjet_sm90_tst_128x128"}) == ["nvjet_sm90_tst_128x128"] * 2


SLICING_MODULE = """HloModule jit_step

%rope_like (p0: bf16[4,96], p1: f32[4,32]) -> bf16[4,32] {
  %p0 = bf16[4,96]{1,0} parameter(0)
  %p1 = f32[4,32]{1,0} parameter(1)
  %b = bf16[4,3,32]{2,1,0} bitcast(%p0)
  %q = bf16[4,1,32]{2,1,0} slice(%b), slice={[0:4], [0:1], [0:32]}
  %qq = bf16[4,32]{1,0} bitcast(%q)
  %c = bf16[4,32]{1,0} convert(%p1)
  ROOT %m = bf16[4,32]{1,0} multiply(%qq, %c)
}

%whole_and_slice (r0: bf16[4,96]) -> (bf16[4,32], bf16[4,96]) {
  %r0 = bf16[4,96]{1,0} parameter(0)
  %s = bf16[4,32]{1,0} slice(%r0), slice={[0:4], [0:32]}
  %n = bf16[4,96]{1,0} negate(%r0)
  ROOT %t = (bf16[4,32]{1,0}, bf16[4,96]{1,0}) tuple(%s, %n)
}

ENTRY %main (qkv: bf16[4,96], cos: f32[4,32]) -> bf16[4,32] {
  %qkv = bf16[4,96]{1,0} parameter(0)
  %cos = f32[4,32]{1,0} parameter(1)
  %rope = bf16[4,32]{1,0} fusion(%qkv, %cos), kind=kInput, calls=%rope_like
  %both = (bf16[4,32]{1,0}, bf16[4,96]{1,0}) fusion(%qkv), kind=kLoop, calls=%whole_and_slice
  ROOT %copy = bf16[4,32]{1,0} copy(%rope)
}
"""


def test_an_operand_a_fusion_only_slices_counts_as_its_slices():
    """RoPE's fusion reads a third of the fused q/k/v projection (a slice behind a bitcast): it counts that third,
    not the whole operand; an operand also read whole counts whole."""
    kernels = {k.name: k for k in kernels_of(SLICING_MODULE)}
    assert kernels["rope"].reads == 4 * 32 * 2 + 4 * 32 * 4  # the q slice of qkv, and the whole cos table
    assert kernels["both"].reads == 4 * 96 * 2
    assert kernels["copy"].reads == 4 * 32 * 2


def test_xla_options_reach_the_compile_as_typed_values():
    """`--xla-option NAME=VALUE` (repeatable) goes to `compile()`, whose parser takes bools and ints, not text."""
    from bench.step_floor import parse_args, xla_option_value

    args = parse_args(["--xla-option", "xla_gpu_enable_triton_gemm=false", "--xla-option", "xla_gpu_autotune_level=0"])
    assert args.xla_option == ["xla_gpu_enable_triton_gemm=false", "xla_gpu_autotune_level=0"]
    assert [xla_option_value(v) for v in ("true", "False", "0", "12", "fast")] == [True, False, 0, 12, "fast"]
    with pytest.raises(SystemExit):
        parse_args(["--xla-option", "xla_gpu_autotune_level"])  # no value: an argument error, not a traceback


CUBLAS_MODULE = """HloModule jit_step, entry_computation_layout={(bf16[32,128]{1,0}, bf16[128,64]{1,0})->bf16[32,64]{1,0}}

ENTRY %main (x: bf16[32,128], w: bf16[128,64]) -> bf16[32,64] {
  %x = bf16[32,128]{1,0} parameter(0)
  %w = bf16[128,64]{1,0} parameter(1)
  %mm = (bf16[32,64]{1,0}, s8[4194304]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", \
backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_batch_dimensions":[],\
"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],"rhs_contracting_dimensions":["0"]}}}
  ROOT %out = bf16[32,64]{1,0} get-tuple-element(%mm), index=0
}
"""


def test_a_cublas_call_is_a_product_and_its_workspace_is_not_written():
    """An H100's autotuned step runs its products as cuBLAS calls (its HLO, copied back by the profile, reads so):
    FLOPs from the backend config's contraction, writes the result alone, not the cuBLAS workspace beside it."""
    [kernel] = kernels_of(CUBLAS_MODULE)
    assert (kernel.kind, kernel.flops) == ("matmul", 2 * 32 * 64 * 128)
    assert kernel.writes == 32 * 64 * 2 and kernel.reads == (32 * 128 + 128 * 64) * 2


def test_profile_reads_accelerator_streams_and_not_libtpus_custom_device(tmp_path):
    """libtpu adds a "/device:CUSTOM:Megascale Trace" process wherever it is installed: it is no accelerator, so a
    CPU trace falls back to the host threads, and a GPU trace keeps the GPU's stream alone."""
    import gzip
    import json

    from bench.profile_step import device_events

    def trace(*processes):
        events = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}
                  for pid, name in enumerate(processes)]
        events += [{"ph": "X", "name": f"kernel_{pid}", "pid": pid, "dur": 1.0} for pid in range(len(processes))]
        path = tmp_path / f"{len(processes)}.trace.json.gz"
        path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
        return str(path)

    events, names = device_events(trace("/host:CPU", "/device:CUSTOM:Megascale Trace"))
    assert names == ["host threads (no device process)"] and len(events) == 2
    events, names = device_events(trace("/host:CPU", "/device:CUSTOM:Megascale Trace", "/device:GPU:0"))
    assert names == ["/device:GPU:0"] and [e["name"] for e in events] == ["kernel_2"]


IN_PLACE_MODULE = """HloModule in_place

%update_slot (param_0: bf16[4,3,32], param_1: f32[4,1,32]) -> bf16[4,3,32] {
  %param_0 = bf16[4,3,32]{2,1,0} parameter(0)
  %param_1 = f32[4,1,32]{2,1,0} parameter(1)
  %convert = bf16[4,1,32]{2,1,0} convert(%param_1)
  %zero = s32[] constant(0)
  ROOT %dynamic_update_slice = bf16[4,3,32]{2,1,0} dynamic-update-slice(%param_0, %convert, %zero, %zero, %zero)
}

ENTRY %main (stack: bf16[4,3,32], dq: f32[4,1,32]) -> bf16[4,3,32] {
  %stack = bf16[4,3,32]{2,1,0} parameter(0)
  %dq = f32[4,1,32]{2,1,0} parameter(1)
  ROOT %slot = bf16[4,3,32]{2,1,0} fusion(%stack, %dq), kind=kLoop, calls=%update_slot
}
"""


def test_a_fusion_updating_an_operand_in_place_moves_only_the_update():
    """The one-pass attention backward stores dq into the q slot of the stacked gradient with a
    dynamic-update-slice fusion, which XLA runs in place: it reads dq and writes one slot, not the whole stack."""
    [kernel] = kernels_of(IN_PLACE_MODULE)
    assert kernel.writes == 4 * 32 * 2 and kernel.reads == 4 * 32 * 4


def test_floors_are_timed_at_the_cards_own_ceilings():
    """bench.profile_step and bench.step_floor time floors at the measured ceilings of the card they run on (or
    compile for), an H200's rather than an H100's on an H200, and say whose they are; given rates win."""
    from bench.step_floor import floor_rates

    bandwidth, rate, line = floor_rates("NVIDIA H200", None, None)
    assert (bandwidth, rate) == (4.3e12, 7.9e14) and "H200" in line
    bandwidth, rate, line = floor_rates("NVIDIA H100 80GB HBM3", None, None)
    assert (bandwidth, rate) == (3.0e12, 7.98e14) and "H100" in line
    bandwidth, rate, line = floor_rates("cpu", None, None)
    assert (bandwidth, rate) == (3.0e12, 7.98e14) and "no figures for a cpu" in line
    assert floor_rates("NVIDIA H200", 1e12, 2e14)[:2] == (1e12, 2e14)
    assert floor_rates("NVIDIA H200", 1e12, 2e14)[2].endswith(": as given")
