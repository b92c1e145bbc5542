"""Training throughput (tokens/s) and model FLOPs utilisation of the jitted train step.

    python -m bench.train_bench                       # CPU: tiny, modernbert-base and bert-base at short rows,
                                                      # packed and one document per row, against transformers
    python -m bench.train_bench --cpu-time            # CPU: one thread each, CPU seconds (for a shared machine)
    python -m bench.train_bench --gpu                 # GPU: modernbert-base, 1024 tokens, bfloat16, against
                                                      # transformers' ModernBertForMaskedLM on identical batches

The step is the one `bertjax pretrain` runs (StableAdamW, MLM at 30% gathered before the vocabulary projection,
state donated), fed synthetic packed rows so that only the step is timed. MFU counts model FLOPs
(bertjax/train/flops.py) against the device's peak: the published bf16 peak on accelerators; on CPU, which has no
published figure, the float32 matmul rate measured in the same run. Needs no data pipeline (no grain import).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import tempfile
import time

import sys

if "--cpu-time" in sys.argv:  # XLA reads its flags when jax is imported: one thread for every XLA computation
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"

from bertjax.cpu_allocator import reuse_freed_memory  # noqa: E402

if "--gpu" not in sys.argv:
    reuse_freed_memory()  # as `bertjax` commands do on CPU, for both frameworks in this process

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.config import get_config
from bertjax.data.global_batch import batch_sharding
from bertjax.models import MODEL_CLASSES, init_params
from bertjax.train import flops as flops_lib
from bertjax.train import mesh as mesh_lib
from bertjax.train.run_config import run_config_from_dict
from bertjax.train.setup import setup_run
from bertjax.train.state import count_params

MLM_RATE = 0.3
# Wall-clock by default; `--cpu-time` switches to the process's CPU seconds with both frameworks on one thread,
# which other jobs on a shared machine disturb far less than wall time.
CLOCK = time.perf_counter
# tiny.yaml's model (configs/pretrain/tiny.yaml) with its tokenizer's vocabulary size.
TINY = dict(preset="modernbert-tiny", hidden_size=128, num_layers=4, num_heads=4, intermediate_size=256,
            local_window=64, max_position_embeddings=128, vocab_size=8192)


@dataclasses.dataclass
class Case:
    name: str
    config: object  # EncoderConfig
    batch: int
    seq_len: int
    documents_per_row: int = 2
    objective: str = "mlm"
    objective_options: dict = dataclasses.field(default_factory=dict)

    def run_config(self, steps: int):
        """The run config of `bertjax pretrain` for this case: the model's every field as an override."""
        return run_config_from_dict({
            "model": {"preset": "bert-base", "overrides": self.config.to_dict()},
            "objective": {"name": self.objective, **self.objective_options},
            "data": {"seq_len": self.seq_len, "global_batch_size": self.batch, "mlm_probability": MLM_RATE},
            "optimizer": {"name": "stable_adamw", "learning_rate": 8e-4, "weight_decay": 1e-5},
            "schedule": {"name": "constant"}, "train": {"steps": steps + 1}})


def synthetic_batch(case: Case, seed: int = 0, documents_per_row: int | None = None) -> dict[str, np.ndarray]:
    """Full rows of `documents_per_row` packed documents, MLM_RATE of each row's tokens to predict."""
    rng = np.random.default_rng(seed)
    b, s = case.batch, case.seq_len
    docs = documents_per_row or case.documents_per_row
    predictions = int(np.ceil(s * MLM_RATE))
    segment = np.repeat(np.arange(1, docs + 1), -(-s // docs))[:s]
    positions = np.concatenate([np.arange((segment == d).sum()) for d in range(1, docs + 1)])
    masked = np.sort(np.stack([rng.choice(s, predictions, replace=False) for _ in range(b)]), axis=1)
    ids = rng.integers(5, case.config.vocab_size, (b, s))
    return {"input_ids": ids.astype(np.int32), "segment_ids": np.tile(segment, (b, 1)).astype(np.int32),
            "positions": np.tile(positions, (b, 1)).astype(np.int32),
            "token_type_ids": np.zeros((b, s), np.int32), "masked_positions": masked.astype(np.int32),
            "masked_ids": np.take_along_axis(ids, masked, 1).astype(np.int32),
            "masked_weights": np.ones((b, predictions), np.float32)}


def time_steps(step, state, batch, steps: int) -> tuple[float, object, float]:
    """(seconds per step, final state, first loss) after one compiling step."""
    state, metrics = step(state, batch)
    first_loss = float(metrics["loss"])
    start = CLOCK()
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    return (CLOCK() - start) / steps, state, first_loss


def bench_bertjax(case: Case, steps: int, peak_per_device: float) -> dict:
    setup = setup_run(case.run_config(steps), vocab_size=case.config.vocab_size, pad_id=case.config.pad_token_id)
    state = setup.fresh_state()
    batch = {k: jax.device_put(v, batch_sharding(setup.mesh, mesh_lib.BATCH_AXES))
             for k, v in synthetic_batch(case).items()}
    seconds, _, loss = time_steps(lambda s, b: setup.train_step(s, setup.frozen, b), state, batch, steps)
    tokens = case.batch * case.seq_len
    model_flops = setup.objective.train_flops(seq_len=case.seq_len, tokens=tokens,
                                              predictions=float(batch["masked_weights"].sum()), rows=case.batch)
    return {"case": case.name, "params_M": count_params(state.params) / 1e6, "batch": case.batch,
            "seq_len": case.seq_len, "dtype": case.config.dtype, "step_ms": 1e3 * seconds,
            "tokens_per_sec": tokens / seconds, "model_flops": model_flops,
            "mfu": flops_lib.mfu(model_flops, seconds, jax.device_count(), peak_per_device), "first_loss": loss}


def transformers_rows(case: Case) -> dict[str, np.ndarray]:
    """The rows transformers trains on: one document per row, no padding (it has no packing), labels -100 except
    at the same masked positions as the bertjax batch."""
    rows = synthetic_batch(case, documents_per_row=1)
    labels = np.full((case.batch, case.seq_len), -100, np.int64)
    np.put_along_axis(labels, rows["masked_positions"], rows["masked_ids"], axis=1)
    return {"input_ids": rows["input_ids"].astype(np.int64), "labels": labels}


def bench_transformers(case: Case, steps: int, jax_params, jax_model, device: str = "cuda") -> dict:
    """transformers' masked-LM class of the same family (sdpa; bf16 autocast on GPU; ModernBERT with sparse
    prediction) with torch's AdamW on the same weights and rows."""
    import torch
    import transformers

    import bertjax

    with tempfile.TemporaryDirectory() as tmp:
        bertjax.save_pretrained(tmp, jax_model, jax.device_get(jax_params))
        extra = {"sparse_prediction": True} if jax_model.config.family == "modernbert" else {}
        model = transformers.AutoModelForMaskedLM.from_pretrained(tmp, attn_implementation="sdpa", **extra)
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=1e-5,
                                  fused=device == "cuda")
    rows = transformers_rows(case)
    inputs = {name: torch.from_numpy(value).to(device) for name, value in rows.items()}
    inputs["attention_mask"] = torch.ones(case.batch, case.seq_len, dtype=torch.int64, device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        with autocast:
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    first_loss = float(step())
    synchronize()
    start = CLOCK()
    for _ in range(steps):
        step()
    synchronize()
    seconds = (CLOCK() - start) / steps
    return {"case": f"{case.name} (transformers)", "batch": case.batch, "seq_len": case.seq_len,
            "step_ms": 1e3 * seconds, "tokens_per_sec": case.batch * case.seq_len / seconds,
            "first_loss": first_loss}


def cpu_cases(names: str | None = None) -> list[Case]:
    tiny = dict(TINY)
    tiny_config = get_config(tiny.pop("preset"), **tiny)
    cases = {"tiny": Case("tiny (configs/pretrain/tiny.yaml)", tiny_config, batch=32, seq_len=128),
             "modernbert-base": Case("modernbert-base", get_config("modernbert-base"), batch=4, seq_len=128),
             "bert-base": Case("bert-base", get_config("bert-base", dropout_rate=0.0), batch=4, seq_len=128)}
    wanted = names.split(",") if names else list(cases)
    unknown = sorted(set(wanted) - set(cases))
    if unknown:
        raise SystemExit(f"--cases: unknown {unknown}; known: {sorted(cases)}")
    return [cases[name] for name in wanted]


def run_cpu(steps: int, with_transformers: bool = True, names: str | None = None) -> list[dict]:
    """Each case three ways in one run: bertjax on packed rows (2 documents per row, as pretraining feeds it),
    bertjax on one document per row, and transformers on those same single-document rows and initial weights."""
    peak = flops_lib.measure_peak_flops(jnp.float32, size=2048)
    print(f"CPU float32 matmul rate measured here: {peak / 1e9:.1f} GFLOP/s per device (the MFU reference)")
    rows = []
    for case in cpu_cases(names):
        single = dataclasses.replace(case, name=f"{case.name}, 1 doc/row", documents_per_row=1)
        packed, one_doc = bench_bertjax(case, steps, peak), bench_bertjax(single, steps, peak)
        rows += [packed, one_doc]
        if with_transformers:
            model = MODEL_CLASSES["masked_lm"](case.config)
            theirs = bench_transformers(case, steps, init_params(model, jax.random.key(0)), model, device="cpu")
            for ours in (packed, one_doc):
                ours["speedup_vs_transformers"] = ours["tokens_per_sec"] / theirs["tokens_per_sec"]
            rows.append(theirs)
    return rows


def run_electra(steps: int) -> list[dict]:
    """ELECTRA-Small's train step against MLM alone on the same discriminator body, and the FLOPs of both.

    ELECTRA adds a generator (1/4 of the width, same depth) and a per-token RTD head; its step should cost about
    (ELECTRA FLOPs / MLM FLOPs) times the MLM step, i.e. 1 + the generator's share.
    """
    peak = flops_lib.measure_peak_flops(jnp.float32, size=2048)
    config = get_config("electra-small-discriminator", dropout_rate=0.0)
    mlm = Case("electra-small body, MLM only", config, batch=16, seq_len=128)
    electra = Case("electra-small, ELECTRA", config, batch=16, seq_len=128, objective="electra",
                   objective_options={"generator_size": 0.25})
    rows = [bench_bertjax(mlm, steps, peak), bench_bertjax(electra, steps, peak)]
    time_ratio = rows[1]["step_ms"] / rows[0]["step_ms"]
    flops_ratio = rows[1]["model_flops"] / rows[0]["model_flops"]
    print(f"ELECTRA / MLM: step time {time_ratio:.2f}x, model FLOPs {flops_ratio:.2f}x "
          f"({rows[0]['model_flops'] / 1e9:.1f} vs {rows[1]['model_flops'] / 1e9:.1f} GFLOP per step)")
    return rows


def run_gpu(steps: int, batch: int) -> list[dict]:
    config = get_config("modernbert-base", dtype="bfloat16", max_position_embeddings=1024)
    case = Case("modernbert-base bf16", config, batch=batch, seq_len=1024, documents_per_row=1)
    peak = flops_lib.peak_flops_per_device()
    ours = bench_bertjax(case, steps, peak)
    # The same initial weights as the bertjax state (same init key), exported for transformers.
    model = MODEL_CLASSES["masked_lm"](config.replace(dtype="float32"))
    theirs = bench_transformers(case, steps, init_params(model, jax.random.key(0)), model, device="cuda")
    ours["speedup_vs_transformers"] = ours["tokens_per_sec"] / theirs["tokens_per_sec"]
    return [ours, theirs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="the GPU comparison (needs a CUDA JAX and torch)")
    parser.add_argument("--electra", action="store_true",
                        help="ELECTRA-Small's step against MLM alone on the same discriminator (CPU)")
    parser.add_argument("--no-transformers", action="store_true",
                        help="CPU: bertjax only (no side-by-side transformers step)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="CPU: time CPU seconds with XLA and torch on one thread each (a loaded machine)")
    parser.add_argument("--cases", default=None,
                        help="CPU: comma-separated case names to run (tiny, modernbert-base, bert-base)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 5 on CPU, 20 on GPU)")
    parser.add_argument("--gpu-batch", type=int, default=16, help="rows of 1024 tokens per GPU step")
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        import torch
        torch.set_num_threads(1)
        CLOCK = time.process_time
    print(f"{datetime.date.today()}  {platform.platform()}  jax {jax.__version__}  "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}  cores {os.cpu_count()}")
    if args.gpu:
        if jax.default_backend() != "gpu":
            raise SystemExit("--gpu: JAX sees no GPU here (jax.default_backend() is "
                             f"{jax.default_backend()!r}); run it on a GPU host")
        rows = run_gpu(args.steps or 20, args.gpu_batch)
    elif args.electra:
        rows = run_electra(args.steps or 5)
    else:
        rows = run_cpu(args.steps or 5, with_transformers=not args.no_transformers, names=args.cases)
    unit = "CPU ms" if args.cpu_time else "step ms"
    print(f"\n{'case':<40} {'batch x seq':>12} {unit:>9} {'tokens/s':>10} {'MFU':>7} {'vs HF':>6}")
    for row in rows:
        shape = f"{row['batch']}x{row['seq_len']}" if "batch" in row else ""
        mfu = f"{100 * row['mfu']:.1f}%" if "mfu" in row else ""
        ratio = f"{row['speedup_vs_transformers']:.2f}x" if "speedup_vs_transformers" in row else ""
        print(f"{row['case']:<40} {shape:>12} {row['step_ms']:>9.1f} {row['tokens_per_sec']:>10.0f} {mfu:>7} "
              f"{ratio:>6}")


if __name__ == "__main__":
    main()
