"""The sha256 of a file's bytes: what a record keeps of a file it may meet again at the same path (a workdir's data
files, an embedded corpus's texts) to tell whether it is still the same file."""

from __future__ import annotations

import hashlib
import os


def sha256_of(path: str | os.PathLike) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
