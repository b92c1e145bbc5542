"""Run by tests/test_embedder_loss.py in a subprocess with 8 fake CPU devices (XLA flags must be set before JAX
starts). The in-batch loss over meshes of 8 devices (negatives all-gathered across the batch axes) against the
same loss on one device and in numpy; prints the results as one JSON line."""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_embedder_loss import numpy_mnrl  # noqa: E402

from bertjax.embeddings.contrastive import mesh_ranking_loss, multiple_negatives_ranking_loss  # noqa: E402
from bertjax.train import mesh as mesh_lib  # noqa: E402
from bertjax.train.run_config import MeshConfig  # noqa: E402

BATCH, DIM = 16, 8
LOSSES = {"mnrl": {}, "symmetric": {"symmetric": True}, "hard_negatives": {"negatives": True},
          "symmetric_hard_negatives": {"symmetric": True, "negatives": True}}
# (data, fsdp, tensor) -> the losses checked on it (few compiles: the suite runs on 2 cores)
MESHES = {"data8": ((8, 1, 1), tuple(LOSSES)), "data2_fsdp2_tensor2": ((2, 2, 2), ("symmetric_hard_negatives",))}


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(0)
    a = rng.normal(size=(BATCH, DIM)).astype(np.float32)
    p = (a + 0.7 * rng.normal(size=(BATCH, DIM))).astype(np.float32)
    n = rng.normal(size=(BATCH, DIM)).astype(np.float32)
    cases = []
    for mesh_name, (shape, loss_names) in MESHES.items():
        mesh = mesh_lib.build_mesh(MeshConfig(*shape))
        rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(mesh_lib.BATCH_AXES))
        for loss_name in loss_names:
            options = LOSSES[loss_name]
            symmetric, negatives = options.get("symmetric", False), options.get("negatives", False)
            args = (a, p, n) if negatives else (a, p)

            def one(*x):
                return multiple_negatives_ranking_loss(*x, scale=20.0, symmetric=symmetric)

            sharded = mesh_ranking_loss(mesh, mesh_lib.BATCH_AXES, scale=20.0, symmetric=symmetric)
            placed = [jax.device_put(x, rows) for x in args]
            argnums = tuple(range(len(args)))
            with jax.set_mesh(mesh):
                mesh_loss, mesh_grads = jax.jit(jax.value_and_grad(sharded, argnums))(*placed)
            one_loss, one_grads = jax.jit(jax.value_and_grad(one, argnums))(*[jnp.asarray(x) for x in args])
            difference = max(float(np.max(np.abs(np.asarray(g) - np.asarray(h))))
                             for g, h in zip(mesh_grads, one_grads))
            cases.append({"name": f"{mesh_name}/{loss_name}", "mesh_loss": float(mesh_loss),
                          "one_device_loss": float(one_loss),
                          "numpy_loss": float(numpy_mnrl(a, p, n if negatives else None, 20.0, symmetric)),
                          "max_grad_difference": difference,
                          "grad_sharding": str(mesh_grads[0].sharding.spec)})
    print(json.dumps({"devices": jax.device_count(), "cases": cases, "train_step": train_step_case()}))


def train_step_case() -> dict:
    """One cached (GradCache) train step of train-embedder's own step function on a tiny BERT, symmetric loss
    with hard negatives: 8 devices (data=8) against 1; the loss and the updated parameters (= the gradients)."""
    import bertjax
    from bertjax.embeddings import EncoderForEmbedding, PoolingConfig
    from bertjax.embeddings.train_config import embedder_config_from_dict
    from bertjax.embeddings.training import make_steps
    from bertjax.data.global_batch import from_full_batch
    import optax
    from bertjax.train.state import boxed_initialiser, create_train_state

    model_config = bertjax.get_config("bert-tiny", vocab_size=40, dropout_rate=0.0, hidden_size=16, num_layers=1,
                                      num_heads=2, intermediate_size=24)
    model = EncoderForEmbedding(model_config, pooling=PoolingConfig(modes=("mean",)))
    config = embedder_config_from_dict({"train": {"batch_size": 16, "mini_batch_size": 8},
                                        "loss": {"symmetric": True}})
    rng = np.random.default_rng(2)
    lengths = rng.integers(3, 8, size=(16, 3))
    segments = (np.arange(8)[None, None, :] < lengths[..., None]).astype(np.int32)
    batch = {"input_ids": rng.integers(5, 40, size=(16, 3, 8)).astype(np.int32) * segments,
             "segment_ids": segments}
    # Plain SGD with learning rate 1: the parameter change is the gradient itself, so the comparison below is
    # that of the gradients (Adam would magnify rounding differences where a gradient is nearly 0).
    schedule = lambda step: 1.0  # noqa: E731
    optimizer = optax.sgd(1.0)
    results = {}
    for name, shape, devices in (("one", (1, 1, 1), jax.devices()[:1]), ("mesh", (8, 1, 1), jax.devices())):
        mesh = mesh_lib.build_mesh(MeshConfig(*shape), devices)
        state, shardings = create_train_state(boxed_initialiser(model), optimizer, mesh, seed=0)
        train, _ = make_steps(model, optimizer, schedule, mesh, shardings, config, np.zeros(3, np.int32))
        state, metrics = train(state, from_full_batch(batch, mesh, mesh_lib.BATCH_AXES))
        results[name] = (float(metrics["loss"]), jax.tree.map(np.asarray, jax.device_get(state.params)))
    difference = max(jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), results["one"][1],
                                                  results["mesh"][1])))
    return {"one_device_loss": results["one"][0], "mesh_loss": results["mesh"][0], "max_param_difference": difference}


if __name__ == "__main__":
    main()
