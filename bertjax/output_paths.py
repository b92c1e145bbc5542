"""Checks on a command's `--out` directory or `--output` file, made before anything is read or written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_output_dir(out: str | Path, *, reading: list[str | Path], overwrite: bool) -> None:
    """Refuse an `--out` that is one of the directories being read, or that already holds files (unless
    `overwrite`): writing there would replace what it holds, silently."""
    target = Path(out).resolve()
    for source in reading:
        if Path(source).resolve() == target:
            raise ValueError(f"--out {out} is the directory being read; give another directory")
    if target.is_file():
        raise ValueError(f"--out {out} is a file, not a directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ValueError(f"--out {out} is not empty; pass --overwrite to write into it (files of the same names "
                         "are replaced), or give an empty or new directory")


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether `a` and `b` name one file: the same path spelled otherwise, a symbolic link to it, or a hard link of
    it (the same inode, which no comparison of paths sees)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): one file only if both resolve to one path
        return os.path.realpath(a) == os.path.realpath(b)


def check_output_file(output: str | Path, input_path: str | Path | None, *, writes: str | Path | None = None,
                      what: str = "the output") -> None:
    """Refuse, before any work, an `--output` whose file (`writes`; default `output` itself) could not be written, or
    would destroy the --input: an existing directory, a path below a file, or the input file under any name (the
    same path, a symbolic link, a hard link), or a directory it cannot create files in. Found only when the results are
    written, the first three would throw the work away and the last would replace the input with them (`predict` and
    `embed` share this check)."""
    written = Path(output if writes is None else writes)
    if written.is_dir():
        raise ValueError(f"--output {output}: {written} is a directory; give the name of a file to write")
    parent = next((p for p in written.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"--output {output}: {parent} is a file, not a directory, so {written} cannot be written")
    if parent is not None:
        try:  # permissions, a read-only mount: found now, not once the work is done
            with tempfile.TemporaryFile(dir=parent):
                pass
        except OSError as error:
            raise ValueError(f"--output {output}: cannot write in {parent} ({error.strerror or error})") from None
    if input_path is None or not same_file(written, input_path):
        return
    alias = "" if os.path.abspath(written) == os.path.abspath(input_path) else \
        f" {input_path} under another name (a link to it, or its path spelled otherwise)"
    if writes is None:
        raise ValueError(f"--output {output} is the --input file{alias}: writing {what} would destroy it; choose "
                         "another --output name")
    raise ValueError(f"--output {output} would write {what} to {written}, which is the --input file{alias}; choose "
                     "another --output name")
