"""Run by tests/test_pallas_gpu_export.py in a subprocess with 4 host CPU devices (XLA_FLAGS set by the caller):
pallas_gpu attention under a mesh (`jax.set_mesh`) in interpret mode: results against the unsharded call and the
collectives of the compiled program. Prints one JSON line. (The CUDA exports of the same layouts need no devices:
the test does them on abstract meshes.)

Cases: a data-parallel mesh (batch over 4 devices) and a data x tensor mesh under the train logical rules (batch
over 2, heads over 2); every feature on (window, GQA, ALiBi, global tokens); forward and gradients to q, k, v.
And the inference runner (bertjax/inference/runner.py) over 4 devices with a tiny ModernBERT on pallas_gpu; and
DeBERTa's disentangled kernel (pallas_gpu_disentangled.py) data-parallel, gradients to the position tables included;
and the residual add + norm kernel (pallas_gpu_norm.py) data-parallel, gradients to the scale and bias included;
and attention on the stacked q/k/v projection (pallas_gpu_rope_attention) under the train rules (batch over data,
heads over tensor), its gradient the stack's; and the gated MLP's kernel (pallas_gpu_glu.py) under the train rules
(batch over data, features over tensor); and attention under a mesh of explicit axes with replicated inputs.
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


def program():
    def loss(q, k, v, segment_ids, global_mask):
        out = ops.attention(q, k, v, segment_ids=segment_ids, local_window=16, implementation="pallas_gpu",
                            interpret=True, alibi_slopes=SLOPES, global_tokens=global_mask,
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
    (_, reference), reference_grads = jax.jit(program())(*args)  # no mesh: the kernel on the whole batch
    row_spec = P(qkv_spec[0], None)
    shardings = [NamedSharding(mesh, s) for s in (qkv_spec, qkv_spec, qkv_spec, row_spec, row_spec)]
    placed = [jax.device_put(x, s) for x, s in zip(args, shardings)]
    with jax.set_mesh(mesh), rules():
        compiled = jax.jit(program(), in_shardings=shardings).lower(*placed).compile()  # compiled once: run, read
        (_, out), grads = compiled(*placed)
        compiled = compiled.as_text()
    errors = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip((out, *grads),
                                                                                (reference, *reference_grads))]
    results[name] = {"max_error": max(errors), "collectives": collectives(compiled)}


def run_inference_case(results):
    from bertjax.config import get_config
    from bertjax.inference.rows import encoder_row_fn
    from bertjax.inference.runner import Runner, data_mesh
    from bertjax.models import EncoderForMaskedLM, init_params

    model = EncoderForMaskedLM(get_config("modernbert-tiny", attention_implementation="pallas_gpu",
                                          attention_interpret=True))
    params = init_params(model, jax.random.key(0))
    rng = np.random.default_rng(1)
    batch = {"input_ids": rng.integers(1, 128, (4, SEQ)).astype(np.int32), "segment_ids": inputs()[3]}
    outputs, compiled = [], None
    for devices in (jax.devices(), jax.devices()[:1]):
        runner = Runner(encoder_row_fn(model), mesh=data_mesh(devices))
        placed = runner.place_params(params)
        outputs.append(next(runner.run(placed, [batch], 2))["segments"]["pooled"])
        if compiled is None:  # the 4-device program just run (its compile cached: looked up, not redone)
            compiled = runner.lower(placed, batch, 2).compile().as_text()
    results["runner_data4"] = {"max_error": float(np.max(np.abs(outputs[0] - outputs[1]))),
                               "collectives": collectives(compiled)}


def run_disentangled_case(results):
    from bertjax.ops import disentangled_attention as da

    heads, span = 2, 8
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((BATCH, SEQ, heads, DIM)).astype(np.float32) for _ in range(3))
    pos_key, pos_query = (rng.standard_normal((2 * span, heads, DIM)).astype(np.float32) for _ in range(2))
    seg = inputs()[3]

    def program():
        def loss(q, k, v, pos_key, pos_query, seg):
            out = da.disentangled_attention(q, k, v, pos_key, pos_query, segment_ids=seg, span=span, buckets=span,
                                            max_position=20, implementation="pallas_gpu", block_size=16,
                                            interpret=True)
            return jnp.sum(out ** 2), out
        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)

    args = (q, k, v, pos_key, pos_query, seg)
    (_, reference), reference_grads = jax.jit(program())(*args)
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
    specs = (P("data"),) * 3 + (P(),) * 2 + (P("data"),)
    shardings = [NamedSharding(mesh, s) for s in specs]
    placed = [jax.device_put(x, s) for x, s in zip(args, shardings)]
    with jax.set_mesh(mesh):
        compiled = jax.jit(program(), in_shardings=shardings).lower(*placed).compile()  # compiled once: run, read
        (_, out), grads = compiled(*placed)
        compiled = compiled.as_text()
    errors = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip((out, *grads),
                                                                                (reference, *reference_grads))]
    results["disentangled_data4"] = {"max_error": max(errors), "collectives": collectives(compiled)}


def run_norm_case(results):
    from bertjax.ops.normalize import add_normalize

    rng = np.random.default_rng(3)
    x, delta, g_s = (rng.standard_normal((BATCH, SEQ, 48)).astype(np.float32) for _ in range(3))
    scale, bias = (1 + 0.1 * rng.standard_normal(48)).astype(np.float32), rng.standard_normal(48).astype(np.float32)

    def program():
        def loss(x, delta, scale, bias):
            s, y = add_normalize(x, delta, scale, bias, epsilon=1e-5, centered=True, dtype=jnp.float32,
                                 implementation="pallas_gpu", interpret=True)
            return jnp.sum(y ** 2) + jnp.sum(s * g_s), y
        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)

    args = (x, delta, scale, bias)
    (_, reference), reference_grads = jax.jit(program())(*args)
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
    shardings = [NamedSharding(mesh, s) for s in (P("data"), P("data"), P(), P())]
    placed = [jax.device_put(a, s) for a, s in zip(args, shardings)]
    with jax.set_mesh(mesh):
        compiled = jax.jit(program(), in_shardings=shardings).lower(*placed).compile()  # compiled once: run, read
        (_, out), grads = compiled(*placed)
        compiled = compiled.as_text()
    # Relative to each array's largest value: the scale's and bias's gradients are sums over all 256 rows, added
    # per device and then across devices, so their float32 rounding differs from the unsharded order.
    errors = [float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))
              for a, b in zip((out, *grads), (reference, *reference_grads))]
    results["norm_data4"] = {"max_error": max(errors), "collectives": collectives(compiled)}


def run_stacked_rope_case(results):
    from bertjax.ops.pallas_gpu_attention import pallas_gpu_rope_attention

    rng = np.random.default_rng(4)
    qkv = rng.standard_normal((BATCH, SEQ, 3, HEADS, DIM)).astype(np.float32)
    seg = inputs()[3]
    positions = np.tile(np.arange(SEQ, dtype=np.int32), (BATCH, 1))

    def program():
        def loss(qkv, positions, seg):
            out = pallas_gpu_rope_attention(qkv, positions, 10_000.0, segment_ids=seg, local_window=16,
                                            scale=DIM ** -0.5, interpret=True, block_q=16, block_k=16)
            return jnp.sum(out ** 2), out
        return jax.value_and_grad(loss, has_aux=True)

    args = (qkv, positions, seg)
    (_, reference), reference_grad = jax.jit(program())(*args)
    train = jax.make_mesh((2, 1, 2), mesh_lib.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
    specs = (P(("data", "fsdp"), None, None, "tensor", None), P(("data", "fsdp"), None), P(("data", "fsdp"), None))
    shardings = [NamedSharding(train, spec) for spec in specs]
    placed = [jax.device_put(a, sh) for a, sh in zip(args, shardings)]
    rules = __import__("flax.linen", fromlist=["x"]).logical_axis_rules(mesh_lib.LOGICAL_AXIS_RULES)
    with jax.set_mesh(train), rules:
        compiled = jax.jit(program(), in_shardings=shardings).lower(*placed).compile()
        (_, out), grad = compiled(*placed)
        compiled = compiled.as_text()
    errors = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in ((out, reference),
                                                                                (grad, reference_grad))]
    results["stacked_rope_data2_tensor2"] = {"max_error": max(errors), "collectives": collectives(compiled)}


def run_glu_case(results):
    from bertjax.ops.glu import glu

    rng = np.random.default_rng(5)
    y = rng.standard_normal((BATCH, SEQ, 2, 48)).astype(np.float32)

    def program():
        def loss(y):
            out = glu(y, "gelu", implementation="pallas_gpu", interpret=True)
            return jnp.sum(out ** 2), out
        return jax.value_and_grad(loss, has_aux=True)

    (_, reference), reference_grad = jax.jit(program())(y)
    train = jax.make_mesh((2, 1, 2), mesh_lib.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
    sharding = NamedSharding(train, P(("data", "fsdp"), None, None, "tensor"))
    rules = __import__("flax.linen", fromlist=["x"]).logical_axis_rules(mesh_lib.LOGICAL_AXIS_RULES)
    with jax.set_mesh(train), rules:
        placed = jax.device_put(y, sharding)
        compiled = jax.jit(program(), in_shardings=(sharding,)).lower(placed).compile()
        (_, out), grad = compiled(placed)
        compiled = compiled.as_text()
    errors = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in ((out, reference),
                                                                                (grad, reference_grad))]
    results["glu_data2_tensor2"] = {"max_error": max(errors), "collectives": collectives(compiled)}


def run_explicit_case(results):
    """jax.make_mesh's default axis type (Explicit) and replicated inputs, as a user writes it: the kernel's
    operands are moved to its batch split before the shard_map."""
    args = [jnp.asarray(x) for x in inputs()]
    (_, reference), reference_grads = jax.jit(program())(*args)
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        (_, out), grads = jax.jit(program())(*args)
    errors = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip((out, *grads),
                                                                                (reference, *reference_grads))]
    results["explicit_data4"] = {"max_error": max(errors)}


def main():
    assert jax.device_count() == 4, jax.devices()
    results = {}
    data = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
    no_rules = lambda: __import__("contextlib").nullcontext()
    run_case("data4", data, no_rules, P("data", None, None, None), results)
    train = jax.make_mesh((2, 1, 2), mesh_lib.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
    rules = lambda: __import__("flax.linen", fromlist=["x"]).logical_axis_rules(mesh_lib.LOGICAL_AXIS_RULES)
    run_case("data2_tensor2", train, rules, P(("data", "fsdp"), None, "tensor", None), results)
    run_inference_case(results)
    run_disentangled_case(results)
    run_norm_case(results)
    run_stacked_rope_case(results)
    run_glu_case(results)
    run_explicit_case(results)
    print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
