"""launch/local_cpu.sh and launch/gpu_host.sh run from the checkout (pip installs it from there), yet a CONFIG and
WORKDIR given relative to the caller's directory mean the caller's files; a CONFIG that is no file there (a shipped
config's name) is passed on as written. `python3` is replaced by a recorder of its arguments: what is checked is
the command each script hands to `bertjax pretrain`."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def launched(script: str, caller: Path, *args: str, tmp_path: Path) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "argv"
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/sh\n[ "$1" = "-m" ] && printf "%s\\n" "$PWD" "$@" > {record}\nexit 0\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["bash", str(REPO / "launch" / script), *args], cwd=caller, env=env, check=True, timeout=30)
    return record.read_text().splitlines()


@pytest.mark.parametrize("script", ["local_cpu.sh", "gpu_host.sh"])
def test_relative_paths_are_the_callers(tmp_path, script):
    caller = tmp_path / "project"
    caller.mkdir()
    (caller / "my.yaml").write_text("model: {preset: bert-tiny}\n")
    cwd, *argv = launched(script, caller, "my.yaml", "runs/a", "train.steps=5", tmp_path=tmp_path)
    assert Path(cwd) == REPO
    assert argv == ["-m", "bertjax", "pretrain", "--config", str(caller / "my.yaml"), "--workdir",
                    str(caller / "runs/a"), "train.steps=5"]
    _, *argv = launched(script, caller, "tiny", "/abs/run", tmp_path=tmp_path)  # a shipped config's name
    assert argv[3:7] == ["--config", "tiny", "--workdir", "/abs/run"]


def test_local_cpu_defaults_stay_in_the_checkout(tmp_path):
    _, *argv = launched("local_cpu.sh", tmp_path, tmp_path=tmp_path)
    assert argv == ["-m", "bertjax", "pretrain", "--config", "configs/pretrain/tiny.yaml", "--workdir", "runs/tiny"]
