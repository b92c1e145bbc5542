"""Run by tests/test_train_sharding.py in a subprocess with 8 fake CPU devices (XLA flags must be set before JAX
starts). Trains the same tiny model on the same real batches over several mesh shapes and prints, as JSON, the
losses of each and where the parameters ended up."""

import json
import sys

import jax
import numpy as np

from bertjax.data import build_pretraining_iterator, load_tokenizer, to_global_batch
from bertjax.train import mesh as mesh_lib
from bertjax.train.run_config import run_config_from_dict
from bertjax.train.setup import setup_run

STEPS = 4
# (data, fsdp, tensor), devices used, microbatches per update
RUNS = {
    "mlm": [((1, 1, 1), 1, 1), ((8, 1, 1), 8, 1), ((2, 4, 1), 8, 1), ((2, 2, 2), 8, 1), ((1, 8, 1), 8, 1),
            ((2, 2, 2), 8, 2)],
    # Accumulation is the objective-independent part the MLM runs cover (ELECTRA's samples depend on the microbatch).
    "electra": [((1, 1, 1), 1, 1), ((2, 2, 2), 8, 1)],
    "permutation_lm": [((1, 1, 1), 1, 1), ((2, 2, 2), 8, 1)],  # orders drawn on the device, per row
    "deberta_gdes": [((1, 1, 1), 1, 1), ((2, 2, 2), 8, 1)],
}
TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 48}
MODELS = {"mlm": ("modernbert-tiny", {**TINY, "local_window": 8}),
          "electra": ("electra-tiny-discriminator", {**TINY, "embedding_size": 16}),
          "permutation_lm": ("xlnet-tiny", TINY),
          "deberta_gdes": ("deberta-v3-tiny", TINY)}
# Objective sections that are not just {name: <run name>}.
OBJECTIVES = {"deberta_gdes": {"name": "electra", "embedding_sharing": "gdes", "generator_size": 1.0,
                               "generator_depth": 0.5}}


def main(tokenizer_dir: str, objectives: list[str]) -> None:
    """One line `RESULTS <objective> <json>` per objective: several objectives in one interpreter pay Python's and
    JAX's start once."""
    assert jax.device_count() == 8, jax.devices()
    tokenizer = load_tokenizer(tokenizer_dir)
    for objective in objectives:
        print(f"RESULTS {objective} " + json.dumps(run_objective(tokenizer, objective)), flush=True)


def run_objective(tokenizer, objective: str) -> list[dict]:
    preset, overrides = MODELS[objective]
    raw = {"model": {"preset": preset, "overrides": overrides},
           "objective": OBJECTIVES.get(objective, {"name": objective}),
           "data": {"seq_len": 32, "global_batch_size": 8, "mlm_probability": 0.3, "window_documents": 64},
           "optimizer": {"name": "stable_adamw", "learning_rate": 3e-3, "weight_decay": 1e-5},
           "schedule": {"name": "linear", "warmup": 2}, "train": {"steps": STEPS}}
    base = run_config_from_dict(raw)
    iterator = build_pretraining_iterator(base.data, tokenizer, seed=0)
    batches = [next(iterator) for _ in range(STEPS)]

    def spec(array):  # PartitionSpec as JSON: one entry per dimension, None or mesh axis name(s)
        return [a if a is None or isinstance(a, str) else list(a) for a in array.sharding.spec]

    results = []
    for shape, num_devices, microbatches in RUNS[objective]:
        raw_run = {**raw, "mesh": dict(zip(("data", "fsdp", "tensor"), shape)),
                   "optimizer": {**raw["optimizer"], "accumulation_steps": microbatches}}
        setup = setup_run(run_config_from_dict(raw_run), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                          devices=jax.devices()[:num_devices])
        state = setup.fresh_state()
        losses, parts = [], []
        for batch in batches:
            state, metrics = setup.train_step(state, setup.frozen, to_global_batch(batch, setup.mesh,
                                                                                   mesh_lib.BATCH_AXES))
            losses.append(float(metrics["loss"]))
            parts.append({k: float(v) for k, v in metrics.items() if k.endswith("_loss")})
        key = setup.objective.params_key  # ELECTRA: the discriminator's subtree
        params, mu = (state.params, state.opt_state.mu) if key is None else (state.params[key], state.opt_state.mu[key])
        results.append({
            "mesh": shape, "microbatches": microbatches, "losses": losses, "parts": parts,
            "param_sum": float(sum(np.abs(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(params))),
            "word_embedding_spec": spec(params["embeddings"]["word_embeddings"]["embedding"]),
            "query_spec": spec(params["encoder"]["layers_0"]["attention"]["query"]["kernel"]),
            "mu_query_spec": spec(mu["encoder"]["layers_0"]["attention"]["query"]["kernel"]),
            "query_shards": len({str(s.index) for s in params["encoder"]["layers_0"]["attention"]["query"]["kernel"]
                                .addressable_shards}),
        })
    return results


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["mlm"])
