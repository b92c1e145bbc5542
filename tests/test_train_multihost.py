"""Two-process pretraining on localhost (CPU, gloo collectives): both processes compute the same losses, and the
checkpoint they wrote together restores in a single process."""

import json
import socket
import subprocess

import jax
import numpy as np
import pytest

from bertjax.train.checkpoints import restore_params
from train_helpers import REPO, cpu_env, logged_losses, pretrain_command, small_tokenizer, write_config

STEPS = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_two_processes(config, workdir, second_config=None) -> list[subprocess.Popen]:
    """The two processes of one run on localhost, each printing into a pipe (stdout and stderr together); process
    1 reads `second_config` when given."""
    coordinator = f"127.0.0.1:{_free_port()}"
    configs = [config, second_config or config]
    return [subprocess.Popen(pretrain_command(configs[i], workdir, "--coordinator", coordinator, "--num-processes",
                                              "2", "--process-id", str(i)),
                             env=cpu_env(devices=1), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for i in range(2)]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost")
    tokenizer = small_tokenizer()
    config = write_config(root / "run.yaml", tokenizer, train={"steps": STEPS}, checkpoint={"every": 6})
    workdir = root / "run"
    processes = _start_two_processes(config, workdir)
    outputs = []
    for process in processes:
        output, _ = process.communicate(timeout=300)
        outputs.append(output)
    for i, process in enumerate(processes):
        assert process.returncode == 0, f"process {i}:\n{outputs[i]}"
    return workdir, outputs


def test_both_processes_log_the_same_losses(two_process_run):
    workdir, outputs = two_process_run
    process0 = logged_losses(workdir)
    process1 = {}
    for line in outputs[1].splitlines():
        if line.startswith("[process 1] "):
            record = json.loads(line.removeprefix("[process 1] "))
            process1[record["step"]] = record["loss"]
    assert sorted(process0) == list(range(1, STEPS + 1))
    assert process1 == process0
    assert process0[STEPS] < process0[1]


def test_processes_started_with_other_settings_are_refused(tmp_path):
    """One host with a stale config (another learning rate): both trained on, exit 0, the replicated parameters
    drifting apart while every host printed the same averaged loss. Now every process stops before training,
    naming the section that differs."""
    tokenizer = small_tokenizer()
    config = write_config(tmp_path / "run.yaml", tokenizer, train={"steps": 2})
    stale = write_config(tmp_path / "stale.yaml", tokenizer, train={"steps": 2}, optimizer={"learning_rate": 3e-2})
    processes = _start_two_processes(config, tmp_path / "run", stale)
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    for i, process in enumerate(processes):
        assert process.returncode == 2, f"process {i}:\n{outputs[i]}"
        assert "started with different settings than process 0: optimizer (process 1)" in outputs[i], outputs[i]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_per_host_workdirs_export_from_process_0_and_refuse_unshared_checkpoints(tmp_path):
    """tpu_pod.sh's layout: --workdir on each host's own disk. ELECTRA's end-of-run exports (orbax, every process
    into "one" directory) and fine-tuning's default <workdir>/checkpoints hung forever there. A distillation teacher
    from a bertjax model directory was refused on several hosts (a cross-host transfer)."""
    import re
    import sys

    from bertjax.config import get_config
    from bertjax.data import load_tokenizer
    from bertjax.model_dirs import save_model_dir
    from bertjax.models import MODEL_CLASSES, init_params

    coordinator = f"127.0.0.1:{_free_port()}"
    tokenizer = small_tokenizer()
    teacher = MODEL_CLASSES["masked_lm"](get_config("bert-tiny", vocab_size=512, hidden_size=32, num_layers=1,
                                                    num_heads=2, intermediate_size=48))
    teacher_params = init_params(teacher, jax.random.key(1))
    save_model_dir(tmp_path / "teacher", teacher, teacher_params, load_tokenizer(tokenizer))
    processes = [subprocess.Popen([sys.executable, "tests/per_host_workdir_script.py", coordinator, str(i),
                                   str(tmp_path), str(tokenizer)], env=cpu_env(devices=1), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    for i, output in enumerate(outputs):
        assert processes[i].returncode == 0 and "EXPORTED" in output, f"process {i}:\n{output}"
        assert "REFUSED checkpoint directory" in output and "process(es) 1 do not see" in output, output
        expected_sum = sum(float(np.asarray(leaf, np.float32).sum()) for leaf in jax.tree.leaves(teacher_params))
        laid_out = re.search(r"TEACHER (\S+)", output)
        assert laid_out and float(laid_out.group(1)) == pytest.approx(expected_sum, rel=1e-5), output
    from bertjax.model_dirs import load_model_dir

    model = MODEL_CLASSES["masked_lm"](get_config("bert-tiny", vocab_size=512, hidden_size=32, num_layers=1,
                                                  num_heads=2, intermediate_size=48))
    expected = jax.tree.map(np.asarray, init_params(model, jax.random.key(0)))
    for name in ("generator", "discriminator"):
        _, loaded, exported_tokenizer = load_model_dir(tmp_path / "host0" / "models" / name)
        assert exported_tokenizer is not None
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, loaded), expected)


def test_differing_settings_names_each_key_and_process():
    from bertjax.train.distributed import differing_settings, settings_digests

    runs = [{"data": {"input": "a"}, "optimizer": {"lr": 1}}, {"data": {"input": "a"}, "optimizer": {"lr": 2}},
            {"data": {"input": "b"}, "optimizer": {"lr": 2}}]
    gathered = np.stack([settings_digests(run) for run in runs])
    assert differing_settings(["data", "optimizer"], gathered) == {"data": [2], "optimizer": [1, 2]}
    assert differing_settings(["data", "optimizer"], gathered[:1]) == {}
    # A host given checkpoint.restore_step alone (a one-shot key, recorded null) resumed from another step than the
    # others, which waited on it forever; a progress bar is each host's own.
    from bertjax.train.distributed import run_settings
    from bertjax.train.run_config import run_config_from_dict
    from train_helpers import TINY_RUN

    base = run_settings(run_config_from_dict(TINY_RUN))
    rewound = run_settings(run_config_from_dict({**TINY_RUN, "checkpoint": {"restore_step": 6}}))
    quiet = run_settings(run_config_from_dict({**TINY_RUN, "train": {**TINY_RUN["train"], "progress_bar": False}}))
    keys = sorted(base)
    assert differing_settings(keys, np.stack([settings_digests(base), settings_digests(rewound)])) == \
        {"checkpoint": [1]}
    assert differing_settings(keys, np.stack([settings_digests(base), settings_digests(quiet)])) == {}


def test_the_two_process_checkpoint_restores_in_one_process(two_process_run):
    workdir, _ = two_process_run
    data_files = sorted(p.name for p in (workdir / "checkpoints" / str(STEPS) / "data").glob("process_*"))
    assert data_files == ["process_0-of-2.json", "process_1-of-2.json"]  # each host's own data position
    params = restore_params(workdir / "checkpoints" / str(STEPS))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))

    from bertjax.inference.fill_mask import load_predictor
    predictions = load_predictor(workdir)("The [MASK] statement ends a loop.", 3)
    assert len(predictions) == 1 and len(predictions[0]) == 3
    assert 0.0 < sum(p.probability for p in predictions[0]) <= 1.0 + 1e-6


def test_sighup_to_one_host_stops_both_at_the_same_saved_step(tmp_path):
    """A hangup on one host (its SSH session dropped) is a preemption notice for the slice: that host passes it
    to JAX's coordination service as a SIGTERM, and both processes save the same step and exit cleanly."""
    import signal
    import time

    config = write_config(tmp_path / "run.yaml", small_tokenizer(), train={"steps": 100000},
                          checkpoint={"every": 1000})
    workdir = tmp_path / "run"
    coordinator = f"127.0.0.1:{_free_port()}"
    logs = [tmp_path / f"process{i}.log" for i in range(2)]
    processes = []
    for i in range(2):
        with open(logs[i], "w") as log:
            processes.append(subprocess.Popen(
                pretrain_command(config, workdir, "--coordinator", coordinator, "--num-processes", "2",
                                 "--process-id", str(i)),
                env=cpu_env(devices=1), cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 240
        # Both in the training loop (process 1 logs its own steps), so both hold their signal handlers.
        while len(logged_losses(workdir)) < 3 or logs[1].read_text().count('[process 1] {"step"') < 3:
            assert all(p.poll() is None for p in processes) and time.monotonic() < deadline, logs[0].read_text()
            time.sleep(0.05)
        processes[1].send_signal(signal.SIGHUP)
        for i, process in enumerate(processes):
            try:
                code = process.wait(timeout=120)
            except subprocess.TimeoutExpired:  # say what each process was doing, not only that it went on
                pytest.fail("no stop within 120 s of the SIGHUP:\n" + "\n".join(
                    f"process {j}, the end of its log:\n{logs[j].read_text()[-3000:]}" for j in range(2)))
            assert code == 0, f"process {i}:\n{logs[i].read_text()}"
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    stopped = max(logged_losses(workdir))
    assert stopped < 1000
    saved = workdir / "checkpoints" / str(stopped)
    assert sorted(p.name for p in (saved / "data").glob("process_*")) == ["process_0-of-2.json",
                                                                           "process_1-of-2.json"]
    assert f"saved a checkpoint at step {stopped} and stopped" in logs[0].read_text()
    assert "SIGHUP (the session that started this run ended)" in logs[1].read_text()
    assert "Traceback" not in logs[0].read_text() + logs[1].read_text()


def test_a_finite_epoch_ends_on_every_host_at_the_same_step(tmp_path):
    """data.num_epochs set: each host packs its share of the documents into its own number of rows, so one runs
    out first. Every host stops at that step with the same one-line error and their joint checkpoint, instead of
    one host saving alone while the others wait in the next step's collectives."""
    from bertjax.data import build_pretraining_iterator, default_corpus_documents, load_tokenizer
    from bertjax.train.run_config import load_run_config

    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(" ".join(doc.split()) for doc in default_corpus_documents("train")[:24]) + "\n")
    config = write_config(tmp_path / "run.yaml", small_tokenizer(), train={"steps": 100000},
                          data={"input": str(corpus), "num_epochs": 1}, checkpoint={"every": 1000})
    data = load_run_config(config).data
    tokenizer = load_tokenizer(small_tokenizer())
    batches = [len(list(build_pretraining_iterator(data, tokenizer, seed=0, process_index=i, process_count=2)))
               for i in range(2)]
    assert batches[0] != batches[1], batches  # the hosts' data ends at different steps: what is tested
    workdir = tmp_path / "run"
    processes = _start_two_processes(config, workdir)
    try:
        outputs = [process.communicate(timeout=240)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    stop = min(batches)
    for i, (process, output) in enumerate(zip(processes, outputs)):
        assert process.returncode == 2, f"process {i}:\n{output}"
        assert f"the training data ran out at step {stop} of 100000" in output, f"process {i}:\n{output}"
    saved = workdir / "checkpoints" / str(stop) / "data"
    assert sorted(p.name for p in saved.glob("process_*")) == ["process_0-of-2.json", "process_1-of-2.json"]


def test_a_mesh_whose_batch_axes_do_not_reach_every_process_is_refused(tmp_path):
    """Tensor parallelism over all four devices of two hosts leaves the batch unsplit across processes; each
    process passes its own rows, so the "replicated" batch would differ per host and so would every parameter
    after the first update (the processes logged different losses). Refused before training, naming the mesh."""
    config = write_config(tmp_path / "run.yaml", small_tokenizer(), mesh={"data": 1, "fsdp": 1, "tensor": 4})
    coordinator = f"127.0.0.1:{_free_port()}"
    processes = [subprocess.Popen(pretrain_command(config, tmp_path / "run", "--coordinator", coordinator,
                                                   "--num-processes", "2", "--process-id", str(i)),
                                  env=cpu_env(devices=2), cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [process.communicate(timeout=240)[0] for process in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode != 0, output
        assert "mesh: the batch axes (data*fsdp = 1) do not split the rows over the 2 processes" in output, output
    assert not list((tmp_path / "run").glob("checkpoints/*"))
