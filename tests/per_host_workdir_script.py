"""Run by tests/test_train_multihost.py as two processes on localhost, each with its own workdir (a TPU pod's
per-host layout): the end-of-run exports of a two-model objective are written by process 0 alone (the test reads
them back), a checkpoint directory that is not shared is refused on every process, and a distillation teacher read
from a bertjax model directory (arrays on each host's own device) is laid out over the mesh of both hosts. Prints
`EXPORTED`, `REFUSED <message>`, then `TEACHER <sum of its parameters>`."""

import sys
from pathlib import Path

import jax
import numpy as np

from bertjax.train import distributed


def main(coordinator: str, process_id: int, root: str, tokenizer_dir: str) -> None:
    distributed.initialize(coordinator, 2, process_id)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from bertjax.config import get_config
    from bertjax.data import load_tokenizer
    from bertjax.model_dirs import EXPORTS_DIR
    from bertjax.models import MODEL_CLASSES, init_params
    from bertjax.train.checkpoints import CheckpointError, check_shared_by_every_process
    from bertjax.train.loop import save_exports

    workdir = Path(root) / f"host{process_id}"
    workdir.mkdir(parents=True)
    model = MODEL_CLASSES["masked_lm"](get_config("bert-tiny", vocab_size=512, hidden_size=32, num_layers=1,
                                                  num_heads=2, intermediate_size=48))
    host = jax.tree.map(np.asarray, init_params(model, jax.random.key(0)))
    replicated = NamedSharding(Mesh(np.asarray(jax.devices()), ("data",)), PartitionSpec())
    params = jax.tree.map(lambda x: jax.make_array_from_callback(x.shape, replicated, lambda index: x[index]), host)
    save_exports(workdir, {"generator": (model, params), "discriminator": (model, params)},
                 load_tokenizer(tokenizer_dir))
    assert (workdir / EXPORTS_DIR).exists() == (process_id == 0)
    print("EXPORTED", flush=True)  # the test reads them back in one process (a restore here would be collective)
    try:
        check_shared_by_every_process(workdir / "checkpoints")
    except CheckpointError as error:
        print(f"REFUSED {error}", flush=True)
    from bertjax.train.mesh import build_mesh
    from bertjax.train.objectives import build_objective
    from bertjax.train.objectives.distillation import DistillationOptions
    from bertjax.train.run_config import MeshConfig

    objective = build_objective(DistillationOptions(teacher=str(Path(root) / "teacher")), model.config)
    frozen, _ = objective.frozen_params(build_mesh(MeshConfig(data=1, fsdp=2, tensor=1)))
    total = sum(float(jax.jit(lambda x: x.astype(np.float32).sum())(leaf)) for leaf in jax.tree.leaves(frozen))
    print(f"TEACHER {total:.6f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
