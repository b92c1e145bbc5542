"""Run by tests/test_train_sharding.py in a subprocess with 8 fake CPU devices (XLA flags must be set before JAX
starts). Trains the same tiny model on the same real batches over several mesh shapes and prints, as JSON, the
losses of each and where the parameters ended up."""

import json
import sys

import jax
import numpy as np

from bertjax.config import get_config
from bertjax.data import DataConfig, build_pretraining_iterator, load_tokenizer, to_global_batch
from bertjax.models import MODEL_CLASSES
from bertjax.train import mesh as mesh_lib
from bertjax.train.optimizers import build_optimizer
from bertjax.train.run_config import MeshConfig, OptimizerConfig, ScheduleConfig
from bertjax.train.schedules import build_schedule
from bertjax.train.state import create_train_state
from bertjax.train.step import make_train_step

STEPS = 4
# (data, fsdp, tensor), devices used, microbatches per update
RUNS = [((1, 1, 1), 1, 1), ((8, 1, 1), 8, 1), ((2, 4, 1), 8, 1), ((2, 2, 2), 8, 1), ((1, 8, 1), 8, 1),
        ((2, 2, 2), 8, 2)]


def main(tokenizer_dir: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    tokenizer = load_tokenizer(tokenizer_dir)
    data = DataConfig(seq_len=32, global_batch_size=8, mlm_probability=0.3, window_documents=64)
    iterator = build_pretraining_iterator(data, tokenizer, seed=0)
    batches = [next(iterator) for _ in range(STEPS)]
    config = get_config("modernbert-tiny", hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                        local_window=8, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    model = MODEL_CLASSES["masked_lm"](config)
    schedule = build_schedule(ScheduleConfig(name="linear", warmup=2), 3e-3, STEPS)
    optimizer = build_optimizer(OptimizerConfig(name="stable_adamw", learning_rate=3e-3, weight_decay=1e-5), schedule)
    def spec(array):  # PartitionSpec as JSON: one entry per dimension, None or mesh axis name(s)
        return [a if a is None or isinstance(a, str) else list(a) for a in array.sharding.spec]

    results = []
    for shape, num_devices, microbatches in RUNS:
        mesh = mesh_lib.build_mesh(MeshConfig(*shape), jax.devices()[:num_devices])
        state, shardings = create_train_state(model, optimizer, mesh, seed=0)
        step = make_train_step(model, optimizer, schedule, mesh, shardings, with_nsp=False,
                               accumulation_steps=microbatches)
        losses = []
        for batch in batches:
            state, metrics = step(state, to_global_batch(batch, mesh, mesh_lib.BATCH_AXES))
            losses.append(float(metrics["loss"]))
        params = state.params
        results.append({
            "mesh": shape, "microbatches": microbatches, "losses": losses,
            "param_sum": float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(params))),
            "word_embedding_spec": spec(params["embeddings"]["word_embeddings"]["embedding"]),
            "query_spec": spec(params["encoder"]["layers_0"]["attention"]["query"]["kernel"]),
            "mu_query_spec": spec(state.opt_state.mu["encoder"]["layers_0"]["attention"]["query"]["kernel"]),
            "query_shards": len({str(s.index) for s in params["encoder"]["layers_0"]["attention"]["query"]["kernel"]
                                .addressable_shards}),
        })
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
