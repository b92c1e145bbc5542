"""A run's stdout and stderr when the session reading them goes away.

A run started as `bertjax pretrain ... 2>&1 | tee train.log`, or `| head`, writes into a pipe; when its reader exits
(`head` has its lines, `tee` is killed) the next write fails with EPIPE, and a terminal that hung up answers EIO.
Python turns either into an exception at whichever progress-bar refresh or log line comes next, in the middle of a
step's bookkeeping, so the steps since the last checkpoint would be lost. While a `PreemptionWatch` is open such a
write is caught here instead: the dead output goes to /dev/null and the run is asked to stop, saving a checkpoint,
as for a hangup. Regular files (`> train.log`) and streams without a file descriptor are left as they are: they
cannot go away under the run. (A notebook kernel's streams may report the kernel's own descriptor and be wrapped;
they write to the front end, so the guard only passes their writes on.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import sys
from typing import Callable

# What a write answers once the session is gone: a pipe without a reader, a terminal after its hangup.
LOST_OUTPUT_ERRNOS = frozenset({errno.EPIPE, errno.EIO})


def output_closed(fd: int) -> bool:
    """Whether nothing reads this file descriptor any more: poll reports an error (a pipe whose reader exited) or a
    hangup (a closed socket or terminal) without writing anything."""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # a closed descriptor; no poll() on this platform
        return False


def _to_devnull(stream, fd: int) -> None:
    try:
        stream.flush()  # what it still holds cannot reach the dead reader; dropping it here keeps exit quiet
    except (OSError, ValueError, RuntimeError, AttributeError):  # dead, closed, busy or replaced streams
        pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:
        pass


def quiet_session_outputs() -> None:
    """After a hangup, writes to the session that ended fail: a terminal answers EIO, and a pipe (`| tee`) whose
    reader got the hangup too answers EPIPE. Such an error in the next log line would end the run before it saves,
    so stdout and stderr go to /dev/null from here on unless they are files (a log redirect keeps its lines)."""
    for stream, fd in ((sys.__stdout__, 1), (sys.__stderr__, 2)):
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                continue
        except OSError:
            continue
        _to_devnull(stream, fd)


def quiet_closed_outputs() -> None:
    """Send stdout and stderr to /dev/null where their readers are gone; a live terminal or file keeps its lines."""
    for stream, fd in ((sys.__stdout__, 1), (sys.__stderr__, 2)):
        if output_closed(fd):
            _to_devnull(stream, fd)


def _session_fd(stream) -> int | None:
    """The file descriptor behind a stream when it is one that can go away under the run: a pipe, a socket or a
    terminal. None for regular files and for streams that are not file descriptors (notebooks, captures)."""
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both OSError and ValueError
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode) else None


class GuardedOutput:
    """Stands in for sys.stdout or sys.stderr: a write or flush that finds the reader gone sends the stream's file
    descriptor to /dev/null, calls `on_lost` and is dropped; every other error, and every other attribute, is the
    stream's own."""

    def __init__(self, stream, fd: int, on_lost: Callable[[], None]):
        self.stream = stream
        self.fd = fd
        self._on_lost = on_lost

    def _lost(self, error: OSError) -> None:
        if error.errno not in LOST_OUTPUT_ERRNOS:
            raise error
        _to_devnull(self.stream, self.fd)
        self._on_lost()

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as error:
            self._lost(error)
            return len(text)

    def writelines(self, lines) -> None:  # through `write`, or the stream's own would bypass the guard
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as error:
            self._lost(error)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def guard_outputs(on_lost: Callable[[], None]) -> Callable[[], None]:
    """Put a `GuardedOutput` in place of sys.stdout and sys.stderr where they are pipes, sockets or terminals;
    returns the function that puts the streams back (leaving any that someone else has replaced since)."""
    guarded: dict[str, GuardedOutput] = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        fd = _session_fd(stream)
        if fd is not None:
            guarded[name] = GuardedOutput(stream, fd, on_lost)
            setattr(sys, name, guarded[name])

    def restore() -> None:
        for name, guard in guarded.items():
            if getattr(sys, name) is guard:
                setattr(sys, name, guard.stream)

    return restore


@contextlib.contextmanager
def final_report():
    """Around the lines a training command prints once its run is saved and closed (its summary): a reader gone by
    then (`| head` that has had its lines) loses them, and the command still ends with its run's status, not 141."""
    restore = guard_outputs(lambda: None)
    try:
        yield
        for stream in (sys.stdout, sys.stderr):  # buffered lines meet the dead pipe here, not at exit
            stream.flush()
    finally:
        restore()


class CurrentStderr:
    """sys.stderr as it is at each write, for a progress bar made before a `PreemptionWatch` guards the outputs
    (tqdm keeps the stream it was given; given this, its refreshes go through the guard while the watch is open)."""

    def write(self, text: str) -> int:  # looked up per call: tqdm binds `write` and `flush` when it is made
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def __getattr__(self, name: str):
        return getattr(sys.stderr, name)
