"""Multi-host start-up and preemption.

One program runs per host. `initialize` connects them with `jax.distributed.initialize`, from explicit
`--coordinator HOST:PORT --num-processes N --process-id I` or, when those are absent, from a cluster environment
that JAX knows how to read (a Cloud TPU VM slice, SLURM); otherwise the run is single-process.

`PreemptionWatch` turns SIGTERM (how TPU VMs and most schedulers announce preemption), SIGHUP (the hangup a
run started from an SSH session gets when that session drops), and an output whose reader went away (see
`session_outputs`), into a step at which every process saves a checkpoint and stops.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import signal
import sys
import threading
from typing import Any, Callable

import jax
import numpy as np

from bertjax.train import session_outputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("multi-host (default: detected from the TPU pod / SLURM environment)")
    group.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0's coordination service")
    group.add_argument("--num-processes", type=int, metavar="N", help="number of processes (hosts)")
    group.add_argument("--process-id", type=int, metavar="I", help="this process's index in [0, N)")


def _on_tpu_vm() -> bool:
    """A Cloud TPU VM exposes its chips as /dev/accel* (v2-v4) or /dev/vfio/* (v5+); JAX then reads the slice
    (worker count, this worker's id, the coordinator) from the VM metadata."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _in_slurm_job() -> bool:
    return int(os.environ.get("SLURM_NTASKS", "1")) > 1


# Cluster environments where `jax.distributed.initialize()` finds every setting by itself. Add a line to add one.
CLUSTER_ENVIRONMENTS: dict[str, Callable[[], bool]] = {
    "cloud-tpu-vm": _on_tpu_vm,
    "slurm": _in_slurm_job,
}


def detect_cluster() -> str | None:
    for name, present in CLUSTER_ENVIRONMENTS.items():
        if present():
            return name
    return None


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> str:
    """Connect this process to the others, if any; returns how ("explicit", a cluster name, or "single")."""
    explicit = (coordinator, num_processes, process_id)
    if any(v is not None for v in explicit):
        if any(v is None for v in explicit):
            raise ValueError("--coordinator, --num-processes and --process-id must be given together")
        if num_processes <= 0 or not 0 <= process_id < num_processes:
            raise ValueError(f"--process-id must be in [0, --num-processes={num_processes}), got {process_id}")
        if ":" not in coordinator:
            raise ValueError(f"--coordinator must be HOST:PORT, got {coordinator!r}")
        # CPU processes exchange collectives through gloo; accelerator backends ignore this setting.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)
        return "explicit"
    cluster = detect_cluster()
    if cluster is None:
        return "single"
    jax.distributed.initialize()
    return cluster


def settings_digests(settings: dict[str, Any]) -> np.ndarray:
    """uint8 [len(settings), 32]: the sha256 of each setting's JSON, in sorted key order."""
    return np.stack([np.frombuffer(hashlib.sha256(json.dumps(settings[key], sort_keys=True, default=str)
                                                  .encode()).digest(), np.uint8) for key in sorted(settings)])


def differing_settings(keys: list[str], gathered: np.ndarray) -> dict[str, list[int]]:
    """key -> the processes whose digest of it is not process 0's (`gathered`: [processes, keys, 32])."""
    found = {}
    for index, key in enumerate(keys):
        others = [p for p in range(1, len(gathered)) if (gathered[p, index] != gathered[0, index]).any()]
        if others:
            found[key] = others
    return found


# Settings a host may hold its own value of: how its terminal shows the run, nothing the processes share.
PER_HOST_SETTINGS = (("train", "progress_bar"),)


def run_settings(config: Any, **extra: Any) -> dict[str, Any]:
    """A run config's sections as `check_same_everywhere` compares them: every setting, the one-shot ones included
    (checkpoint.restore_step: hosts resuming from different steps would wait on each other forever), but those in
    PER_HOST_SETTINGS; plus `extra` entries (data files' fingerprints)."""
    from bertjax.train.run_config import to_dict

    settings = to_dict(config)
    for section, key in PER_HOST_SETTINGS:
        if isinstance(settings.get(section), dict):
            settings[section].pop(key, None)
    return {**settings, **extra}


def check_same_everywhere(settings: dict[str, Any], advice: str) -> None:
    """Refuse a run whose processes were started with other settings than process 0 (a stale config file on one
    host, another data path): each host would train its share of the batch on its own terms, the replicated
    parameters drifting apart while every host prints the same averaged loss, or a collective of another shape
    would abort the run. `settings`: the same keys on every process, JSON-able values."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    keys = sorted(settings)
    gathered = np.asarray(multihost_utils.process_allgather(settings_digests(settings).astype(np.int32)))
    found = differing_settings(keys, gathered)
    if found:
        listed = "; ".join(f"{key} (process{'es' * (len(p) > 1)} {', '.join(map(str, p))})"
                           for key, p in found.items())
        raise ValueError(f"the processes of this run were started with different settings than process 0: {listed}. "
                         f"{advice}")


# A Ctrl-C or SIGTERM that arrives before a run's PreemptionWatch is open (while it loads data, builds the model or
# compiles) ends the command: `catch_setup_interrupts` (bertjax's command line) has it raise KeyboardInterrupt, so a
# half-made workdir is removed (the default SIGTERM action skipped that and left its tokenizer for the next run), and
# notes it here first. Python drops a KeyboardInterrupt raised inside a garbage-collection callback (it prints
# "Exception ignored"); the note makes the watch, once opened, end the run then instead of training it through.
_SETUP_INTERRUPTS: list[str] = []


def _interrupt_setup(signum, frame) -> None:
    name = PreemptionWatch.SIGNAL_NAMES.get(signum, f"signal {signum}")
    _SETUP_INTERRUPTS.append(name)
    raise KeyboardInterrupt(f"{name} before the run started")


def catch_setup_interrupts() -> Callable[[], None]:
    """Make SIGINT and SIGTERM raise KeyboardInterrupt until a PreemptionWatch takes them (main thread only;
    JAX's multi-host preemption notifier takes SIGTERM over when it starts). Returns what puts the earlier handlers
    back (a command run inside a Python process, as the tests run them, leaves that process's handlers alone)."""
    _SETUP_INTERRUPTS.clear()
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {signum: signal.signal(signum, _interrupt_setup) for signum in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:  # and forget any note: a later run in this process (a notebook's) starts clean
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _SETUP_INTERRUPTS.clear()
    return restore


class PreemptionWatch:
    """`should_stop(step)` becomes True, on every process at the same step, after a SIGTERM, a SIGHUP (or a Ctrl-C).

    Multi-process: JAX's coordination service already listens for SIGTERM and agrees on a common step
    (`reached_preemption_sync_point`), so all hosts save the same step. Single process: a Python handler sets a
    flag that the loop reads between steps (never interrupting a step or a save). Ctrl-C (SIGINT) is handled the
    same way on a single process; a second Ctrl-C raises KeyboardInterrupt at once. (Multi-process runs keep
    Python's Ctrl-C: one host's keyboard cannot make the others agree on a step.)

    SIGHUP, which a process started from a terminal or an SSH session gets when that session ends, would end the
    run at once without a checkpoint; it is taken as a SIGTERM instead: on a single process it sets the same flag,
    and on several the handler sends this process a SIGTERM, which JAX's preemption notifier passes to the
    coordination service, so every host still saves the same step. A process started with SIGHUP ignored
    (`nohup`) keeps ignoring it: it was asked to outlive its session.

    While the watch is open, stdout and stderr (when they are pipes or terminals) are guarded: a write that finds
    the reader gone (`| head` exited, `| tee` killed) sends that output to /dev/null and stops the run in the same
    way, where before the write's error ended it between two checkpoints.
    """

    OUTPUT_LOST = "output closed"  # the reason a run stopped when its stdout or stderr lost its reader

    SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}
    SIGHUP = getattr(signal, "SIGHUP", None)  # POSIX only
    if SIGHUP is not None:
        SIGNAL_NAMES[SIGHUP] = "SIGHUP"

    def __init__(self):
        if _SETUP_INTERRUPTS:  # one whose KeyboardInterrupt was lost (see _SETUP_INTERRUPTS)
            raise KeyboardInterrupt(f"{_SETUP_INTERRUPTS[0]} before the run started")
        self.received = False
        self.reason = "SIGTERM"  # what asked the run to stop (for the message)
        self._previous: dict[int, object] = {}
        self._multi_process = jax.process_count() > 1
        self._restore_outputs: Callable[[], None] | None = None
        self._session_ended = False
        if threading.current_thread() is threading.main_thread():
            handled = [] if self._multi_process else [signal.SIGTERM, signal.SIGINT]
            if self.SIGHUP is not None and signal.getsignal(self.SIGHUP) is not signal.SIG_IGN:
                handled.append(self.SIGHUP)
            for signum in handled:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            self._restore_outputs = session_outputs.guard_outputs(self._on_output_lost)

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.received:
            # Until `close` restores Python's handler, one more Ctrl-C ends the process even inside a C call.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            raise KeyboardInterrupt("second Ctrl-C: stopped without saving")
        if signum == self.SIGHUP:
            self._stop_as_preempted("SIGHUP")  # first, so a dead stderr met by the message below is not the reason
            try:
                print("\nSIGHUP (the session that started this run ended): saving a checkpoint after this step, "
                      "then stopping", file=sys.stderr, flush=True)
            except (OSError, RuntimeError):  # the terminal is gone, or the handler interrupted a write to it
                pass
            session_outputs.quiet_session_outputs()
            return
        self.reason = self.SIGNAL_NAMES.get(signum, f"signal {signum}")
        self.received = True
        if signum == signal.SIGINT:
            print("\nCtrl-C: saving a checkpoint after this step, then stopping (Ctrl-C again to stop at once)",
                  file=sys.stderr, flush=True)

    def _on_output_lost(self) -> None:  # the guard has sent that output to /dev/null; the other one is left as it is
        self._stop_as_preempted(self.OUTPUT_LOST)

    def _stop_as_preempted(self, reason: str) -> None:
        """The session is gone: stop at the next step as for a SIGTERM, once."""
        if self._session_ended:
            return
        self._session_ended = True
        self.reason = reason
        if self._multi_process:
            # JAX's preemption notifier passes the SIGTERM on: `should_stop` reads the step all hosts agree on.
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            self.received = True

    def should_stop(self, step: int) -> bool:
        if self._multi_process:
            from jax.experimental import multihost_utils
            self.received = multihost_utils.reached_preemption_sync_point(step)
        return self.received

    def close(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if self._restore_outputs is not None:
            self._restore_outputs()
            self._restore_outputs = None

