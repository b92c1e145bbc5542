"""A bertjax command on a machine without a TPU starts silently, even with libtpu installed (issue 14, point 1)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

import bertjax
from bertjax.data import load_tokenizer
from bertjax.model_dirs import save_model_dir
from bertjax.platforms import has_tpu_chips
from bertjax.tpu_aot import libtpu_available
from train_helpers import REPO, small_tokenizer

pytestmark = pytest.mark.skipif(has_tpu_chips(), reason="this machine has TPU chips: libtpu is meant to talk")

NOISE = ("libtpu", "TPU", "E0000", "InitGoogle", "worker hostname")


def test_fill_mask_starts_without_libtpu_output(tmp_path):
    if not libtpu_available():
        pytest.skip("libtpu is not installed: there is nothing to silence")
    tokenizer = load_tokenizer(small_tokenizer())
    config = bertjax.get_config("modernbert-tiny", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id,
                                hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32)
    model = bertjax.EncoderForMaskedLM(config)
    save_model_dir(str(tmp_path / "model"), model, bertjax.init_params(model, jax.random.key(0)))
    tokenizer.save(tmp_path / "model")
    # The user's environment: no JAX_PLATFORMS, nothing set for libtpu.
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS" and not k.startswith("TPU_")}
    # libtpu writes its log files under TEST_TMPDIR when set (else <tmp>/tpu_logs, shared with other processes).
    logs = tmp_path / "logs"
    logs.mkdir()
    env["TEST_TMPDIR"] = str(logs)
    result = subprocess.run([sys.executable, "-m", "bertjax", "fill-mask", "--model", str(tmp_path / "model"),
                             "A [MASK] returns a value."], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "mask 1:" in result.stdout
    output = result.stdout + result.stderr
    assert not [word for word in NOISE if word in output], output
    assert not list(logs.rglob("*"))  # no log file either


def test_a_python_script_importing_bertjax_starts_without_libtpu_output(tmp_path):
    """The README's quick start in a plain `python`: `import bertjax` sets libtpu's quiet defaults before JAX first
    looks for a TPU."""
    if not libtpu_available():
        pytest.skip("libtpu is not installed: there is nothing to silence")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS" and not k.startswith("TPU_")}
    logs = tmp_path / "logs"
    logs.mkdir()
    env["TEST_TMPDIR"] = str(logs)
    script = "import bertjax, jax; print(float(jax.numpy.ones(3).sum()), jax.default_backend())"
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("3.0"), result.stderr
    output = result.stdout + result.stderr
    assert not [word for word in NOISE if word in output], output
    assert not list(logs.rglob("*"))


@pytest.mark.parametrize("topology, module, check, words", [
    ("h100:3", "gpu_aot", "cuda_plugin_available", "needs JAX's CUDA plugin"),
    ("v5e:2x2", "tpu_aot", "libtpu_available", "needs the libtpu wheel"),
])
def test_compile_check_without_its_compiler_says_what_to_install_in_one_line(topology, module, check, words,
                                                                             monkeypatch, capsys):
    import importlib

    from bertjax.cli import main

    monkeypatch.setattr(importlib.import_module(f"bertjax.{module}"), check, lambda: False)
    assert main(["compile-check", "--config", str(REPO / "configs" / "pretrain" / "tiny.yaml"),
                 "--topology", topology]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertjax compile-check: error: ") and words in err and "Traceback" not in err


def test_version_names_bertjax_and_the_libraries_behind_its_numbers(capsys):
    """`bertjax --version`: one line for a bug report, each version as installed; bertjax's own is pyproject's."""
    import tomllib
    from importlib.metadata import version

    from bertjax.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and line.startswith(f"bertjax {bertjax.__version__} (")
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain"):
        assert f"{name} {version(name)}" in line
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert declared == bertjax.__version__
