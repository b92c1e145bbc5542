"""Resuming: a run stopped by SIGTERM and by kill -9 and restarted logs exactly the losses of an uninterrupted
run (bit for bit on CPU); a damaged checkpoint is a clear error while the previous one still restores."""

import shutil
import signal
import subprocess
import time

import pytest

from bertjax.train.checkpoints import CheckpointError, Checkpointer, restore_params
from bertjax.train.run_config import CheckpointConfig
from train_helpers import REPO, cpu_env, logged_losses, pretrain_command, run_pretrain, small_tokenizer, \
    write_config

STEPS, EVERY = 160, 40


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    tokenizer = small_tokenizer()
    config = write_config(root / "run.yaml", tokenizer, train={"steps": STEPS},
                          checkpoint={"every": EVERY, "keep": 3})
    reference = root / "reference"
    run_pretrain(config, reference)
    return root, config, reference


def _start(config, workdir):
    return subprocess.Popen(pretrain_command(config, workdir), env=cpu_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for_step(workdir, step, process, timeout=180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"run ended before step {step}:\n{process.stdout.read()}")
        if max(logged_losses(workdir), default=0) >= step:
            return
        time.sleep(0.005)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def test_sigterm_and_kill9_then_resume_log_the_uninterrupted_losses(setup):
    root, config, reference = setup
    want = logged_losses(reference)
    assert sorted(want) == list(range(1, STEPS + 1))
    workdir = root / "interrupted"

    run = _start(config, workdir)
    _wait_for_step(workdir, 10, run)
    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 0, output
    assert "SIGTERM" in output
    stopped = max(logged_losses(workdir))
    assert stopped < STEPS
    assert (workdir / "checkpoints" / str(stopped)).is_dir()  # saved where it stopped, not only every EVERY

    run = _start(config, workdir)
    _wait_for_step(workdir, EVERY + 15, run)
    run.kill()  # SIGKILL: no chance to save; resumes from the last completed checkpoint
    run.communicate(timeout=60)

    run_pretrain(config, workdir)
    got = logged_losses(workdir)
    assert sorted(got) == sorted(want)
    assert got == want  # exact float equality


def test_corrupt_or_incomplete_checkpoint_is_a_clear_error_and_the_previous_one_restores(setup):
    root, config, reference = setup
    workdir = root / "damaged"
    shutil.copytree(reference, workdir)
    checkpoints = workdir / "checkpoints"
    assert sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) == [80, 120, 160]

    data_file = max((p for p in (checkpoints / "160" / "state").rglob("*") if p.is_file()),
                    key=lambda p: p.stat().st_size)
    content = bytearray(data_file.read_bytes())
    content[len(content) // 2] ^= 0xFF
    data_file.write_bytes(bytes(content))
    with pytest.raises(CheckpointError, match=f"{data_file.name} is corrupt"):
        restore_params(checkpoints / "160")

    next(p for p in (checkpoints / "120" / "state").rglob("*") if p.is_file() and p.suffix != ".json").unlink()
    with pytest.raises(CheckpointError, match="is missing"):
        restore_params(checkpoints / "120")

    params = restore_params(checkpoints / "80")
    assert params["encoder"]["layers_0"]["mlp"]["wo"]["kernel"].shape == (48, 32)

    # Resuming the run: a one-line error that names the damage and the way back ...
    more = [f"train.steps={STEPS + 8}"]
    failed = subprocess.run(pretrain_command(config, workdir, *more), env=cpu_env(), cwd=REPO,
                            capture_output=True, text=True, timeout=180)
    assert failed.returncode == 2
    assert "is corrupt" in failed.stderr and "checkpoint.restore_step=120" in failed.stderr, failed.stderr
    # ... and resuming from the good one (checkpoint.restore_step=80) first sets the later ones aside.
    checkpointer = Checkpointer(checkpoints, CheckpointConfig())
    assert checkpointer.set_aside_after(80) == [120, 160]
    assert checkpointer.all_steps() == [80]
    assert sorted(p.name for p in (workdir / "checkpoints-abandoned").iterdir()) == ["120", "160"]
    checkpointer.close()


def _tiny_state(value: float) -> dict:
    import jax.numpy as jnp
    return {"params": {"w": jnp.full((4,), value)}, "step": jnp.int32(int(value))}


def _checksums_while_training(checkpointer, step_dir, timeout=60.0) -> None:
    """What the loop does after every step, until `step_dir` has its checksums."""
    from bertjax.train.checkpoints import CHECKSUMS_FILE

    deadline = time.monotonic() + timeout
    while not (step_dir / CHECKSUMS_FILE).exists():
        assert time.monotonic() < deadline, f"{step_dir} never got its checksums"
        checkpointer.record_finished()
        time.sleep(0.01)


def test_an_async_save_gets_its_checksums_once_complete_not_at_the_next_save(tmp_path):
    """A run killed (SIGKILL, node loss) long after a save completed resumes from a verified checkpoint: the loop's
    record_finished after each step hashes the step once orbax has renamed it into place."""
    from bertjax.train.checkpoints import CHECKSUMS_FILE, verify_checksums

    checkpointer = Checkpointer(tmp_path / "ckpt", CheckpointConfig(keep=1, async_save=True))
    try:
        checkpointer.save(1, _tiny_state(1.0), {"position": 1})
        checkpointer.manager.wait_until_finished()  # orbax's own wait: the step is complete, nothing of ours ran
        _checksums_while_training(checkpointer, tmp_path / "ckpt" / "1")
        assert verify_checksums(tmp_path / "ckpt" / "1")
        # keep=1: save 3 rotates step 2 out in its finalize thread, with 2 already hashed (never both at once)
        checkpointer.save(2, _tiny_state(2.0), {"position": 2})
        checkpointer.save(3, _tiny_state(3.0), {"position": 3})
        _checksums_while_training(checkpointer, tmp_path / "ckpt" / "3")
        assert checkpointer.all_steps() == [3] and verify_checksums(tmp_path / "ckpt" / "3")
    finally:
        checkpointer.close()

    found = Checkpointer(tmp_path / "ckpt", CheckpointConfig(keep=3))
    (tmp_path / "ckpt" / "3" / CHECKSUMS_FILE).unlink()
    found.record_finished()
    found.close()
    assert not (tmp_path / "ckpt" / "3" / CHECKSUMS_FILE).exists()  # a step found on disk is never certified


def test_two_runs_sharing_a_checkpoint_directory_are_refused_like_two_sharing_a_workdir(tmp_path):
    """Separate workdirs, one checkpoint.directory (as a pod's workers have): the second run would resume from the
    first's steps in flight and rotate them out under it."""
    import os
    from types import SimpleNamespace

    from bertjax.train.workdir import LOCK_FILE, WorkdirBusy, exclusive

    shared = tmp_path / "shared"
    config = SimpleNamespace(checkpoint=CheckpointConfig(directory=str(shared)))

    @exclusive
    def run(config, workdir, inner=False):
        assert (shared / LOCK_FILE).is_file()
        if not inner:
            with pytest.raises(WorkdirBusy, match=f"checkpoint.directory {shared} is in use by process "
                                                  f"{os.getpid()} on host .* use another checkpoint.directory"):
                run(config, tmp_path / "second", inner=True)
        return "trained"

    assert run(config, tmp_path / "first") == "trained"
    assert not (shared / LOCK_FILE).exists() and not (tmp_path / "second").exists()
