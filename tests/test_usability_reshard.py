"""Resuming the data on another number of processes (issue 14, point 6): the new processes skip no document,
re-read exactly the ones the report counts, and a 2-process run's checkpoint continues in 1 and in 3 processes."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess

import numpy as np
import pytest

from bertjax.data.reshard import reshard
from bertjax.data.windows import WindowPlan
from train_helpers import REPO, cpu_env, pretrain_command, small_tokenizer, write_config

DOCUMENTS, WINDOW = 1000, 16


def _plan(index, count, origin=(0, 0)):
    return WindowPlan(DOCUMENTS, WINDOW, index, count, shuffle=True, seed=3, start_epoch=origin[0],
                      start_position=origin[1])


def _read(plan, first_window, last_window):
    """{(epoch, position)} of the windows [first_window, last_window] of a plan."""
    out = set()
    for window in range(first_window, last_window + 1):
        epoch, positions = plan.positions(window)
        out.update((epoch, int(g)) for g in positions)
    return out


@pytest.mark.parametrize("positions, new_count", [
    ([(20, 3), (19, 0)], 3),  # two processes mid-epoch (32 windows per epoch each)
    ([(33, 5), (31, 2)], 1),  # process 0 already in epoch 1, process 1 finishing epoch 0
    ([(5, 0), (6, 1), (4, 7)], 2),  # three processes down to two
])
def test_no_document_skipped_and_repeats_counted(positions, new_count):
    old_count = len(positions)
    saved = [{"iterator": {"window": w, "row": r, "batches": 7}, "origin": [0, 0]} for w, r in positions]
    report = reshard(saved, _plan, new_count)
    origin = (report.epoch, report.position)
    # what the old processes read, at least in part (a window read in part counts as read)
    read_before = set().union(*(_read(_plan(p, old_count), 0, w if r else w - 1) for p, (w, r) in enumerate(positions)))
    # what the new processes read from the origin to the end of the next epoch
    new_plans = [_plan(q, new_count, origin) for q in range(new_count)]
    read_after = [_read(plan, 0, plan.total_windows(origin[0] + 2) - 1) for plan in new_plans]
    assert sum(len(r) for r in read_after) == len(set().union(*read_after))  # the new shares are disjoint
    read_after = set().union(*read_after)
    everything = {(e, g) for e in range(origin[0] + 2) for g in range(DOCUMENTS)}
    assert everything <= read_before | read_after  # nothing skipped
    assert report.documents_repeated == len(read_before & read_after)  # the repeats are the ones reported
    assert report.documents_repeated < 3 * old_count * WINDOW  # only around the processes' frontiers


def test_same_origin_means_the_plan_of_a_fresh_run():
    fresh, resumed = _plan(1, 3), _plan(1, 3, (0, 0))
    assert [fresh.document_indices(w).tolist() for w in range(70)] == \
        [resumed.document_indices(w).tolist() for w in range(70)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(config, workdir, processes: int, *overrides: str) -> list[str]:
    coordinator = f"127.0.0.1:{_free_port()}"
    extra = lambda i: ["--coordinator", coordinator, "--num-processes", str(processes), "--process-id", str(i)] \
        if processes > 1 else []
    running = [subprocess.Popen(pretrain_command(config, workdir, *extra(i), *overrides), env=cpu_env(devices=1),
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for i in range(processes)]
    outputs = [p.communicate(timeout=400)[0] for p in running]
    for i, p in enumerate(running):
        assert p.returncode == 0, f"process {i} of {processes}:\n{outputs[i]}"
    return outputs


@pytest.fixture(scope="module")
def two_process_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard")
    # 12 rows: divisible by 1, 2 and 3 processes
    config = write_config(root / "run.yaml", small_tokenizer(), data={"global_batch_size": 12},
                          schedule={"unit": "fraction", "warmup": 0.25, "decay": 0.5},
                          train={"steps": 2}, checkpoint={"every": 2, "async_save": False})
    _run(config, root / "run", 2)
    return config, root / "run"


@pytest.mark.parametrize("processes", [1, 3])
def test_two_process_checkpoint_continues(two_process_checkpoint, tmp_path, processes):
    config, saved = two_process_checkpoint
    workdir = tmp_path / "run"
    shutil.copytree(saved, workdir)
    outputs = _run(config, workdir, processes, "train.steps=3")
    assert "data position saved by 2 processes, resumed on " + str(processes) in "".join(outputs)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    reshard_record = next(r for r in records if "data_reshard_from_processes" in r)
    assert reshard_record["step"] == 2 and reshard_record["data_reshard_from_processes"] == 2
    assert reshard_record["data_reshard_documents_repeated"] >= 0
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert sorted(losses) == [1, 2, 3] and np.isfinite(losses[3])
    data_files = sorted(p.name for p in (workdir / "checkpoints" / "3" / "data").glob("process_*"))
    assert data_files == [f"process_{i}-of-{processes}.json" for i in range(processes)]
