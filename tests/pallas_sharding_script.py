"""Run by tests/test_pallas_gpu_export.py in a subprocess with 4 host CPU devices (XLA_FLAGS set by the caller):
pallas_gpu attention under a mesh (`jax.set_mesh`) in interpret mode and exported for CUDA. Prints one JSON line.

Cases: a data-parallel mesh (batch over 4 devices) and a data x tensor mesh under the train logical rules (batch
over 2, heads over 2); every feature on (window, GQA, ALiBi, global tokens); forward and gradients to q, k, v.
"""

from __future__ import annotations

import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from bertjax import ops
from bertjax.train import mesh as mesh_lib

BATCH, SEQ, HEADS, KV_HEADS, DIM = 4, 64, 4, 2, 16
SLOPES = np.asarray([2.0 ** -(i + 1) for i in range(HEADS)], np.float32)
TRITON_CALLS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")


def program(interpret: bool):
    def loss(q, k, v, segment_ids, global_mask):
        out = ops.attention(q, k, v, segment_ids=segment_ids, local_window=16, implementation="pallas_gpu",
                            interpret=interpret, alibi_slopes=SLOPES, global_tokens=global_mask,
                            max_global_tokens=2)
        return jnp.sum(out.astype(jnp.float32) ** 2), out

    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)


def inputs():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((BATCH, SEQ, HEADS, DIM)).astype(np.float32)
    k, v = (rng.standard_normal((BATCH, SEQ, KV_HEADS, DIM)).astype(np.float32) for _ in range(2))
    seg = np.ones((BATCH, SEQ), np.int32)
    seg[0, 40:] = 2
    seg[1, 50:] = 0
    glob = np.zeros((BATCH, SEQ), bool)
    glob[:, 0] = True
    glob[0, 40] = True
    return q, k, v, seg, glob


def collectives(hlo: str) -> list[str]:
    return sorted(set(re.findall(r"\b(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)\b", hlo)))


def run_case(name, mesh, rules, qkv_spec, results):
    args = inputs()
    (_, reference), reference_grads = jax.jit(program(True))(*args)  # no mesh: the kernel on the whole batch
    row_spec = P(qkv_spec[0], None)
    shardings = [NamedSharding(mesh, s) for s in (qkv_spec, qkv_spec, qkv_spec, row_spec, row_spec)]
    placed = [jax.device_put(x, s) for x, s in zip(args, shardings)]
    with jax.set_mesh(mesh), rules():
        fn = jax.jit(program(True), in_shardings=shardings)
        (_, out), grads = fn(*placed)
        compiled = fn.lower(*placed).compile().as_text()
        exported = jax.export.export(
            jax.jit(program(False), in_shardings=shardings), platforms=["cuda"],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(c) for c in TRITON_CALLS])(*placed)
    errors = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip((out, *grads),
                                                                                (reference, *reference_grads))]
    text = exported.mlir_module()
    # The operand and result types of each Triton call: 4-d ones are q/k/v/out blocks, whole or a device's shard.
    calls = [line for line in text.splitlines()
             if re.search(r'custom_call @"?(?:__gpu\$xla\.gpu\.triton|triton_kernel_call_ffi)', line)]
    shapes = sorted({tuple(map(int, dims.split("x"))) for line in calls
                     for dims in re.findall(r"tensor<(\d+x\d+x\d+x\d+)x[a-z]", line.rsplit(" : (", 1)[1])})
    results[name] = {"max_error": max(errors), "collectives": collectives(compiled), "triton_calls": len(calls),
                     "nr_devices": exported.nr_devices, "kernel_shapes": shapes}


def main():
    assert jax.device_count() == 4, jax.devices()
    results = {}
    data = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
    no_rules = lambda: __import__("contextlib").nullcontext()
    run_case("data4", data, no_rules, P("data", None, None, None), results)
    train = jax.make_mesh((2, 1, 2), mesh_lib.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
    rules = lambda: __import__("flax.linen", fromlist=["x"]).logical_axis_rules(mesh_lib.LOGICAL_AXIS_RULES)
    run_case("data2_tensor2", train, rules, P(("data", "fsdp"), None, "tensor", None), results)
    print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
