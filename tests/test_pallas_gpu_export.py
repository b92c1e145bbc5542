"""The Pallas GPU (Triton) attention kernels lower for CUDA on this CPU-only machine (`jax.export` for platform
"cuda": nothing is compiled or run), so a GPU session finds no lowering failure left to fix.

Interpret mode (tests/test_attention_kernels.py, test_attention_features.py) checks what the kernels compute; it
runs them as jaxprs and enforces none of Triton's rules. Here:
- each feature (global, window 128, GQA, ALiBi, Longformer's global tokens), bfloat16 and float32, head_dim 64 and
  80 (padded to 128 by the wrapper), forward and forward + backward, exports with exactly the kernels it should
  have: one Triton call forward, three (forward, dq, dk/dv) with the gradient. Counting the calls proves the
  kernels were lowered, not replaced by an XLA fallback. Packed segment ids are an operand of every call (data, not
  a different program), so every export covers packing;
- the Triton IR inside the calls (the HLO carries it for XLA to compile) obeys what Triton checks only when it
  compiles: every tensor dimension a power of two, every `tt.dot` operand >= 16 on each side with both operands of
  one dtype (bf16 or f32) and an f32 accumulator, and float32 dots at full precision (no TF32: `_dot` promises HIGHEST);
- with the `triton` package importable (a test dependency), that IR is compiled for sm_90 (H100) and each kernel's
  shared memory compared with the H100's 227 KB per block (skipped otherwise; Triton's pip compiler is a proxy for
  the one inside XLA, not the same build): every bfloat16 kernel, float32's forward (its backward kernels spill so
  much that compiling them took a minute of the suite; tests/test_gpu_kernels.py compiles them on a GPU);
- a whole jitted train step of a tiny ModernBERT MLM in bfloat16 (the step `bertjax pretrain` runs, from
  setup_run) and the jitted inference and embedding forwards export with the kernels in them. The configs name
  "pallas_gpu": "auto" resolves by jax.default_backend(), which is "cpu" while exporting.
- under a mesh the kernels run per device (bertjax/ops/per_device.py): exported for 4 abstract H100s, each Triton
  call takes one device's shard; in interpret mode on 4 host devices, results match and nothing is gathered.
JAX 0.10 lowers Triton for CUDA on a CPU-only machine (assuming sm_90); JAX 0.11 asks the device for its compute
capability: without a GPU the exports run on an abstract H100 (tests/gpu_export_helpers.py), except the train step
(a mesh of CPU devices), which skips there; on a GPU machine (`JAX_PLATFORMS=cuda,cpu`) they lower for it. Checked
with JAX 0.11.2 (the lent GPU machines' version) in a separate environment: 24 passed, the train step skipped.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from bertjax import ops
from bench import pallas_gpu_static as static
from gpu_export_helpers import (abstract_h100_mesh, export_for_cuda, triton_ir, triton_kernels,
                                triton_operand_shapes)

FORWARD, DQ, DKV = "bertjax_flash_forward", "bertjax_flash_dq", "bertjax_flash_dkv"
H100_SHARED_BYTES = 227 * 1024  # the most dynamic shared memory one block may opt into on sm_90


def gradient_kernels(program, head_dim: int) -> dict:
    """{kernel name: (Triton IR, warps, stages)} of a bench.pallas_gpu_static gradient program lowered for one row
    of 256 tokens, 2 heads of head_dim, in bfloat16."""
    q = jax.ShapeDtypeStruct((1, 256, 2, head_dim), jnp.bfloat16)
    return {name: (text, warps, stages) for name, text, warps, stages in
            triton_ir(program, q, q, q, jax.ShapeDtypeStruct((1, 256), jnp.int32))}


def attention_inputs(dtype, head_dim: int, *, heads: int = 4, kv_heads: int = 4, seq: int = 256, batch: int = 2):
    q = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), dtype)
    kv = jax.ShapeDtypeStruct((batch, seq, kv_heads, head_dim), dtype)
    return q, kv, kv, jax.ShapeDtypeStruct((batch, seq), jnp.int32), jax.ShapeDtypeStruct((batch, seq), jnp.bool_)


ALIBI = np.asarray([2.0 ** -(i + 1) for i in range(4)], np.float32)
# name -> (kv_heads, attention keyword arguments); `global_tokens` takes the traced mask operand.
FEATURES = {
    "global": (4, dict(local_window=None)),
    "local128": (4, dict(local_window=128)),
    "gqa": (1, dict(local_window=128)),
    "alibi": (4, dict(local_window=128, alibi_slopes=ALIBI)),
    "global_tokens": (4, dict(local_window=128, global_tokens=True, max_global_tokens=4)),
    "everything": (2, dict(local_window=128, alibi_slopes=ALIBI, global_tokens=True, max_global_tokens=4)),
}


def attention_program(features: dict, grad: bool, implementation: str = "pallas_gpu"):
    """f(q, k, v, segment_ids, global_mask): the attention output, or the gradient of a loss to q, k and v."""
    features = dict(features)
    use_global = features.pop("global_tokens", False)

    def forward(q, k, v, segment_ids, global_mask):
        return ops.attention(q, k, v, segment_ids=segment_ids, implementation=implementation,
                             global_tokens=global_mask if use_global else None, **features)

    if not grad:
        return forward

    def loss(q, k, v, segment_ids, global_mask):
        return jnp.sum(forward(q, k, v, segment_ids, global_mask).astype(jnp.float32) ** 2)

    return jax.grad(loss, argnums=(0, 1, 2))


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
@pytest.mark.parametrize("feature", FEATURES)
def test_each_feature_lowers_to_its_triton_kernels(feature, grad):
    kv_heads, features = FEATURES[feature]
    exported = export_for_cuda(attention_program(features, grad), *attention_inputs(jnp.bfloat16, 64,
                                                                                    kv_heads=kv_heads))
    assert triton_kernels(exported) == (sorted([FORWARD, DQ, DKV]) if grad else [FORWARD])


@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_dtypes_and_padded_head_dim_lower(dtype, head_dim):
    exported = export_for_cuda(attention_program(FEATURES["everything"][1], grad=True),
                               *attention_inputs(dtype, head_dim, kv_heads=2))
    assert triton_kernels(exported) == sorted([FORWARD, DQ, DKV])
    # The kernels see the head dimension padded to a power of two: 80 -> 128.
    padded = 64 if head_dim == 64 else 128
    element = "bf16" if dtype == jnp.bfloat16 else "f32"
    assert f"x2x{padded}x{element}>" in exported.mlir_module()


def test_operands_past_32_bit_offsets_are_refused():
    """The kernels' Triton IR offsets pointers by i32, so q with 2**31 elements (per device) would wrap around: the
    wrapper refuses it by name (lowering alone would not notice). Traced only: nothing is allocated."""
    big = jax.ShapeDtypeStruct((2 ** 15, 256, 4, 64), jnp.bfloat16)  # 2**31 elements
    seg = jax.ShapeDtypeStruct((2 ** 15, 256), jnp.int32)
    with pytest.raises(ValueError, match="32-bit offsets"):
        jax.eval_shape(lambda q, s: ops.attention(q, q, q, segment_ids=s, implementation="pallas_gpu"), big, seg)


# tt.dot %a, %b, %acc[, inputPrecision = p] : tensor<MxKxT> * tensor<KxNxT> -> tensor<MxNxT'>
DOT = re.compile(r"tt\.dot [^:]*?(?:inputPrecision = (\w+))?[^:]*: tensor<(\d+)x(\d+)x(\w+)> \* "
                 r"tensor<(\d+)x(\d+)x(\w+)> -> tensor<\d+x\d+x(\w+)>")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_triton_ir_obeys_tritons_shape_and_dot_rules(dtype):
    """What Triton checks only when it compiles (interpret mode checks none of it), for every kernel at the
    default blocks, with the padded head dim and every feature on."""
    kernels = triton_ir(attention_program(FEATURES["everything"][1], grad=True),
                        *attention_inputs(dtype, 80, kv_heads=2))
    assert sorted(name for name, *_ in kernels) == sorted([FORWARD, DQ, DKV])
    element = "bf16" if dtype == jnp.bfloat16 else "f32"
    for name, text, _, _ in kernels:
        for dims in re.findall(r"tensor<((?:\d+x)+)", text):
            for size in map(int, dims.rstrip("x").split("x")):
                assert size & (size - 1) == 0, f"{name}: tensor dimension {size} is not a power of two"
        dots = DOT.findall(text)
        assert len(dots) >= 2, name
        for precision, m, k, a_type, k2, n, b_type, acc_type in dots:
            assert k == k2 and min(int(m), int(k), int(n)) >= 16, (name, m, k, n)
            assert a_type == b_type == element and acc_type == "f32", (name, a_type, b_type, acc_type)
            if dtype == jnp.float32:
                assert precision in ("", "ieee"), f"{name}: float32 dot at {precision} precision, not full"


def deberta_v3_program(dtype):
    """Gradient program of DeBERTa-v3's disentangled attention on the GPU kernel (256 buckets: 512-wide tables)."""
    from bertjax.ops import disentangled_attention as da

    seq, span = 256, 256
    q = jax.ShapeDtypeStruct((1, seq, 2, 64), dtype)
    pos = jax.ShapeDtypeStruct((2 * span, 2, 64), dtype)
    seg = jnp.ones((1, seq), jnp.int32)

    def loss(q, k, v, pos_key, pos_query):
        out = da.disentangled_attention(q, k, v, pos_key, pos_query, segment_ids=seg, span=span, buckets=256,
                                        max_position=512, implementation="pallas_gpu")
        return jnp.sum(out.astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2, 3, 4)), (q, q, q, pos, pos)


@pytest.mark.parametrize("kernels", ["flash", "disentangled"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_kernels_compile_for_sm90_within_shared_memory(dtype, kernels):
    """Needs the `triton` package (a test dependency; skipped without it): the Triton IR compiles to a cubin for
    sm_90 and each kernel's shared memory, at the default blocks and num_stages, fits one H100 block: the flash
    kernels at the widest common head_dim (128), DeBERTa-v3's disentangled kernels at its 512-wide relative tables.
    Triton 3.9 (Nov 2026) measured, bytes, num_stages 2 (the wrappers' default) / 3, flash kernels at 64 x 64
    tiles:
      head_dim 64:  bf16 forward 41,216 / 57,856, dq 49,408 / 66,048, dk/dv 41,728 / 58,880;
                    f32 forward 65,792 / 98,816, dq 82,176 / 115,200, dk/dv 49,920 / 83,456;
      head_dim 128: bf16 forward 82,176 / 115,200, dq 98,560 / 131,584, dk/dv 82,688 / 116,224;
                    f32 forward 115,200 / 180,992, dq 147,712 / 213,504, dk/dv 99,072 / 165,376
    (window 128, no GQA/ALiBi); disentangled (forward 32-row tiles, backward 16, 512-wide tables, num_stages 2):
    bf16 forward 28,800, dq 32,768, dk/dv 32,768; f32 41,088, 35,908, 37,572.
    Of float32's flash kernels only the forward (inference) is compiled here; its dq and dk/dv are lowered above.
    At head_dim 128 they spill tens of kilobytes per thread, and LLVM and ptxas took a minute of the suite's two
    cores on them, for a path that trains in bfloat16 (tests/test_gpu_kernels.py compiles and runs them on a GPU)."""
    pytest.importorskip("triton")
    if kernels == "flash":
        program, args = attention_program(FEATURES["everything"][1], grad=True), attention_inputs(dtype, 128,
                                                                                                 kv_heads=2)
    else:
        program, args = deberta_v3_program(dtype)
    compiled_kernels = triton_ir(program, *args)
    assert len(compiled_kernels) == 3
    if kernels == "flash" and dtype == jnp.float32:
        compiled_kernels = [kernel for kernel in compiled_kernels if kernel[0] == FORWARD]
    for name, text, warps, stages in compiled_kernels:
        compiled = static.compile_for_sm90(name, text, warps, stages)
        assert compiled.asm["cubin"], name
        assert compiled.metadata.shared <= H100_SHARED_BYTES, (name, compiled.metadata.shared)
        if kernels == "flash":
            # bfloat16 tile products on Hopper's wgmma (float32 at full precision has no tensor-core instruction;
            # the disentangled kernel's 32- and 16-row tiles are under wgmma's 64), and three loops per kernel (masked /
            # fully visible / masked tiles).
            assert ("wgmma.mma_async" in compiled.asm["ptx"]) == (dtype == jnp.bfloat16), name
            assert len(static.loop_bodies(compiled.asm["ptx"])) == 3, name


def test_backward_settings_reach_only_the_backward_kernels():
    """backward_block_q/_k and backward_num_warps/_stages launch dq and dk/dv alone: the forward keeps 64 x 64 tiles
    and 4 warps. The setting is bench/pallas_gpu_static's candidate against dk/dv's spills at head_dim 128 (128 x 64,
    8 warps; docs/benchmarks.md, "Backward tiles"): with `triton` importable, dq and dk/dv compile for sm_90 within
    an H100 block's shared memory (bf16 131,328 and 148,992 B, triton 3.9) and ptxas reports their registers."""
    backward = dict(backward_block_q=128, backward_block_k=64, backward_num_warps=8, backward_num_stages=2)
    kernels = gradient_kernels(static.attention_gradient("local", 64, 64, 4, 2, **backward), 128)
    assert [(name, kernels[name][1:]) for name in (FORWARD, DQ, DKV)] == [(FORWARD, (4, 2)), (DQ, (8, 2)),
                                                                         (DKV, (8, 2))]
    # A 128-row q tile of head_dim 128 exists only in the backward kernels (dq holds it, dk/dv streams it).
    assert "tensor<128x128xbf16" not in kernels[FORWARD][0]
    assert all("tensor<128x128xbf16" in kernels[name][0] for name in (DQ, DKV))
    pytest.importorskip("triton")
    for name in (DQ, DKV):
        compiled = static.compile_for_sm90(name, *kernels[name])
        assert compiled.metadata.shared <= H100_SHARED_BYTES, (name, compiled.metadata.shared)
        assert 0 < static.ptxas_resources(compiled.asm["ptx"])["registers"] <= 255, name


def test_dkv_settings_reach_only_the_dkv_kernel():
    """dkv_* launch the dk/dv kernel alone, on transposed tiles: dq holds 128 queries and steps through 32 keys
    ([128, 32] scores), dk/dv holds 128 keys and steps through 32 queries ([128, 32] transposed scores, no
    [32, 128] tile), each kernel with its own warps; with `triton` importable, both compile for sm_90 within an
    H100 block's shared memory."""
    tiles = dict(backward_block_q=128, backward_block_k=32, dkv_block_q=32, dkv_block_k=128, dkv_num_warps=8)
    kernels = gradient_kernels(static.attention_gradient("global", 64, 64, 4, 3, **tiles), 64)
    assert [(name, kernels[name][1:]) for name in (FORWARD, DQ, DKV)] == [(FORWARD, (4, 3)), (DQ, (4, 3)),
                                                                         (DKV, (8, 3))]
    for name in (DQ, DKV):
        assert "tensor<128x32xf32" in kernels[name][0] and "tensor<32x128xf32" not in kernels[name][0], name
    pytest.importorskip("triton")
    for name in (DQ, DKV):
        compiled = static.compile_for_sm90(name, *kernels[name])
        assert compiled.metadata.shared <= H100_SHARED_BYTES, (name, compiled.metadata.shared)


ONE_PASS = "bertjax_flash_backward_one_pass"


@pytest.mark.parametrize("dtype, feature", [(jnp.bfloat16, "everything"), (jnp.float32, "everything"),
                                            (jnp.bfloat16, "local128")], ids=["bf16", "f32", "bf16_local128"])
def test_one_pass_backward_lowers_alone_and_compiles_to_relaxed_reductions(dtype, feature):
    """"pallas_gpu_atomic": the forward and the one-pass backward, no dq or dk/dv kernel. With `triton` importable,
    at head_dim 64 it compiles for sm_90 within an H100 block's shared memory, its dq sums as relaxed atomic adds:
    pl_triton's atomic_add would be acquire-release, each wrapped by ptxas in a GPU-wide barrier and an L1
    invalidation (bertjax/ops/triton_atomics.py). ModernBERT's layers (window 128 or global, no ALiBi) do not spill
    (bf16: 246-250 registers, 83,968 B at 3 stages, triton 3.9); with ALiBi, GQA and global tokens together it
    spills 40 B. In float32 it is lowered, not compiled: dq's atomics add into a float32 buffer in either dtype, and
    the float32 kernel's spills made its compile the suite's slowest minute."""
    program = attention_program(FEATURES[feature][1], grad=True, implementation="pallas_gpu_atomic")
    kernels = triton_ir(program, *attention_inputs(dtype, 64, kv_heads=FEATURES[feature][0]))
    assert sorted(name for name, *_ in kernels) == sorted([FORWARD, ONE_PASS])
    if dtype == jnp.float32:
        return
    triton = pytest.importorskip("triton")
    [(name, text, warps, stages)] = [kernel for kernel in kernels if kernel[0] == ONE_PASS]
    compiled = static.compile_for_sm90(name, text, warps, stages)
    ptx = compiled.asm["ptx"]
    assert compiled.metadata.shared <= H100_SHARED_BYTES, compiled.metadata.shared
    # triton 3.9 emits the sum as a reduction (red); 3.8 as an atomic whose unused result still takes registers
    # (atom). Either is relaxed, with no memory fence around it (wgmma's proxy fences are not about memory order).
    atomics = set(re.findall(r"\b(?:red|atom)\.[a-z0-9.]+", ptx))
    forms = ("red",) if tuple(map(int, triton.__version__.split(".")[:2])) >= (3, 9) else ("red", "atom")
    assert atomics and all(op.startswith(forms) and ".gpu.relaxed.add." in op for op in atomics), atomics
    assert not re.search(r"acq_rel|membar|fence\.(?:sc|acq_rel)", ptx)
    if dtype == jnp.bfloat16 and feature == "local128":
        resources = static.ptxas_resources(ptx)
        assert resources["registers"] <= 255 and resources["spill_stores"] == 0, resources


def test_glu_kernels_compile_for_sm90_without_spills():
    """The gated MLP's kernels at modernbert-base's width, their default tiles: one forward and one backward Triton
    kernel, and with `triton` importable, each compiles for sm_90 within 255 registers and no stack (37 / 72 with
    triton 3.9)."""
    from bertjax.ops import pallas_gpu_glu

    def loss(y):
        return jnp.sum(pallas_gpu_glu.glu(y, "gelu").astype(jnp.float32))

    kernels = triton_ir(jax.value_and_grad(loss), jax.ShapeDtypeStruct((4096, 2, 1152), jnp.bfloat16))
    assert [name for name, *_ in kernels] == ["bertjax_glu_forward", "bertjax_glu_backward"]
    pytest.importorskip("triton")
    for name, text, warps, stages in kernels:
        resources = static.ptxas_resources(static.compile_for_sm90(name, text, warps, stages).asm["ptx"])
        assert resources["registers"] <= 255 and resources["stack"] == 0, (name, resources)


@pytest.mark.parametrize("head_dim, warps_and_stages", [(64, (4, 3)), (128, (8, 2))])
def test_default_pipelining_depth_follows_the_head_dim(head_dim, warps_and_stages):
    """Left unset, num_stages is 3 up to head_dim 64 (what the H100 sweep of 2026-11-26 chose) and 2 above it (not
    timed on a GPU), for all three kernels; at head_dim 64 the 3-stage kernels compile for sm_90 within an H100
    block's shared memory (with `triton` importable)."""
    kernels = gradient_kernels(static.attention_gradient("global", 64, 64, None, None), head_dim)
    assert {name: kernels[name][1:] for name in (FORWARD, DQ, DKV)} == dict.fromkeys((FORWARD, DQ, DKV),
                                                                                  warps_and_stages)
    if head_dim == 64:
        pytest.importorskip("triton")
        for name in (FORWARD, DQ, DKV):
            assert static.compile_for_sm90(name, *kernels[name]).metadata.shared <= H100_SHARED_BYTES, name


# (mesh shape, axis names, q/k/v spec, under the train logical rules): a data-parallel mesh, and data x tensor.
SHARDED_LAYOUTS = {
    "data4": ((4,), ("data",), P("data", None, None, None), False),
    "data2_tensor2": ((2, 1, 2), ("data", "fsdp", "tensor"), P(("data", "fsdp"), None, "tensor", None), True),
}


@pytest.mark.parametrize("implementation", ["pallas_gpu", "pallas_gpu_atomic"])
@pytest.mark.parametrize("layout", SHARDED_LAYOUTS)
def test_sharded_export_gives_each_triton_call_one_devices_shard(layout, implementation):
    """pallas_gpu under a mesh runs in a shard_map (bertjax/ops/per_device.py, as pallas_tpu): exported for 4 abstract
    H100s (no devices needed), every Triton call takes one device's shard of batch (8 rows) and heads (4 query, 2
    kv), so XLA has nothing to gather. Without the shard_map they took the whole batch and XLA's partitioner
    all-gathered q, k and v onto every GPU. The one-pass backward's float32 dq sum is one device's shard too."""
    import contextlib

    import flax.linen as nn
    from bertjax.train import mesh as mesh_lib

    shape, names, qkv_spec, rules = SHARDED_LAYOUTS[layout]
    mesh = abstract_h100_mesh(shape, names)
    rows, qkv = NamedSharding(mesh, P(qkv_spec[0], None)), NamedSharding(mesh, qkv_spec)
    q = jax.ShapeDtypeStruct((8, 256, 4, 64), jnp.bfloat16, sharding=qkv)
    kv = jax.ShapeDtypeStruct((8, 256, 2, 64), jnp.bfloat16, sharding=qkv)
    seg, glob = (jax.ShapeDtypeStruct((8, 256), dtype, sharding=rows) for dtype in (jnp.int32, jnp.bool_))
    with jax.sharding.use_abstract_mesh(mesh), (nn.logical_axis_rules(mesh_lib.LOGICAL_AXIS_RULES) if rules
                                                else contextlib.nullcontext()):
        program = attention_program(FEATURES["everything"][1], grad=True, implementation=implementation)
        exported = export_for_cuda(program, q, kv, kv, seg, glob)
    assert exported.nr_devices == 4
    assert triton_kernels(exported) == sorted([FORWARD, DQ, DKV] if implementation == "pallas_gpu"
                                              else [FORWARD, ONE_PASS])
    batch, heads = (2, 4) if layout == "data4" else (4, 2)
    assert triton_operand_shapes(exported) == [(batch, 256, heads // 2, 64), (batch, 256, heads, 64)]


def test_sharded_disentangled_export_gives_each_triton_call_one_devices_shard():
    """DeBERTa's disentangled kernel likewise (pallas_gpu_disentangled.py, data-parallel over 4 abstract H100s):
    [batch, heads, seq, dim] blocks and [.., seq, 2 * span] tables of one device (2 of the 8 rows)."""
    from bertjax.ops import disentangled_attention as da

    mesh = abstract_h100_mesh((4,), ("data",))
    by_rows = NamedSharding(mesh, P("data"))
    q = jax.ShapeDtypeStruct((8, 128, 2, 64), jnp.bfloat16, sharding=by_rows)
    pos = jax.ShapeDtypeStruct((512, 2, 64), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
    seg = jax.ShapeDtypeStruct((8, 128), jnp.int32, sharding=by_rows)

    def loss(q, k, v, pos_key, pos_query, seg):
        out = da.disentangled_attention(q, k, v, pos_key, pos_query, segment_ids=seg, span=256, buckets=256,
                                        max_position=512, implementation="pallas_gpu")
        return jnp.sum(out.astype(jnp.float32))

    with jax.sharding.use_abstract_mesh(mesh):
        exported = export_for_cuda(jax.grad(loss, argnums=(0, 1, 2, 3, 4)), q, q, q, pos, pos, seg)
    assert exported.nr_devices == 4 and len(triton_kernels(exported)) == 3
    assert triton_operand_shapes(exported) == [(2, 2, 128, 64), (2, 2, 128, 512)]


def test_under_a_mesh_interpret_mode_matches_and_gathers_nothing():
    """The same under a real mesh of 4 host devices, in interpret mode (a subprocess:
    tests/pallas_sharding_script.py): data-parallel and data x tensor under the train rules, every feature on; output
    and q/k/v gradients equal the unsharded call and the compiled program gathers nothing (the loss's sum is the
    only all-reduce). The inference runner over 4 devices, DeBERTa's disentangled kernel (gradients to the
    position tables too), the residual add + norm kernel (its scale's and bias's partial sums are added across
    devices by the one all-reduce), attention on the stacked q/k/v projection (batch and heads split) and the gated
    MLP's kernel (batch and features split), likewise. And attention under a mesh of explicit axes (jax.make_mesh's
    default) with replicated inputs."""
    import json
    import os
    import subprocess
    import sys

    from train_helpers import cpu_env

    env = cpu_env(devices=4)
    script = os.path.join(os.path.dirname(__file__), "pallas_sharding_script.py")
    result = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    cases = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(cases) == {"data4", "data2_tensor2", "runner_data4", "disentangled_data4", "norm_data4",
                          "stacked_rope_data2_tensor2", "glu_data2_tensor2", "explicit_data4"}
    # jax.make_mesh's default (explicit) axes and replicated inputs: resharded to the kernel's split, same result.
    assert cases.pop("explicit_data4")["max_error"] < 1e-5
    # The inference runner traces under its mesh: its pallas_gpu model has no collective at all.
    runner = cases.pop("runner_data4")
    assert runner["max_error"] < 1e-5 and runner["collectives"] == [], runner
    for name, case in cases.items():
        assert case["max_error"] < 1e-5, (name, case)
        assert case["collectives"] == ["all-reduce"], (name, case)


def tiny_modernbert_overrides() -> dict:
    """A ModernBERT small enough to lower in seconds, with the real head width (64) and window (128), in bfloat16,
    attention named explicitly: "auto" would resolve to the CPU choice while exporting."""
    return dict(hidden_size=128, num_heads=2, num_layers=3, intermediate_size=256, vocab_size=512,
                local_window=128, max_position_embeddings=256, dtype="bfloat16", attention_implementation="pallas_gpu")


def test_modernbert_train_step_lowers_with_the_kernels():
    """The train step `bertjax pretrain` runs (setup_run: model, stable AdamW, mesh rules, shardings, donation) for a
    tiny ModernBERT MLM in bfloat16 exports for CUDA with pallas_gpu in every layer: 3 layers (1 global, 2 local),
    each with its forward, dq and dk/dv kernels."""
    pytest.importorskip("grain")  # bertjax.data's pipeline (the lent GPU machines lack it)
    from bertjax.data import batch_spec
    from bertjax.train import mesh as mesh_lib
    from bertjax.train.run_config import run_config_from_dict
    from bertjax.train.setup import setup_run

    raw = {"model": {"preset": "modernbert-tiny", "overrides": tiny_modernbert_overrides()},
           "objective": {"name": "mlm"}, "data": {"seq_len": 256, "global_batch_size": 2},
           "optimizer": {"name": "stable_adamw", "learning_rate": 1e-3}, "schedule": {"name": "linear", "warmup": 1},
           "train": {"steps": 10}}
    setup = setup_run(run_config_from_dict(raw), vocab_size=512, pad_id=0, devices=jax.devices()[:1],
                      attention_platform="gpu", compile_only=True)
    assert setup.model_config.attention_implementation == "pallas_gpu"
    state = setup.abstract_state()
    batch = {name: jax.ShapeDtypeStruct(shape, dtype) for name, (shape, dtype) in
             batch_spec(setup.phases[0].data).items()}
    step = setup.train_step
    with mesh_lib.activate(step.mesh):  # as JittedStep traces it: mesh and logical rules set
        exported = export_for_cuda(step.jitted(batch), state, setup.frozen, batch)
    kernels = triton_kernels(exported)
    assert kernels == sorted([FORWARD, DQ, DKV] * 3)
    assert "f32" in exported.mlir_module() and "bf16" in exported.mlir_module()


def test_inference_and_embedding_forwards_lower_with_the_kernels():
    """The row functions the inference runner jits (bertjax/inference/rows.py: pooled hidden states; embeddings:
    EncoderForEmbedding's pooled, normalised vectors) export for CUDA with one forward kernel per layer."""
    from bertjax.config import get_config
    from bertjax.embeddings.config import PoolingConfig
    from bertjax.embeddings.embed import embedding_row_fn
    from bertjax.embeddings.model import EncoderForEmbedding
    from bertjax.inference.rows import encoder_row_fn
    from bertjax.models import EncoderForMaskedLM, init_params

    config = get_config("modernbert-tiny", **tiny_modernbert_overrides())
    rows = {"input_ids": jax.ShapeDtypeStruct((2, 256), jnp.int32),
            "segment_ids": jax.ShapeDtypeStruct((2, 256), jnp.int32)}
    for model, row_fn in ((EncoderForMaskedLM(config), encoder_row_fn), (EncoderForEmbedding(
            config, pooling=PoolingConfig(modes=("mean",), normalize=True)), embedding_row_fn)):
        params = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
        fn = row_fn(model)
        exported = export_for_cuda(lambda p, b: fn(p, b, 4), params, rows)
        assert triton_kernels(exported) == [FORWARD] * 3, type(model).__name__
