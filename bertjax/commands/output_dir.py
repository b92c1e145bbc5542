"""Checks on a command's `--out` directory, made before anything is read or written."""

from __future__ import annotations

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
