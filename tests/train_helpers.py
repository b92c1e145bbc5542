"""Shared pieces of the pretraining tests: a tiny run config, a small tokenizer, and running `bertjax pretrain`
in a subprocess (XLA flags, signals and multiple processes need their own interpreter)."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

# hidden 32, 2 layers, rows of 32 tokens, batch 8: a step takes milliseconds, a compile a few seconds.
TINY_RUN = {
    "model": {"preset": "modernbert-tiny",
              "overrides": {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 48,
                            "local_window": 8, "max_position_embeddings": 64}},
    "data": {"input": "default", "seq_len": 32, "global_batch_size": 8, "mlm_probability": 0.3,
             "window_documents": 64},
    "optimizer": {"name": "stable_adamw", "learning_rate": 3.0e-3, "weight_decay": 1.0e-5},
    "schedule": {"name": "wsd", "warmup": 4, "decay": 8, "decay_shape": "1-sqrt"},
    "train": {"steps": 24, "log_every": 1, "progress_bar": False},
    "eval": {"at_start": False, "at_end": False, "fill_mask_examples": 0},
    "checkpoint": {"every": 8, "keep": 3},
}


@functools.lru_cache(maxsize=None)
def small_tokenizer() -> Path:
    """A 512-piece SentencePiece model on a slice of the default corpus, trained once per test session."""
    from bertjax.data import default_corpus_documents, train_sentencepiece

    out_dir = Path(tempfile.mkdtemp(prefix="bertjax-test-tokenizer-"))
    atexit.register(shutil.rmtree, out_dir, ignore_errors=True)
    train_sentencepiece(default_corpus_documents("train")[:1500], out_dir, vocab_size=512, max_lines=20_000)
    return out_dir


def write_config(path: Path, tokenizer_dir: Path, **sections) -> Path:
    config = json.loads(json.dumps(TINY_RUN))
    config["tokenizer"] = {"path": str(tokenizer_dir)}
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    path.write_text(yaml.safe_dump(config))
    return path


def _jaxlib_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(part) for part in version("jaxlib").split(".")[:3] if part.isdigit())


# Compiling tiny programs dominates these tests. XLA's CPU backend at optimisation level 0 compiles them about twice
# as fast. Up to jaxlib 0.11.0 (this project's CI has 0.10.2) it also keeps its older elemental emitters beside the
# MLIR fusion emitters, and those compile another ~40% faster (a tiny train step 1.8 -> 0.9 s, an op-by-op forward
# 2.6 -> 1.4 s; the suite's CPU time 7% less); from 0.11.1 the flag is gone and naming it aborts the process. Every
# run a test compares uses the same flags, so comparisons stay exact.
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true" + (
    " --xla_cpu_use_fusion_emitters=false" if _jaxlib_version() < (0, 11, 1) else "")


def cpu_env(devices: int = 1) -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE_FLAGS}"
    return env


def pretrain_command(config: Path, workdir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "bertjax", "pretrain", "--config", str(config), "--workdir", str(workdir), *args]


def run_pretrain(config: Path, workdir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    result = subprocess.run(pretrain_command(config, workdir, *args), env=cpu_env(), cwd=REPO,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"pretrain failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def logged_losses(workdir: Path) -> dict[int, float]:
    from bertjax.train.metrics import read_metrics
    return {r["step"]: r["loss"] for r in read_metrics(workdir) if "loss" in r}
