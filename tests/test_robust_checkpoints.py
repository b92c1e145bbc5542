"""Nothing lost, nothing certified that is broken: end-to-end runs of `bertjax pretrain` on the tiny config that
damage a checkpoint, diverge, rerun with another model, or share a workdir (issue 15)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jax
import pytest
import yaml

from bertjax.train.checkpoints import CheckpointError, restore_params
from bertjax.train.run_config import ConfigError, load_run_config
from train_helpers import TINY_RUN, REPO, cpu_env, logged_losses, pretrain_command, run_pretrain, small_tokenizer, \
    write_config

STEPS, EVERY = 16, 8
# A learning rate that makes the tiny model's step non-finite. 1e3 did while the norms' backward was autodiff's
# (NaN gradients at extreme parameter scales, finite loss); the written-out backward stays finite there.
DIVERGING_RATE = "1e12"


def _run(config, workdir, *args, timeout=180):
    return subprocess.run(pretrain_command(config, workdir, *args), env=cpu_env(), cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def _damage_in_place(step_dir) -> None:
    """Silent damage: the step still decodes, but a parameter reads back as NaN, as flipped bits in a float array do.
    Written through orbax, so that only the values change and not the format: damaging raw bytes instead finds a
    decodable offset only by search (orbax stores zstd blocks), which took up to a minute."""
    import numpy as np
    import orbax.checkpoint as ocp

    state_dir = step_dir / "state"
    checkpointer = ocp.StandardCheckpointer()
    state = checkpointer.restore(state_dir)
    path, leaf = next((path, leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(state["params"])
                      if np.issubdtype(np.asarray(leaf).dtype, np.floating))
    damaged = np.array(leaf)
    damaged.flat[damaged.size // 2] = np.nan
    state["params"] = jax.tree_util.tree_map_with_path(lambda p, x: damaged if p == path else x, state["params"])
    shutil.rmtree(state_dir)
    checkpointer.save(state_dir, state)
    checkpointer.wait_until_finished()


def _steps(workdir):
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 16-step run with checkpoints at 8 and 16."""
    root = tmp_path_factory.mktemp("robust")
    config = write_config(root / "run.yaml", small_tokenizer(), train={"steps": STEPS},
                          checkpoint={"every": EVERY, "keep": 3})
    workdir = root / "finished"
    run_pretrain(config, workdir)
    assert _steps(workdir) == [8, 16]
    return root, config, workdir


def test_damaged_checkpoint_without_checksums_is_refused_and_not_certified(finished):
    root, config, reference = finished
    workdir = root / "damaged"
    shutil.copytree(reference, workdir)
    step_dir = workdir / "checkpoints" / "16"
    (step_dir / "checksums.json").unlink()  # e.g. copied without it, or saved by an older version
    _damage_in_place(step_dir)

    failed = _run(config, workdir, f"train.steps={STEPS + EVERY}")
    assert failed.returncode == 2, failed.stderr
    assert "non-finite values" in failed.stderr and "checkpoint.restore_step=8" in failed.stderr, failed.stderr
    assert not (step_dir / "checksums.json").exists()  # the damaged step is not certified afterwards
    assert _steps(workdir) == [8, 16]
    with pytest.raises(CheckpointError, match="non-finite values"):
        restore_params(step_dir)  # fill-mask and convert read parameters this way


def test_a_damaged_data_position_is_refused_not_read_as_the_start_of_the_data(finished):
    """Without checksums (a bucket's checkpoints, or checkpoint.checksums=false) a data/process_0-of-1.json that
    decodes but names no phase of the step used to restart the data from its first batch, silently."""
    root, config, reference = finished
    workdir = root / "lost_position"
    shutil.copytree(reference, workdir)
    step_dir = workdir / "checkpoints" / "16"
    (step_dir / "checksums.json").unlink()
    for position in ({}, {"phase": 3, "iterator": {"window": 0, "row": 0, "batches": 16}}):
        (step_dir / "data" / "process_0-of-1.json").write_text(json.dumps(position))
        failed = _run(config, workdir, f"train.steps={STEPS + EVERY}")
        assert failed.returncode == 2, failed.stderr
        assert "the data position saved with step 16" in failed.stderr and "phase 0" in failed.stderr, failed.stderr
        assert _steps(workdir) == [8, 16]


def test_a_damaged_config_yaml_is_one_line_naming_it_in_every_command_that_reads_the_workdir(finished, capsys):
    """fill-mask, convert, embed and finetune --model find a workdir's checkpoints through its config.yaml: a file
    that is not YAML, or not a mapping, was a traceback there (pretrain already said this)."""
    from bertjax.cli import main

    root, _, reference = finished
    workdir = root / "damaged_config"
    shutil.copytree(reference, workdir)
    for text in ("train: [\n", "- a list\n", "checkpoint: every 8\n"):
        (workdir / "config.yaml").write_text(text)
        assert main(["fill-mask", "--model", str(workdir), "a [MASK] b"]) == 2
        err = capsys.readouterr().err
        assert f"{workdir / 'config.yaml'}" in err and "run config is damaged" in err, err
        assert len(err.strip().splitlines()) == 1, err


def _metrics(workdir):
    from bertjax.train.metrics import read_metrics
    return read_metrics(workdir)


def test_nonfinite_loss_stops_before_saving_and_keeps_the_finite_checkpoints(finished):
    root, config, _ = finished
    workdir = root / "diverged"
    # At this rate the first steps after warm-up overflow (step 3 here); saving every step with keep=2 shows that
    # the finite steps before it survive and nothing after it is written.
    failed = _run(config, workdir, f"optimizer.learning_rate={DIVERGING_RATE}", "train.steps=24",
                  "checkpoint.every=1", "checkpoint.keep=2")
    assert failed.returncode == 2, failed.stderr
    assert "non-finite" in failed.stderr and "stopped without saving" in failed.stderr, failed.stderr
    bad_step = int(failed.stderr.split("error: step ")[1].split(":")[0])
    kept = _steps(workdir)
    assert len(kept) == 2 and kept[-1] < bad_step  # nothing after the divergence, nothing finite rotated out
    for step in kept:
        restore_params(workdir / "checkpoints" / str(step))  # raises on non-finite values


def test_nonfinite_skip_mode_keeps_the_old_state_and_finishes(finished):
    root, config, _ = finished
    workdir = root / "skipped"
    done = _run(config, workdir, f"optimizer.learning_rate={DIVERGING_RATE}", "train.steps=24", "train.nonfinite=skip")
    assert done.returncode == 0, done.stderr
    skipped = [r["step"] for r in _metrics(workdir) if r.get("skipped")]
    assert skipped and "update skipped" in done.stderr
    restore_params(workdir / "checkpoints" / "24")  # finite despite the skipped updates


@pytest.mark.parametrize("override", ["optimizer.learning_rate=.nan", "optimizer.eps=.inf",
                                      "model.overrides.norm_eps=.nan"])
def test_nan_and_inf_in_numeric_config_fields_are_errors(override, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(TINY_RUN))
    with pytest.raises(ConfigError, match="must be a finite number"):
        load_run_config(path, [override])


def test_rerun_with_another_model_changes_nothing_and_names_the_field(finished, capsys):
    from bertjax.cli import main

    root, config, reference = finished
    workdir = root / "rerun"
    shutil.copytree(reference, workdir)
    before = {name: (workdir / name).read_bytes() for name in ("config.yaml", "model_config.json")}
    failed = _run(config, workdir, "model.overrides.hidden_size=64", "train.steps=24")
    assert failed.returncode == 2, failed.stderr
    assert "model.overrides.hidden_size: 32 in the workdir, 64 requested" in failed.stderr, failed.stderr
    assert {name: (workdir / name).read_bytes() for name in before} == before
    assert _steps(workdir) == [8, 16]
    # The workdir still serves `bertjax fill-mask` (in this process: the refused rerun above is the one that needs its
    # own interpreter, and another would only add seconds of imports).
    capsys.readouterr()
    assert main(["fill-mask", "--model", str(workdir), "def [MASK](x): return x"]) == 0
    shown = capsys.readouterr()
    assert "[MASK]" not in shown.out.splitlines()[-1], shown.err


def test_second_process_on_a_workdir_gets_a_clear_error_naming_the_holder(finished):
    import signal
    import time

    root, config, _ = finished
    workdir = root / "shared"
    first = subprocess.Popen(pretrain_command(config, workdir, "train.steps=100000"),
                             env=cpu_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (workdir / "bertjax.lock").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()
            time.sleep(0.05)
        second = _run(config, workdir)
        assert second.returncode == 2, second.stderr
        assert f"is in use by process {first.pid} on host" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
    finally:
        while first.poll() is None and not logged_losses(workdir):
            time.sleep(0.05)  # training (SIGTERM is handled from here on)
        first.send_signal(signal.SIGTERM)
        output, _ = first.communicate(timeout=120)
    assert first.returncode == 0, output
    assert not (workdir / "bertjax.lock").exists() and not (workdir / "tokenizer.tmp").exists()


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    import os
    import socket

    from bertjax.train.workdir import LOCK_FILE, WorkdirBusy, WorkdirLock

    dead = subprocess.Popen(["true"])
    dead.wait()
    lock_file = tmp_path / LOCK_FILE
    lock_file.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "since": "earlier"}))
    lock = WorkdirLock(tmp_path)
    lock.acquire()
    assert f"taking over the lock of process {dead.pid}" in caplog.text
    assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    with pytest.raises(WorkdirBusy, match=f"in use by process {os.getpid()}"):
        WorkdirLock(tmp_path).acquire()  # a live holder is never taken over
    lock.release()
    assert not lock_file.exists()
    lock_file.write_text(json.dumps({"host": "elsewhere", "pid": dead.pid, "since": "earlier"}))
    with pytest.raises(WorkdirBusy, match=f"on host elsewhere .*delete {lock_file}"):
        WorkdirLock(tmp_path).acquire()  # another host's process cannot be checked: the user decides


def test_failed_setup_leaves_no_half_made_workdir(finished):
    root, config, _ = finished
    workdir = root / "half-made"
    failed = _run(config, workdir, "data.seq_len=512")  # longer than the model's positions: fails in setup
    assert failed.returncode == 2 and "max_position_embeddings" in failed.stderr, failed.stderr
    assert not workdir.exists()


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(finished):
    import signal
    import time

    root, config, _ = finished
    workdir = root / "interrupted"
    run = subprocess.Popen(pretrain_command(config, workdir, "train.steps=100000"), env=cpu_env(), cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not logged_losses(workdir):
        assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 0, output
    assert "Traceback" not in output and "Ctrl-C: saved a checkpoint at step" in output, output
    stopped = int(output.split("Ctrl-C: saved a checkpoint at step ")[1].split()[0])
    # The interrupt lands at the step the loop was in: periodic checkpoints before it (every EVERY steps) are kept
    # too when the run outpaced the signal.
    steps = _steps(workdir)
    assert steps[-1] == stopped and all(step % EVERY == 0 for step in steps[:-1]), steps
    restore_params(workdir / "checkpoints" / str(stopped))


def test_second_ctrl_c_interrupts_at_once():
    import os
    import signal

    from bertjax.train.distributed import PreemptionWatch

    # Python's own handler, whatever this process inherited: a background shell job or a pytest-xdist worker
    # starts with SIGINT ignored, and the watch restores what it found.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        watch = PreemptionWatch()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            assert watch.should_stop(1) and watch.reason == "Ctrl-C"
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
            assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL  # until close(): a third one ends the process
        finally:
            watch.close()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_sighup_saves_a_checkpoint_and_exits_cleanly_even_with_its_output_gone(finished):
    """A run started from an SSH session gets SIGHUP when the session drops, and its output (a terminal, or a pipe
    into `tee`) is gone with it: it saves where it stopped, as for SIGTERM, instead of dying at once or on the
    next write to the dead pipe."""
    import signal
    import time

    root, config, _ = finished
    workdir = root / "hung-up"
    errors = root / "hung-up.stderr"
    with open(errors, "w") as stderr:
        run = subprocess.Popen(pretrain_command(config, workdir, "train.steps=100000"), env=cpu_env(), cwd=REPO,
                               stdout=subprocess.PIPE, stderr=stderr, text=True)
    deadline = time.monotonic() + 120
    while not logged_losses(workdir):
        assert run.poll() is None and time.monotonic() < deadline, errors.read_text()
        time.sleep(0.05)
    run.stdout.close()  # the reader of its stdout is gone (`| tee` killed by the same hangup)
    run.send_signal(signal.SIGHUP)
    assert run.wait(timeout=120) == 0, errors.read_text()
    assert "SIGHUP (the session that started this run ended): saving a checkpoint" in errors.read_text()
    assert "Traceback" not in errors.read_text()
    stopped = max(logged_losses(workdir))
    steps = _steps(workdir)
    assert steps[-1] == stopped and all(step % EVERY == 0 for step in steps[:-1]), steps
    restore_params(workdir / "checkpoints" / str(stopped))


def test_a_pipe_whose_reader_exits_stops_the_run_with_a_checkpoint(finished):
    """`bertjax pretrain ... 2>&1 | head -5`, or `| tee` killed alone: no hangup comes, and the progress bar's next
    refresh meets a pipe without reader. The run saves where it stopped and exits 0, as for a preemption, where
    before the BrokenPipeError ended it without saving the steps since the last checkpoint."""
    import time

    root, config, _ = finished
    workdir = root / "head"
    run = subprocess.Popen(pretrain_command(config, workdir, "train.steps=100000", "train.progress_bar=true"),
                           env=cpu_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    shown = b""
    while len(logged_losses(workdir)) < 3:  # in the loop, its bar drawn into the pipe (read, so it never fills)
        assert run.poll() is None and time.monotonic() < deadline, shown.decode(errors="replace")
        shown += run.stdout.read1(65536)
    assert b"pretrain:" in shown  # the progress bar did reach the pipe
    run.stdout.close()  # `head` has its lines
    assert run.wait(timeout=120) == 0
    stopped = max(logged_losses(workdir))
    assert stopped < 100000
    steps = _steps(workdir)
    assert steps[-1] == stopped and all(step % EVERY == 0 for step in steps[:-1]), steps
    restore_params(workdir / "checkpoints" / str(stopped))


def test_a_reader_gone_before_the_summary_leaves_a_finished_run_its_status(finished):
    """The run's stdout has no reader (`| head` that had its lines): the run trains to its end, saves, and its
    summary meets the dead pipe after the training loop. The command ends 0, not 141, as the run succeeded."""
    root, config, _ = finished
    workdir = root / "summary-unread"
    shutil.copytree(root / "finished", workdir)
    errors = root / "summary-unread.stderr"
    with open(errors, "w") as stderr:
        run = subprocess.Popen(pretrain_command(config, workdir, f"train.steps={STEPS + EVERY}"), env=cpu_env(),
                               cwd=REPO, stdout=subprocess.PIPE, stderr=stderr)
    while b"MFU is relative" not in run.stdout.readline():  # the last start-up line; the steps print nothing here
        assert run.poll() is None, errors.read_text()
    run.stdout.close()
    assert run.wait(timeout=180) == 0, errors.read_text()
    assert _steps(workdir)[-1] == STEPS + EVERY and "Traceback" not in errors.read_text()


def test_sighup_stops_like_sigterm_unless_the_process_was_started_with_it_ignored(monkeypatch):
    import os
    import signal

    from bertjax.train import distributed, session_outputs

    quieted = []  # stdout and stderr of the test process stay as they are
    monkeypatch.setattr(session_outputs, "quiet_session_outputs", lambda: quieted.append(True))
    inherited = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        watch = distributed.PreemptionWatch()
        try:
            assert not watch.should_stop(1)
            os.kill(os.getpid(), signal.SIGHUP)
            assert watch.should_stop(2) and watch.reason == "SIGHUP" and quieted
        finally:
            watch.close()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL

        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # started under nohup: asked to outlive its session
        watch = distributed.PreemptionWatch()
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            assert not watch.should_stop(1)
        finally:
            watch.close()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, inherited)


def test_run_without_held_out_documents_succeeds_and_skips_the_fill_mask_demo(finished):
    root, config, _ = finished
    workdir = root / "no-held-out"
    done = _run(config, workdir, "data.eval_fraction=0.0", "eval.fill_mask_examples=2", "train.steps=16")
    assert done.returncode == 0, done.stderr
    assert "skipped the fill-mask examples: no eval documents" in done.stderr, done.stderr
    assert _steps(workdir) == [8, 16]


def test_checkpoint_of_another_model_is_named_as_such_not_as_damage(finished):
    root, config, reference = finished
    checkpoints = root / "foreign-checkpoints"
    shutil.copytree(reference / "checkpoints", checkpoints)
    failed = _run(config, root / "foreign", f"checkpoint.directory={checkpoints}", "model.overrides.hidden_size=64",
                  "train.steps=24")
    assert failed.returncode == 2, failed.stderr
    assert "is of another model (params/" in failed.stderr and "stored (32,), this run's model (64,)" in failed.stderr
    assert "delete" not in failed.stderr.split("error:")[-1] and "restore_step" not in failed.stderr
    assert sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) == [8, 16]


def test_unreadable_checkpoint_without_checksums_is_one_line_on_resume_and_fill_mask(finished):
    """The data files of a step saved without checksums are gone: the error names what TensorStore could not read and
    the step to go back to, and nothing follows it (orbax's abandoned reads used to print "RuntimeError: Event loop
    is closed" tracebacks after it, at exit)."""
    root, config, reference = finished
    workdir = root / "unreadable"
    shutil.copytree(reference, workdir)
    step_dir = workdir / "checkpoints" / "16"
    (step_dir / "checksums.json").unlink()
    data_files = list(step_dir.glob("state/ocdbt.process_*/d/*"))
    assert data_files
    for path in data_files:
        path.unlink()
    failed = _run(config, workdir, f"train.steps={STEPS + EVERY}")
    fill_mask = subprocess.run([sys.executable, "-m", "bertjax", "fill-mask", "--model", str(workdir), "a [MASK] b"],
                               env=cpu_env(), cwd=REPO, capture_output=True, text=True, timeout=180)
    for result, step_hint in ((failed, "checkpoint.restore_step=8"), (fill_mask, "--step 8")):
        assert result.returncode == 2, result.stderr
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith(f"bertjax {result.args[3]}: error: ") and "checkpoints/16" in error, result.stderr
        assert "Error reading" in error and step_hint in error and "tensorstore_spec" not in error, error
        assert "Traceback" not in result.stderr and "Event loop is closed" not in result.stderr, result.stderr
    assert _steps(workdir) == [8, 16]


@pytest.mark.parametrize("override, key", [("optimizer.name=adamw", "optimizer.name"),
                                           ("optimizer.clip_global_norm=1.0", "optimizer.clip_global_norm")])
def test_optimizer_change_that_reshapes_its_state_is_refused_on_resume_naming_the_key(override, key, tmp_path):
    from bertjax.train.workdir import CONFIG_FILE, check_rerun
    from bertjax.train.run_config import to_dict

    config = write_config(tmp_path / "run.yaml", tmp_path / "tokenizer")
    held = load_run_config(config)  # stable_adamw without clipping
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump(to_dict(held)))
    with pytest.raises(ConfigError, match=f"another optimizer state \\({key}: "):
        check_rerun(tmp_path, load_run_config(config, [override]))
    # Changes that keep the state's structure stay allowed: the rate, the decay, a clipping threshold.
    check_rerun(tmp_path, load_run_config(config, ["optimizer.learning_rate=1e-4", "optimizer.weight_decay=0"]))


def test_embedder_clipping_turned_off_on_resume_is_refused_naming_the_key(tmp_path):
    from bertjax.embeddings.train_config import load_embedder_config, save_embedder_config
    from bertjax.embeddings.training import check_rerun
    from bertjax.train.workdir import CONFIG_FILE

    save_embedder_config(load_embedder_config(None), tmp_path / CONFIG_FILE)
    with pytest.raises(ConfigError, match=r"another optimizer state \(train.max_grad_norm: 1.0 in the workdir, None"):
        check_rerun(tmp_path, load_embedder_config(None, ["train.max_grad_norm=null"]), {}, resumable=True,
                    drops_out=False)


def test_checkpoint_of_another_optimizer_state_is_named_as_such_not_as_damage(tmp_path):
    import numpy as np

    from bertjax.train.checkpoints import Checkpointer
    from bertjax.train.run_config import CheckpointConfig

    params = {"dense": np.ones((2, 2), np.float32)}
    checkpointer = Checkpointer(tmp_path / "checkpoints", CheckpointConfig(async_save=False))
    checkpointer.save(4, {"params": params, "opt_state": {"count": np.zeros((), np.int32)}}, {"position": 0})
    checkpointer.wait()
    clipped = {"params": params, "opt_state": [{}, {"count": np.zeros((), np.int32)}]}  # as optax.chain nests it
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), clipped)
    with pytest.raises(CheckpointError, match="holds another optimizer state than this run builds") as error:
        checkpointer.restore(4, abstract)
    assert "delete" not in str(error.value) and "restore_step" not in str(error.value)
    assert (tmp_path / "checkpoints" / "4").is_dir()
    checkpointer.close()


def _small_corpus(path, lines: int = 40):
    from bertjax.data import default_corpus_documents

    documents = [" ".join(document.split())[:300] for document in default_corpus_documents("train")[:lines]]
    path.write_text("\n".join(documents) + "\n")
    return path


def test_setup_failure_after_the_state_is_made_leaves_no_workdir_and_names_the_key(tmp_path, capsys):
    from bertjax.cli import main

    config = write_config(tmp_path / "run.yaml", small_tokenizer(), eval={"at_start": True})
    workdir = tmp_path / "no-held-out"
    assert main(["pretrain", "--config", str(config), "--workdir", str(workdir), "data.eval_fraction=0"]) == 2
    assert "raise data.eval_fraction" in capsys.readouterr().err
    assert not workdir.exists()  # so the corrected command starts afresh instead of being refused


def test_data_running_out_saves_the_steps_trained_and_is_a_one_line_error(tmp_path):
    corpus = _small_corpus(tmp_path / "small.txt")
    config = write_config(tmp_path / "run.yaml", small_tokenizer(), data={"input": str(corpus), "num_epochs": 1},
                          train={"steps": 500, "log_every": 100}, checkpoint={"every": 400})
    workdir = tmp_path / "ran-out"
    failed = _run(config, workdir)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    error = failed.stderr.strip().splitlines()[-1]
    assert "ran out at step" in error and "data.num_epochs" in error and "train.steps" in error, error
    stopped = int(error.split("ran out at step ")[1].split()[0])
    assert 0 < stopped < 500 and f"saved a checkpoint at step {stopped}" in error
    assert _steps(workdir) == [stopped]


def test_the_data_position_saved_when_the_data_runs_out_keeps_the_partial_batch(tmp_path):
    """The checkpoint saved when a finite epoch runs out is where a rerun with more epochs continues: its rows of
    the last, partial batch must still be ahead of it, or that rerun skips them and differs from the run that had
    those epochs from the start (one process too, not only the multi-host case)."""
    import numpy as np

    from bertjax.data import load_tokenizer
    from bertjax.train import feed as feed_lib
    from bertjax.train.mesh import build_mesh

    corpus = _small_corpus(tmp_path / "small.txt")
    tokenizer = load_tokenizer(small_tokenizer())

    def feed(epochs: int):
        config = load_run_config(write_config(tmp_path / f"run{epochs}.yaml", small_tokenizer(),
                                              data={"input": str(corpus), "num_epochs": epochs},
                                              train={"steps": 500}))  # more than the data has
        return feed_lib.TrainFeed(feed_lib.plan_phases(config), tokenizer, build_mesh(config.mesh),
                                  config.train.seed)

    one = feed(1)
    one.start(0, None)
    step = 0
    with pytest.raises(feed_lib.DataExhausted):
        while True:
            one.next(step)
            step += 1
    saved = one.state()
    two = feed(2)
    two.start(0, None)
    for earlier in range(step):
        two.next(earlier)
    expected = two.next(step)
    resumed = feed(2)
    resumed.start(step, saved)
    got = resumed.next(step)
    for fed in (one, two, resumed):
        fed.close()
    for key in expected:  # (the old position, past the partial batch's rows, gave another batch here)
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(expected[key]), err_msg=key)


# ---------------------------------------------------------------------------------------------------------------
# Model directories (transformers and bertjax `params/`) get the checks of workdir checkpoints: NaN/inf, damaged
# files, parameters of another model, each a one-line error naming the directory.

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A transformers directory of a tiny random MLM and the bertjax model directory converted from it."""
    from bertjax.cli import main
    from finetune_helpers import tiny_model_dir

    root = tmp_path_factory.mktemp("model_dirs")
    hf_dir = tiny_model_dir(root / "hf")
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(root / "converted")]) == 0
    return hf_dir, root / "converted"


def test_nonfinite_weights_of_a_transformers_directory_are_refused_by_every_command(model_dirs, tmp_path, capsys):
    import numpy as np

    from bertjax.cli import main
    from bertjax.hf.weights import SAFETENSORS, read_weights, write_safetensors
    from bertjax.model_dirs import load_model_dir

    source = tmp_path / "nan"
    shutil.copytree(model_dirs[0], source)
    tensors = read_weights(str(source))
    name = next(n for n in tensors if "layer.1.intermediate.dense.weight" in n)
    tensors[name] = tensors[name].copy()
    tensors[name][3, 5] = np.inf
    write_safetensors(str(source / SAFETENSORS), tensors)
    expected = r"transformers directory .*nan holds non-finite values \(NaN or infinity\) in 1 array\(s\) " \
               r"\(encoder/layers_1/mlp/"
    with pytest.raises(CheckpointError, match=expected):
        load_model_dir(source)  # fill-mask, embed, predict, convert --to-hf, init-from read models here
    assert main(["fill-mask", "--model", str(source), "a [MASK] day"]) == 2
    assert main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("holds non-finite values") == 2 and "encoder/layers_1/mlp/" in err, err
    assert not (tmp_path / "out").exists()


def test_nonfinite_parameters_of_a_bertjax_model_directory_are_refused(model_dirs, tmp_path):
    import jax
    import numpy as np

    from bertjax.model_dirs import load_model_dir, save_model_dir

    model, params, tokenizer = load_model_dir(model_dirs[1])
    flat = jax.tree_util.tree_leaves_with_path(params)
    path = next(p for p, _ in flat if "layers_0" in jax.tree_util.keystr(p))
    params = jax.tree_util.tree_map_with_path(lambda p, x: np.full(x.shape, np.nan, x.dtype) if p == path else x,
                                              params)
    save_model_dir(tmp_path / "nan", model, params, tokenizer)
    with pytest.raises(CheckpointError, match=r"model directory .*nan holds non-finite values .* \(encoder/layers_0/"):
        load_model_dir(tmp_path / "nan")


def test_damaged_bertjax_model_directory_is_a_one_line_error_naming_it(model_dirs, tmp_path, capfd, caplog,
                                                                      monkeypatch):
    import gc
    import sys
    import time

    from bertjax.cli import main
    from bertjax.model_dirs import load_model_dir
    from bertjax.train.checkpoints import ModelMismatch

    def damaged(name):
        copy = tmp_path / name
        shutil.copytree(model_dirs[1], copy)
        return copy

    deleted = damaged("deleted")
    data_files = sorted((deleted / "params").glob("ocdbt.process_*/d/*"), key=lambda p: p.stat().st_size)
    data_files[-1].unlink()  # the largest: the embedding table is in it
    # The directory's checksums name the missing file first; without them (a directory written before they were
    # recorded) orbax's read fails, which must be one line too.
    with pytest.raises(CheckpointError, match=rf"model directory .*deleted: params/.*{data_files[-1].name} is "
                                              "missing; write the directory again"):
        load_model_dir(deleted)
    (deleted / "params" / "checksums.json").unlink()
    # The reads orbax abandons when one fails call back into its closed event loop ("RuntimeError: Event loop is
    # closed" through sys.unraisablehook, "exception was never retrieved" from asyncio): none of it gets through.
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    for _ in range(4):  # the callbacks race the error: several tries
        with pytest.raises(CheckpointError, match=r"model directory .*deleted: params/ cannot be read \(ValueError: "):
            load_model_dir(deleted)
    assert main(["fill-mask", "--model", str(deleted), "a [MASK] day"]) == 2
    gc.collect()
    time.sleep(0.5)
    gc.collect()
    assert not unraisable, [str(u.exc_value) for u in unraisable]
    assert "never retrieved" not in caplog.text, caplog.text
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "cannot be read" in err and "TensorStore details" not in err, err

    other_shape = damaged("other_shape")
    described = json.loads((other_shape / "model_config.json").read_text())
    described["config"]["num_layers"] += 1
    (other_shape / "model_config.json").write_text(json.dumps(described))
    with pytest.raises(ModelMismatch, match=r"model directory .*other_shape: params/ holds another model than its "
                                            r"model_config.json describes \(num_layers 3, but it stores layers 0..1\)"):
        load_model_dir(other_shape)

    other_head = damaged("other_head")
    described = json.loads((other_head / "model_config.json").read_text())
    described["head"] = "sequence_classification"
    (other_head / "model_config.json").write_text(json.dumps(described))
    assert main(["fill-mask", "--model", str(other_head), "a [MASK] day"]) == 2
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"model directory {other_head}: params/ holds another model" in err and "classifier/" in err, err


def test_a_model_config_written_before_a_new_config_field_still_matches(tmp_path):
    """A workdir of an older bertjax lacks the EncoderConfig fields added since (mlp_up_bias, ...): they take their
    defaults, which keep the old math, so the run resumes. A preset that changed since (mosaicbert's bias-free GLU
    input) is another model, and the error names the override that resumes it."""
    import json

    import pytest

    from bertjax.config import get_config
    from bertjax.train.run_config import ConfigError
    from bertjax.train.workdir import check_model_config

    def older(config):  # as a bertjax without these fields wrote it
        return {"head": "masked_lm", "config": {k: v for k, v in config.to_dict().items()
                                                if k not in ("mlp_up_bias", "attention_fused_qkv")}}

    (tmp_path / "model_config.json").write_text(json.dumps(older(get_config("bert-tiny"))))
    check_model_config(tmp_path, {"head": "masked_lm", "config": get_config("bert-tiny").to_dict()})
    mosaic = get_config("mosaicbert-tiny")
    (tmp_path / "model_config.json").write_text(json.dumps(older(mosaic.replace(mlp_up_bias=None))))
    with pytest.raises(ConfigError, match=r"holds another model .*mlp_up_bias.*resume it with the workdir's model "
                                          r"\(model.overrides.mlp_up_bias=true\)"):
        check_model_config(tmp_path, {"head": "masked_lm", "config": mosaic.to_dict()})
    check_model_config(tmp_path, {"head": "masked_lm", "config": mosaic.replace(mlp_up_bias=True).to_dict()})


@pytest.mark.parametrize("preset", ["modernbert-tiny", "roberta-tiny", "bert-tiny"])
def test_a_model_config_written_before_families_is_its_family(tmp_path, preset):
    """Before EncoderConfig.family (2026-11-23) model_config.json named no family and none of the family's head
    fields, whose defaults are BERT's; bertjax had three families, told apart by their positions. Such a workdir
    resumes as its own model (a ModernBERT was "another model"), and a command reading it builds that family."""
    import json

    from bertjax.config import get_config
    from bertjax.model_dirs import read_model
    from bertjax.train.workdir import check_model_config

    config = get_config(preset)
    older = {k: v for k, v in config.to_dict().items()
             if k not in ("family", "classifier_activation", "classifier_norm", "classifier_token_transform",
                          "mlp_up_bias", "attention_fused_qkv")}
    (tmp_path / "model_config.json").write_text(json.dumps({"head": "masked_lm", "config": older}))
    check_model_config(tmp_path, {"head": "masked_lm", "config": config.to_dict()})
    assert read_model(tmp_path).config == config


def test_an_override_the_workdir_did_not_give_resumes_when_the_model_is_the_same(tmp_path):
    """check_model_config's hint (`model.overrides.X=...` spelling out what the held model is) is accepted by the
    config.yaml check before it; a changed override, or one giving another model, is still refused."""
    import yaml

    from bertjax.config import get_config
    from bertjax.train.run_config import ConfigError, run_config_from_dict, to_dict
    from bertjax.train.workdir import check_model_config, check_rerun

    raw = {"model": {"preset": "bert-tiny", "overrides": {"hidden_size": 32}}, "train": {"steps": 4}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_dict(run_config_from_dict(raw)), sort_keys=False))
    spelled = json.loads(json.dumps(raw))
    spelled["model"]["overrides"]["mlp_up_bias"] = False  # bert-tiny's own value
    assert check_rerun(tmp_path, run_config_from_dict(spelled), resumable=True)[0][0] == "model.overrides.mlp_up_bias"
    changed = json.loads(json.dumps(raw))
    changed["model"]["overrides"]["hidden_size"] = 64
    with pytest.raises(ConfigError, match=r"holds a run with another model \(model.overrides.hidden_size: 32"):
        check_rerun(tmp_path, run_config_from_dict(changed), resumable=True)
    (tmp_path / "model_config.json").write_text(json.dumps({"head": "masked_lm",
                                                            "config": get_config("bert-tiny").to_dict()}))
    with pytest.raises(ConfigError, match=r"holds another model \(config.norm_eps: 1e-12 in the workdir, 1e-06"):
        check_model_config(tmp_path, {"head": "masked_lm", "config": get_config("bert-tiny", norm_eps=1e-6).to_dict()})
