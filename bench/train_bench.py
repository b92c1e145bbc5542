"""Training throughput (tokens/s) and model FLOPs utilisation of the jitted train step.

    python -m bench.train_bench                       # CPU: tiny, modernbert-base and bert-base at short rows,
                                                      # packed and one document per row, against transformers
    python -m bench.train_bench --cpu-time            # CPU: one thread each, CPU seconds (for a shared machine)
    python -m bench.train_bench --gpu                 # GPU: modernbert-base, rows of 1024 tokens, bfloat16, against
                                                      # transformers' ModernBertForMaskedLM on identical batches
    python -m bench.train_bench --gpu --gpu-batch 16 32 --attention pallas_gpu xla   # a sweep, one table
    python -m bench.train_bench --gpu --gpu-batch 32 --norm xla pallas_gpu   # XLA's norms against the norm kernel
    python -m bench.train_bench --gpu --gpu-batch 32 --fused-qkv on off --norm pallas_gpu xla --no-transformers
    python -m bench.train_bench --gpu --gpu-batch 32 --fused-qkv on off --norm pallas_gpu xla --glu pallas_gpu xla
    python -m bench.train_bench --gpu-max-batch bertjax --gpu-seq 8192        # the largest batch that trains;
    python -m bench.train_bench --gpu-max-batch transformers --gpu-seq 8192   # one framework per process
    python -m bench.train_bench --gpu-max-batch bertjax --gpu-seq 8192 --topology h100   # no GPU: by compiled memory
    python -m bench.train_bench --gpu-max-batch bertjax --gpu-seq 8192 --start-batch 24 --near   # from that answer
    python -m bench.train_bench --gpu --dry-run --gpu-seq 64 --steps 1      # the GPU path on CPU, a tiny model

The step is the one `bertjax pretrain` runs (StableAdamW, MLM at 30% gathered before the vocabulary projection,
state donated), fed synthetic packed rows so that only the step is timed. MFU counts model FLOPs
(bertjax/train/flops.py) against the device's peak: the published bf16 peak on accelerators; on CPU, which has no
published figure, the float32 matmul rate measured in the same run. On packed rows it is given two ways: each
document at its own length (what the attention kernels compute; the 45% target is judged on this) and each row as
one dense sequence (flops.py's count at the row's length). Needs no data pipeline (no grain import).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import os
import platform
import tempfile
import time

import sys

if "--cpu-time" in sys.argv:  # XLA reads its flags when jax is imported: one thread for every XLA computation
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"

from bertjax.cpu_allocator import reuse_freed_memory  # noqa: E402

# --dry-run runs the GPU paths on CPU with a tiny model, to check them before a GPU lease spends time on them.
DRY_RUN = "--dry-run" in sys.argv
# --topology compiles for a GPU this machine does not have: no GPU needed either.
GPU_MODE = ("--gpu" in sys.argv or "--gpu-max-batch" in sys.argv) and not DRY_RUN and "--topology" not in sys.argv
TORCH_DEVICE = "cuda" if not DRY_RUN else "cpu"  # where the GPU paths put transformers


def _max_batch_framework() -> str | None:
    """--gpu-max-batch's framework, read before jax is imported (its allocator settings depend on it)."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # "--gpu" is no "--gpu-max-batch"
    early.add_argument("--gpu-max-batch", default=None)
    return early.parse_known_args()[0].gpu_max_batch


if GPU_MODE:
    if _max_batch_framework() == "bertjax":
        # JAX alone on the card: one preallocated region of 95% of it (JAX's default does 75%), as a user training
        # on a GPU has. Grown on demand, the allocator keeps regions that one buffer cannot span (JAX's docs warn
        # of fragmentation without preallocation): on the second lease (2026-11-27) the step's one ~70 GiB
        # temporary buffer failed to allocate at batch 24 and 23 although, with the ~2 GiB train state, it was
        # under the 75.2 GiB limit. That preallocation fixes this is the likely reading, for the next lease to check.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    else:
        # Both frameworks share the GPU in one process (--gpu), or torch has it (--gpu-max-batch transformers): JAX
        # must not take 75% of its memory up front.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
else:
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
    remat_policy: str = "none"

    def run_config(self, steps: int):
        """The run config of `bertjax pretrain` for this case: the model's every field as an override."""
        return run_config_from_dict({
            "model": {"preset": "bert-base", "overrides": self.config.to_dict(), "remat_policy": self.remat_policy},
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


def per_document_flops(objective, case: Case, segment_ids: np.ndarray, predictions: float) -> float:
    """The step's model FLOPs counting each packed document as a row of its own length: what the attention kernels
    compute, since a query scores only its own document's keys (flops.py's count at the row's length credits the
    step with global attention across documents that no kernel computes). Equal to it at one document per row."""
    lengths = np.concatenate([np.bincount(row)[1:] for row in segment_ids])  # segment 0 is padding
    lengths, documents = np.unique(lengths[lengths > 0], return_counts=True)
    tokens = float((lengths * documents).sum())
    total = 0.0
    for length, count in zip(lengths.tolist(), documents.tolist()):
        share = count * length / tokens
        total += objective.train_flops(seq_len=length, tokens=count * length, predictions=predictions * share,
                                       rows=case.batch * share)
    return total


def bench_bertjax(case: Case, steps: int, peak_per_device: float | None) -> dict:
    setup = setup_run(case.run_config(steps), vocab_size=case.config.vocab_size, pad_id=case.config.pad_token_id)
    state = setup.fresh_state()
    host = synthetic_batch(case)
    batch = {k: jax.device_put(v, batch_sharding(setup.mesh, mesh_lib.BATCH_AXES)) for k, v in host.items()}
    seconds, _, loss = time_steps(lambda s, b: setup.train_step(s, setup.frozen, b), state, batch, steps)
    tokens = case.batch * case.seq_len
    predictions = float(host["masked_weights"].sum())
    model_flops = setup.objective.train_flops(seq_len=case.seq_len, tokens=tokens, predictions=predictions,
                                              rows=case.batch)
    document_flops = per_document_flops(setup.objective, case, host["segment_ids"], predictions)
    mfu = lambda flops: (flops_lib.mfu(flops, seconds, jax.device_count(), peak_per_device) if peak_per_device
                         else float("nan"))  # nan: no datasheet peak for this accelerator
    return {"case": case.name, "params_M": count_params(state.params) / 1e6, "batch": case.batch,
            "seq_len": case.seq_len, "documents_per_row": case.documents_per_row, "dtype": case.config.dtype,
            "step_ms": 1e3 * seconds, "tokens_per_sec": tokens / seconds, "model_flops": model_flops,
            "model_flops_per_document": document_flops, "mfu": mfu(model_flops),
            "mfu_per_document": mfu(document_flops), "first_loss": loss}


def transformers_rows(case: Case) -> dict[str, np.ndarray]:
    """The rows transformers trains on: one document per row, no padding (it has no packing), labels -100 except
    at the same masked positions as the bertjax batch."""
    rows = synthetic_batch(case, documents_per_row=1)
    labels = np.full((case.batch, case.seq_len), -100, np.int64)
    np.put_along_axis(labels, rows["masked_positions"], rows["masked_ids"], axis=1)
    return {"input_ids": rows["input_ids"].astype(np.int64), "labels": labels}


class TransformersTrainer:
    """transformers' masked-LM class of the same family (bf16 autocast on GPU; ModernBERT with sparse prediction)
    with torch's AdamW (fused on GPU) on bertjax's initial weights: `step(rows)` is one training step."""

    def __init__(self, jax_params, jax_model, device: str = "cuda", attention: str = "sdpa",
                 checkpointing: bool = False):
        import torch
        import transformers

        import bertjax

        with tempfile.TemporaryDirectory() as tmp:
            bertjax.save_pretrained(tmp, jax_model, jax.device_get(jax_params))
            extra = {"sparse_prediction": True} if jax_model.config.family == "modernbert" else {}
            model = transformers.AutoModelForMaskedLM.from_pretrained(tmp, attn_implementation=attention, **extra)
        if checkpointing:
            model.gradient_checkpointing_enable()
        self.torch, self.device, self.attention = torch, device, attention
        self.model = model.to(device).train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.98), eps=1e-6,
                                           weight_decay=1e-5, fused=device == "cuda")
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")

    def inputs(self, case: Case) -> dict:
        rows = transformers_rows(case)
        inputs = {name: self.torch.from_numpy(value).to(self.device) for name, value in rows.items()}
        inputs["attention_mask"] = self.torch.ones(case.batch, case.seq_len, dtype=self.torch.int64,
                                                   device=self.device)
        return inputs

    def step(self, inputs):
        with self.autocast:
            loss = self.model(**inputs).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def synchronize(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()


def bench_transformers(case: Case, steps: int, jax_params, jax_model, device: str = "cuda",
                       attention: str = "sdpa") -> dict:
    """Seconds per step of TransformersTrainer on the case's one-document rows."""
    trainer = TransformersTrainer(jax_params, jax_model, device, attention)
    inputs = trainer.inputs(case)
    step, synchronize = (lambda: trainer.step(inputs)), trainer.synchronize
    first_loss = step().item()
    synchronize()
    start = CLOCK()
    for _ in range(steps):
        step()
    synchronize()
    seconds = (CLOCK() - start) / steps
    return {"case": f"{case.name} (transformers, {attention})", "batch": case.batch, "seq_len": case.seq_len,
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


# The ModernBERT paper's training throughput of ModernBERT-base on one H100 (about 26% MFU).
PAPER_TOKENS_PER_SEC_H100 = 312_000


def transformers_attentions() -> list[str]:
    """The attention implementations transformers can train ModernBERT with here: sdpa, and flash attention when its
    package is installed (the faster of the two is the reference)."""
    import transformers.utils

    return ["sdpa"] + (["flash_attention_2"] if transformers.utils.is_flash_attn_2_available() else [])


def gpu_config(seq_len: int, attention: str = "auto", norm: str = "xla", fused_qkv: bool = False, glu: str = "xla"):
    kernels = dict(attention_implementation=attention, norm_implementation=norm, attention_fused_qkv=fused_qkv,
                   glu_implementation=glu)
    if DRY_RUN:  # same family and dtype, a model that compiles in seconds
        return get_config("modernbert-base", dtype="bfloat16", max_position_embeddings=max(seq_len, 128),
                          hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, local_window=32,
                          vocab_size=512, pad_token_id=0, **kernels)
    return get_config("modernbert-base", dtype="bfloat16", max_position_embeddings=max(seq_len, 8192), **kernels)


def initial_weights(seq_len: int):
    """The masked-LM model and its float32 initial weights, the bertjax state's (same init key), for transformers.
    Built with XLA attention: the weights do not depend on the kernel, and the Pallas GPU kernels neither run on
    the CPU device the memory search initialises on (the default backend picks them) nor need compiling here."""
    model = MODEL_CLASSES["masked_lm"](gpu_config(seq_len, "xla").replace(dtype="float32"))
    return model, init_params(model, jax.random.key(0))


def progress(row: dict) -> dict:
    """Print a measured row at once (a run cut off by a time limit keeps what it measured), and return it."""
    print(f"  {row['case']}, batch {row['batch']} x {row['seq_len']}: {row['step_ms']:.1f} ms/step, "
          f"{row['tokens_per_sec']:,.0f} tokens/s" + (f", MFU {mfu_text(row)}" if "mfu" in row else ""), flush=True)
    return row


def mfu_text(row: dict) -> str:
    """MFU by both counts where they differ (packed rows): per document, and counting each row as one dense
    sequence of its full length (bertjax/train/flops.py's count at the row's length)."""
    if row.get("documents_per_row", 1) == 1 or "mfu_per_document" not in row:
        return f"{100 * row['mfu']:.1f}%"
    return f"{100 * row['mfu_per_document']:.1f}% per document ({100 * row['mfu']:.1f}% packed as dense)"


def measure_bertjax(case: Case, steps: int, peak: float | None) -> dict | None:
    """bench_bertjax's row, printed; None (and the error's first line) where the case fails to compile or run, so
    a lease's stage goes on to the next case (a new kernel failing on the card costs that row, not the stage)."""
    try:
        return progress(bench_bertjax(case, steps, peak))
    except Exception as error:  # noqa: BLE001
        print(f"  {case.name}, batch {case.batch} x {case.seq_len}: failed: {type(error).__name__}: "
              f"{(str(error).splitlines() or [''])[0][:200]}", flush=True)
        return None


def run_gpu(steps: int, batches: list[int], seq_len: int, attentions: list[str],
            norms: tuple[str, ...] = ("xla",), with_transformers: bool = True,
            fused_qkv: tuple[bool, ...] = (False,), glus: tuple[str, ...] = ("xla",)) -> list[dict]:
    """For each batch size: bertjax with each attention, norm and GLU implementation, stacked q/k/v or not, on
    packed rows (4 documents per row, as pretraining feeds it), then each on one document per row, and transformers
    (each attention it has) on
    those same one-document rows and initial weights. The first implementation's packed rows and transformers come
    first, so a run stopped at its time cap (SIGINT) still has the comparison; it then prints what it measured."""
    peak = flops_lib.peak_flops_per_device()
    if peak is None and jax.devices()[0].platform == "cpu":  # a --dry-run: the CPU's measured matmul rate
        peak = flops_lib.measure_peak_flops()
        print(f"# no spec peak for a CPU: MFU against a measured {peak / 1e12:.2f} TFLOP/s (float32 matmul)",
              flush=True)
    elif peak is None:  # a small timed matmul on a large accelerator measures launch overhead, not its peak
        print(f"# no datasheet peak for a {jax.devices()[0].device_kind} in bertjax.train.flops: no MFU", flush=True)
    rows, best = [], None
    try:
        for batch in batches:
            choices = list(itertools.product(attentions, fused_qkv, norms, glus))
            packed = [Case(f"modernbert-base bf16, {attention}" + (", stacked qkv" if fused else "")
                           + ("" if norm == "xla" else f", {norm} norm") + ("" if glu == "xla" else f", {glu} GLU"),
                           gpu_config(seq_len, attention, norm, fused, glu), batch=batch, seq_len=seq_len,
                           documents_per_row=4)
                      for attention, fused, norm, glu in choices]
            # The first and the last combination first (`--fused-qkv on off --norm pallas_gpu xla --glu pallas_gpu
            # xla`: everything new against everything as it was), so a stage stopped at its cap still has that
            # comparison; then the others by how many choices they share with the first (each new thing alone).
            if len(packed) > 2:
                shared = lambda i: sum(a == b for a, b in zip(choices[i], choices[0]))
                packed = [packed[0], packed[-1]] + [packed[i] for i in sorted(range(1, len(packed) - 1), key=shared)]
            cases = packed + [dataclasses.replace(case, name=f"{case.name}, 1 doc/row", documents_per_row=1)
                              for case in packed]
            ours = [row for row in [measure_bertjax(cases[0], steps, peak)] if row]
            best = None
            if with_transformers:
                model, params = initial_weights(seq_len)
                case = Case("modernbert-base bf16", gpu_config(seq_len), batch=batch, seq_len=seq_len,
                            documents_per_row=1)
                theirs = []
                for attention in transformers_attentions():
                    theirs.append(progress(bench_transformers(case, steps, params, model, TORCH_DEVICE, attention)))
                    rows.append(theirs[-1])
                del params
                best = max(theirs, key=lambda row: row["tokens_per_sec"])
            rows += ours
            for measured in cases[1:]:
                row = measure_bertjax(measured, steps, peak)
                if row:
                    ours.append(row)
                    rows.append(row)
            if best is not None:
                for row in ours:
                    row["speedup_vs_transformers"] = row["tokens_per_sec"] / best["tokens_per_sec"]
    except KeyboardInterrupt:  # launch/gpu_session.sh's time cap
        print("# interrupted: the summary below is of the rows above", flush=True)
    for row in rows:  # a batch interrupted after its transformers rows: its bertjax rows against them
        if best is not None and "mfu" in row and "speedup_vs_transformers" not in row:
            row["speedup_vs_transformers"] = row["tokens_per_sec"] / best["tokens_per_sec"]
    for line in summary_lines(rows, jax.devices()[0].device_kind):
        print(line)
    return rows


def summary_lines(rows: list[dict], device_kind: str) -> list[str]:
    """The GPU comparison's verdicts. MFU >= 45% is judged per document (the FLOPs the kernels must do; packed as
    dense is shown beside it). The speed-up against transformers is given twice: the fastest bertjax row (packed
    rows, as pretraining feeds them) against transformers' one-document rows, and like for like, bertjax's fastest
    one-document row against the same; >= 1.5x is judged like for like ("on the same rows")."""
    ours = [row for row in rows if "mfu" in row]
    if not ours:
        return []
    fastest = lambda candidates: max(candidates, key=lambda row: row["tokens_per_sec"])
    best = fastest(ours)
    mfu = best.get("mfu_per_document", best["mfu"])
    lines = [f"best bertjax: {best['case']} batch {best['batch']}: {best['tokens_per_sec']:,.0f} tokens/s, MFU "
             f"{mfu_text(best)} (target >= 45% per document: "
             f"{'no datasheet peak' if np.isnan(mfu) else 'met' if mfu >= 0.45 else 'NOT met'})"]
    if "speedup_vs_transformers" in best:
        single = [row for row in ours if row.get("documents_per_row", 1) == 1 and "speedup_vs_transformers" in row]
        like = fastest(single) if single else None
        lines.append(f"  against transformers' one-document rows: {best['speedup_vs_transformers']:.2f}x (this row"
                     f"{', packed' if best.get('documents_per_row', 1) > 1 else ''})" + (
                         f"; like for like, {like['case']}: {like['speedup_vs_transformers']:.2f}x (target >= 1.5x "
                         f"on the same rows: {'met' if like['speedup_vs_transformers'] >= 1.5 else 'NOT met'})"
                         if like else "; like for like (one document per row): not measured"))
    # The paper's figure is an H100's: on any other card the ratio says nothing about that target.
    on = "" if "H100" in device_kind else f", measured on a {device_kind}, not an H100: not that target's card"
    lines.append(f"  {best['tokens_per_sec'] / PAPER_TOKENS_PER_SEC_H100:.2f}x the paper's "
                 f"{PAPER_TOKENS_PER_SEC_H100:,} tokens/s on one H100{on}")
    return lines


def is_out_of_memory(error: Exception) -> bool:
    text = f"{type(error).__name__}: {error}"
    return "RESOURCE_EXHAUSTED" in text or "OutOfMemory" in text or "out of memory" in text.lower()


def largest_fitting(fits, limit: int = 4096, start: int = 1, near: bool = False) -> int:
    """The largest batch b <= limit with fits(b) true (0 if none). Fitting is monotone in the batch size. From
    `start`, it doubles the batch until one does not fit (or bisects below `start` when that does not fit), then
    bisects: about 2 log2 of the distance to the answer in tries, each a compile on an accelerator. With `near`,
    `start` is a prediction: the steps away from it grow 1, 2, 4, ... in either direction, so a right prediction
    costs two tries (it, and one more that does not fit)."""
    low, high = 0, limit + 1  # fits(low) holds (0 trivially), fits(high) does not (beyond the limit)
    batch, step = max(1, min(start, limit)), 1
    if fits(batch):
        low = batch
        while high > limit and low < limit:
            batch = min(low + step if near else 2 * low, limit)
            step *= 2
            if fits(batch):
                low = batch
            else:
                high = batch
    else:
        high = batch
        while near and low == 0 and high > 1:
            batch = max(high - step, 1)
            step *= 2
            if fits(batch):
                low = batch
            else:
                high = batch
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def memory_probe(framework: str, attempt, release):
    """fits(batch) for `largest_fitting`: attempt(batch) -> finite loss, run for that batch; an out-of-memory error is
    a no, anything else is raised; release() frees what the try left, whatever happened."""
    def fits(batch: int) -> bool:
        try:
            answer = bool(attempt(batch))
        except Exception as error:  # noqa: BLE001: only out-of-memory is an answer
            if not is_out_of_memory(error):
                raise
            answer = False
        finally:
            release()
        print(f"  {framework} batch {batch}: {'fits' if answer else 'out of memory'}", flush=True)
        return answer
    return fits


def compiled_max_batch(seq_len: int, remat_policy: str, topology: str, start: int | str = 1, fraction: float = 0.95,
                       limit: int = 4096, norm: str = "xla", glu: str = "xla") -> list[dict]:
    """Without a GPU: the largest batch of modernbert-base rows whose train step, compiled for `topology` (XLA's
    deviceless GPU compilation, bertjax/gpu_aot.py), needs at most `fraction` of the card's memory by XLA's buffer
    assignment (arguments + outputs - aliased + temporaries). A prediction for `--gpu-max-batch bertjax` on the
    card (`--start-batch N --near`), which runs it: the card adds the CUDA context, cuBLAS workspaces and the
    allocator's fragmentation, and its autotuned programs may differ."""
    from bertjax import gpu_aot
    from bertjax.tpu_aot import device_bytes

    devices = gpu_aot.gpu_devices(topology)
    budget = fraction * gpu_aot.device_memory_gib(topology) * 2**30
    if start == "auto":  # the card's own memory, as described, at the share JAX would take of it
        start, why = scaled_start_batch("bertjax", seq_len, budget)
        print(f"# the search starts at {start} rows: {why}", flush=True)
    config = gpu_config(seq_len, norm=norm, glu=glu)

    def fits(batch: int) -> bool:
        case = Case("max batch", config, batch=batch, seq_len=seq_len, documents_per_row=1, remat_policy=remat_policy)
        setup = setup_run(case.run_config(2), vocab_size=config.vocab_size, pad_id=config.pad_token_id,
                          devices=devices, attention_platform="gpu", compile_only=True)
        arrays = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding(setup.mesh, mesh_lib.BATCH_AXES))
                  for k, v in synthetic_batch(case).items()}
        used = device_bytes(gpu_aot.compile_lowered(setup.train_step.lower(setup.abstract_state(), setup.frozen,
                                                                           arrays)).memory_analysis())
        print(f"  compiled for {topology}, batch {batch}: {used / 2**30:.1f} GiB of {budget / 2**30:.1f} GiB "
              f"({'fits' if used <= budget else 'too large'})", flush=True)
        return used <= budget

    best = largest_fitting(fits, limit, start, near=True)
    print(f"largest batch of {seq_len}-token rows whose compiled step fits {fraction:g} of {topology}'s memory, "
          f"bertjax (remat {remat_policy}): {best} ({best * seq_len:,} tokens per step)")
    return [{"case": f"compiled max batch, {topology}, remat {remat_policy}", "batch": best, "seq_len": seq_len,
             "step_ms": float("nan"), "tokens_per_sec": float("nan")}]


def describe_memory(analysis, device) -> str:
    """A compiled program's buffers (XLA's memory_analysis) and the device's memory in use before it runs, in GiB."""
    gib = lambda n: "?" if n is None else f"{n / 2**30:.2f}"
    stats = device.memory_stats() or {}
    fields = {name: getattr(analysis, f"{name}_size_in_bytes", 0) for name in ("argument", "output", "alias", "temp")}
    return (f"compiled step: arguments {gib(fields['argument'])} + outputs {gib(fields['output'])} - aliased "
            f"{gib(fields['alias'])} + temporaries {gib(fields['temp'])} GiB; device in use before it "
            f"{gib(stats.get('bytes_in_use'))} of {gib(stats.get('bytes_limit'))} GiB (largest free block "
            f"{gib(stats.get('largest_free_block_bytes'))}, reserved {gib(stats.get('bytes_reserved'))})")


def run_gpu_max_batch(framework: str, seq_len: int, remat_policy: str, start: int | str = 1, limit: int = 4096,
                      near: bool = False, norm: str = "xla", glu: str = "xla") -> list[dict]:
    """The largest batch of modernbert-base rows of `seq_len` tokens whose training step runs on this GPU, for one
    framework (run each in its own process: neither hands its freed memory back to the other). Each try runs two
    steps. `near`: `start` is a prediction (`compiled_max_batch`'s, made without a GPU), so the search steps 1, 2,
    4, ... away from it."""
    import gc

    if start == "auto":
        start, why = scaled_start_batch(framework, seq_len, card_memory_bytes(framework))
        print(f"# {framework}: the search starts at {start} rows: {why}", flush=True)
    config = gpu_config(seq_len, norm=norm, glu=glu)
    case = lambda batch: Case("max batch", config, batch=batch, seq_len=seq_len, documents_per_row=1,
                              remat_policy=remat_policy)
    if framework == "bertjax":
        def attempt(batch: int) -> bool:
            setup = setup_run(case(batch).run_config(2), vocab_size=config.vocab_size, pad_id=config.pad_token_id)
            state = setup.fresh_state()
            arrays = {k: jax.device_put(v, batch_sharding(setup.mesh, mesh_lib.BATCH_AXES))
                      for k, v in synthetic_batch(case(batch)).items()}
            step = setup.train_step.lower(state, setup.frozen, arrays).compile()
            # What the card's compile asked for (after XLA's rematerialisation) against what is already held: the
            # line that tells an allocator's failure from a program too large.
            print(f"  bertjax batch {batch}: {describe_memory(step.memory_analysis(), jax.devices()[0])}", flush=True)
            for _ in range(2):
                state, metrics = step(state, setup.frozen, arrays)
            return np.isfinite(float(metrics["loss"]))

        fits = memory_probe(framework, attempt, gc.collect)
    else:
        cpus = _devices_or_none("cpu")
        with jax.default_device(cpus[0] if cpus else jax.devices()[0]):  # keep the GPU for torch where possible
            model, params = initial_weights(seq_len)
        trainer = TransformersTrainer(params, model, TORCH_DEVICE,
                                      transformers_attentions()[-1],  # flash attention if installed: least memory
                                      checkpointing=remat_policy != "none")
        del params

        def attempt(batch: int) -> bool:
            inputs = trainer.inputs(case(batch))
            for _ in range(2):
                loss = trainer.step(inputs)
            return np.isfinite(loss.item())

        def release():
            trainer.optimizer.zero_grad(set_to_none=True)
            gc.collect()
            if TORCH_DEVICE == "cuda":
                trainer.torch.cuda.empty_cache()

        fits = memory_probe(framework, attempt, release)

    answers = {}

    def recorded(batch: int) -> bool:
        answers[batch] = fits(batch)
        return answers[batch]

    try:
        best, bound = largest_fitting(recorded, limit, start, near=near), ""
    except KeyboardInterrupt:  # launch/gpu_session.sh's time cap: what was tried still bounds the answer
        best = max((b for b, fit in answers.items() if fit), default=0)
        failed = min((b for b, fit in answers.items() if not fit), default=None)
        bound = f" at least (interrupted; {'no failure seen' if failed is None else f'{failed} did not fit'})"
    device = jax.devices()[0]
    memory = (device.memory_stats() or {}).get("bytes_limit") if framework == "bertjax" else None
    print(f"largest batch of {seq_len}-token rows that trains, {framework} (remat {remat_policy}):{bound} {best} "
          f"({best * seq_len:,} tokens per step) on {device.device_kind}"
          + (f", JAX's memory limit {memory / 2**30:.1f} GiB" if memory else ""))
    return [{"case": f"max batch, {framework}, remat {remat_policy}", "batch": best, "seq_len": seq_len,
             "step_ms": float("nan"), "tokens_per_sec": float("nan")}]


# The largest batches of 8192-token modernbert-base rows found on an H100 80GB (docs/benchmarks.md: bertjax's deviceless
# compile for it, 24-25 rows under JAX's 75.2 GiB limit; transformers 9 rows on the second lease), and the memory
# each framework could use there. A card of another size starts its search at the same share of its own memory:
# on an H200 (~132.6 GiB for JAX) the H100's 24 is ~18 rows short, 8-10 compiles of ~50 s each from 24.
# bertjax's is JAX's bytes_limit preallocating 95% of the card; transformers' the whole card by nvidia-smi (torch's
# total_memory may count a little less: this makes a start point, not a bound).
H100_MAX_BATCH_8192 = {"bertjax": 24, "transformers": 9}
H100_MEMORY_BYTES = {"bertjax": 75.2 * 2**30, "transformers": 81_559 * 2**20}


def scaled_start_batch(framework: str, seq_len: int, memory_bytes: float | None) -> tuple[int, str]:
    """`--start-batch auto`: (the first batch to try, why). The H100's answer at 8192 tokens, scaled by this card's
    memory against the H100's and by 8192 / seq_len (activations grow with the tokens of a step); the H100's answer
    unscaled by memory where the card's memory is unknown."""
    h100 = H100_MAX_BATCH_8192[framework] * 8192 / seq_len
    answer = f"the H100's {H100_MAX_BATCH_8192[framework]} at 8192 tokens" + (
        "" if seq_len == 8192 else f" x 8192 / {seq_len}")
    if not memory_bytes:
        return max(1, round(h100)), f"{answer}: this card's memory is unknown"
    start = max(1, round(h100 * memory_bytes / H100_MEMORY_BYTES[framework]))
    return start, (f"{answer} x {memory_bytes / 2**30:.1f} GiB / {H100_MEMORY_BYTES[framework] / 2**30:.1f} GiB "
                   "(this card's memory against the H100's)")


def card_memory_bytes(framework: str) -> float | None:
    """The memory `framework` may use on this card: JAX's allocator limit for bertjax, torch's total for
    transformers; None where neither says (a CPU dry run, an allocator without statistics)."""
    try:
        if framework == "bertjax":
            return (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
        import torch

        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001: a start point only; the fixed one does
        return None


def start_batch_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of rows or auto, not {text!r}") from None


def _devices_or_none(backend: str) -> list:
    try:
        return jax.devices(backend)
    except RuntimeError:  # that platform is not enabled (JAX_PLATFORMS)
        return []


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="the GPU comparison (needs a CUDA JAX and torch)")
    parser.add_argument("--electra", action="store_true",
                        help="ELECTRA-Small's step against MLM alone on the same discriminator (CPU)")
    parser.add_argument("--no-transformers", action="store_true",
                        help="CPU and --gpu: bertjax only (no side-by-side transformers step)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="CPU: time CPU seconds with XLA and torch on one thread each (a loaded machine)")
    parser.add_argument("--cases", default=None,
                        help="CPU: comma-separated case names to run (tiny, modernbert-base, bert-base)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 5 on CPU, 20 on GPU)")
    parser.add_argument("--gpu-batch", type=int, nargs="+", default=[16], help="GPU: rows per step (a sweep)")
    parser.add_argument("--gpu-seq", type=int, default=1024, help="GPU: tokens per row")
    parser.add_argument("--attention", nargs="+", default=["auto"],
                        help="GPU: bertjax attention implementations to time (auto is pallas_gpu on GPU)")
    parser.add_argument("--norm", nargs="+", default=["xla"], choices=["xla", "pallas_gpu"],
                        help="GPU: bertjax norm implementations to time (pallas_gpu: the residual add + norm "
                        "kernel), each with each --attention; --gpu-max-batch bertjax takes one")
    parser.add_argument("--glu", nargs="+", default=["xla"], choices=["xla", "pallas_gpu"],
                        help="GPU: bertjax gated-MLP implementations to time (pallas_gpu: the act(a) * b kernel), each "
                        "with each --attention and --norm; --gpu-max-batch bertjax takes one")
    parser.add_argument("--fused-qkv", nargs="+", default=["off"], choices=["on", "off"],
                        help="GPU: attention on the stacked q/k/v projection (EncoderConfig.attention_fused_qkv) "
                        "on, off or both, each with each --attention and --norm")
    parser.add_argument("--gpu-max-batch", choices=["bertjax", "transformers"], default=None,
                        help="GPU: find the largest batch of --gpu-seq rows that trains, for one framework")
    parser.add_argument("--remat", default="none", help="--gpu-max-batch: bertjax remat policy; any policy but "
                        "none turns on transformers' gradient checkpointing")
    parser.add_argument("--start-batch", type=start_batch_arg, default=1,
                        help="--gpu-max-batch: the first batch tried (each try compiles: start near the answer); "
                        "auto: the H100's answer scaled by this card's memory (scaled_start_batch)")
    parser.add_argument("--dry-run", action="store_true",
                        help="with --gpu or --gpu-max-batch: run that path on CPU with a tiny model (up to batch 4)")
    parser.add_argument("--near", action="store_true",
                        help="--gpu-max-batch: --start-batch is a prediction; step 1, 2, 4, ... away from it")
    parser.add_argument("--topology", default=None,
                        help="--gpu-max-batch bertjax without a GPU: the largest batch whose step compiled for this "
                        "GPU (h100, h200; XLA's deviceless compilation, needs JAX's CUDA plugin) fits 95%% of it")
    args = parser.parse_args(argv)
    if args.dry_run and not (args.gpu or args.gpu_max_batch):
        parser.error("--dry-run checks the GPU paths on CPU: give --gpu or --gpu-max-batch too")
    if args.gpu_max_batch and (len(args.norm) > 1 or len(args.glu) > 1):
        parser.error("--gpu-max-batch searches one model: give one --norm and one --glu")
    if args.topology and (args.gpu_max_batch != "bertjax" or args.dry_run):
        parser.error("--topology goes with --gpu-max-batch bertjax alone (it compiles for that GPU, runs nothing)")
    if min(args.gpu_batch + [args.gpu_seq, 1 if args.start_batch == "auto" else args.start_batch,
                             args.steps or 1]) <= 0:
        parser.error("--gpu-batch, --gpu-seq, --start-batch and --steps must be positive")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.cpu_time:
        global CLOCK
        import torch
        torch.set_num_threads(1)
        CLOCK = time.process_time
    print(f"{datetime.date.today()}  {platform.platform()}  jax {jax.__version__}  "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}  cores {os.cpu_count()}")
    if GPU_MODE and jax.default_backend() != "gpu":
        raise SystemExit("--gpu / --gpu-max-batch: JAX sees no GPU here (jax.default_backend() is "
                         f"{jax.default_backend()!r}); run it on a GPU host")
    if args.topology:
        rows = compiled_max_batch(args.gpu_seq, args.remat, args.topology, args.start_batch, norm=args.norm[0],
                                  glu=args.glu[0])
    elif args.gpu_max_batch:
        rows = run_gpu_max_batch(args.gpu_max_batch, args.gpu_seq, args.remat, args.start_batch,
                                 limit=4 if args.dry_run else 4096, near=args.near, norm=args.norm[0],
                                 glu=args.glu[0])
    elif args.gpu:
        rows = run_gpu(args.steps or 20, args.gpu_batch, args.gpu_seq, args.attention, tuple(args.norm),
                       with_transformers=not args.no_transformers,
                       fused_qkv=tuple(choice == "on" for choice in args.fused_qkv), glus=tuple(args.glu))
    elif args.electra:
        rows = run_electra(args.steps or 5)
    else:
        rows = run_cpu(args.steps or 5, with_transformers=not args.no_transformers, names=args.cases)
    unit = "CPU ms" if args.cpu_time else "step ms"
    print()
    if any("mfu" in row for row in rows):
        print("# MFU: each packed document counted at its own length (the 45% target's count); dense: each row as "
              "one sequence of its full length")
    print(f"{'case':<40} {'batch x seq':>12} {unit:>9} {'tokens/s':>10} {'MFU':>7} {'dense':>7} {'vs HF':>6}")
    for row in rows:
        shape = f"{row['batch']}x{row['seq_len']}" if "batch" in row else ""
        mfu = f"{100 * row.get('mfu_per_document', row['mfu']):.1f}%" if "mfu" in row else ""
        dense = f"{100 * row['mfu']:.1f}%" if "mfu" in row else ""
        ratio = f"{row['speedup_vs_transformers']:.2f}x" if "speedup_vs_transformers" in row else ""
        print(f"{row['case']:<40} {shape:>12} {row['step_ms']:>9.1f} {row['tokens_per_sec']:>10.0f} {mfu:>7} "
              f"{dense:>7} {ratio:>6}")


if __name__ == "__main__":
    main()
