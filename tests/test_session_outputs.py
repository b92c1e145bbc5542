"""A run's stdout and stderr when their reader goes away (bertjax.train.session_outputs), in-process: real pipes whose
read end is closed, as `| head` leaves them. The commands' own behaviour is tested where they run
(test_robust_checkpoints.py for pretraining, test_inference.py for a printing command)."""

from __future__ import annotations

import errno
import os
import stat
import sys

import pytest

from bertjax.train import session_outputs
from bertjax.train.distributed import PreemptionWatch


@pytest.fixture
def dead_pipe():
    """A text stream writing into a pipe whose reader has exited. (Tests put it in sys.stdout themselves: pytest's
    output capture resets sys.stdout between a fixture and its test.)"""
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    os.close(read_end)
    yield stream
    stream.close()


def test_poll_tells_a_pipe_without_reader_from_a_live_one_and_from_a_file(tmp_path):
    read_end, write_end = os.pipe()
    try:
        assert not session_outputs.output_closed(write_end)
        os.close(read_end)
        assert session_outputs.output_closed(write_end)
    finally:
        os.close(write_end)
    with open(tmp_path / "log.txt", "w") as log:
        assert not session_outputs.output_closed(log.fileno())
    assert not session_outputs.output_closed(10_000)  # not an open descriptor: nothing to say


def test_a_dead_stdout_stops_the_run_at_the_next_step_instead_of_raising(dead_pipe, monkeypatch):
    monkeypatch.setattr(sys, "stdout", dead_pipe)
    watch = PreemptionWatch()
    try:
        assert isinstance(sys.stdout, session_outputs.GuardedOutput)
        assert not watch.should_stop(1)
        print("step 1: loss 5.2", flush=True)  # without the guard: BrokenPipeError here
        print("step 2: loss 5.1", flush=True)  # the output now goes to /dev/null
        assert watch.should_stop(2) and watch.reason == PreemptionWatch.OUTPUT_LOST
        assert stat.S_ISCHR(os.fstat(dead_pipe.fileno()).st_mode)  # /dev/null in place of the pipe
    finally:
        watch.close()
    assert sys.stdout is dead_pipe


def test_writelines_goes_through_the_guard(dead_pipe, monkeypatch):
    monkeypatch.setattr(sys, "stdout", dead_pipe)
    watch = PreemptionWatch()
    try:
        sys.stdout.writelines(["x" * 100_000 + "\n"])  # past the stream's buffer: written through at once
        assert watch.should_stop(1) and watch.reason == PreemptionWatch.OUTPUT_LOST
    finally:
        watch.close()


def test_files_and_live_pipes_are_not_guarded_and_other_errors_are_raised(tmp_path, monkeypatch):
    with open(tmp_path / "log.txt", "w") as log:
        monkeypatch.setattr(sys, "stdout", log)
        restore = session_outputs.guard_outputs(lambda: pytest.fail("a file's reader cannot go away"))
        try:
            assert sys.stdout is log  # a file redirect keeps its stream, and its lines
        finally:
            restore()

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        flush = write

    lost = []
    guard = session_outputs.GuardedOutput(FullDisk(), fd=-1, on_lost=lambda: lost.append(True))
    with pytest.raises(OSError, match="No space left"):
        guard.write("x")
    assert not lost


def test_the_guard_stays_out_of_streams_replaced_while_the_watch_was_open(dead_pipe, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "stdout", dead_pipe)
    watch = PreemptionWatch()
    assert isinstance(sys.stdout, session_outputs.GuardedOutput)
    with open(tmp_path / "captured.txt", "w") as captured:
        sys.stdout = captured  # e.g. contextlib.redirect_stdout inside the run
        watch.close()
        assert sys.stdout is captured  # the watch does not put back what someone else replaced


def test_a_progress_bar_made_before_the_watch_writes_through_its_guard(monkeypatch):
    from tqdm import tqdm

    read_end, write_end = os.pipe()
    pipe = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stderr", pipe)
    bar = tqdm(total=10, file=session_outputs.CurrentStderr(), mininterval=0, miniters=1)
    watch = PreemptionWatch()
    try:
        os.close(read_end)  # `2>&1 | head -3`: head has its lines
        for step in range(1, 4):
            bar.update(1)
            if watch.should_stop(step):
                break
        assert watch.reason == PreemptionWatch.OUTPUT_LOST and step == 1
    finally:
        watch.close()
        bar.close()
        pipe.close()


def test_final_report_drops_lines_into_a_dead_pipe_and_puts_the_stream_back(dead_pipe, monkeypatch):
    monkeypatch.setattr(sys, "stdout", dead_pipe)
    with session_outputs.final_report():
        print("workdir runs/x: steps 0 -> 16 in 7 s")  # buffered: the dead pipe answers at the closing flush
    assert sys.stdout is dead_pipe and stat.S_ISCHR(os.fstat(dead_pipe.fileno()).st_mode)  # now /dev/null


def test_an_interrupt_before_the_run_starts_ends_it_even_when_python_dropped_the_exception():
    """SIGTERM while a run set up took the default action (killed, its half-made workdir and tokenizer left for the
    next run); a Ctrl-C whose KeyboardInterrupt landed in a garbage-collection callback was dropped and the run
    trained to its end. Now both raise KeyboardInterrupt, and a noted one ends the run when its watch opens."""
    import signal
    import time

    from bertjax.train import distributed

    before = signal.getsignal(signal.SIGTERM)
    restore = distributed.catch_setup_interrupts()
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM before the run started"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2)  # the handler runs at once; this only bounds the wait if it did not
        # As if that KeyboardInterrupt had been dropped: the watch refuses to start the run.
        with pytest.raises(KeyboardInterrupt, match="SIGTERM before the run started"):
            PreemptionWatch()
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) is before and not distributed._SETUP_INTERRUPTS  # a later run: clean
    PreemptionWatch().close()
