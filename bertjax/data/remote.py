"""Data on buckets: inputs and prepared directories at `gs://...` (or any etils.epath URI), as checkpoints are.

The readers underneath need local files: text and JSONL sources memory-map theirs, and ArrayRecord's reader (a
C++ file reader) opens local paths only. So a remote input is copied once into a local cache and read from there:

- `localize(spec)`: a remote file, directory (its data files) or glob -> local paths, copied into the cache
  (`$BERTJAX_CACHE_DIR`, default `~/.cache/bertjax/remote`) unless a complete copy of the same size is there;
- `staged_output(out)`: a directory to write into; for a remote `out` it is a local staging directory, uploaded
  file by file when the block succeeds (`metadata.json` last, so a half-uploaded prepared directory is never taken
  for a complete one).

Each host copies what it opens (a pod's hosts each read a share of every file); for corpora larger than a host's
disk, mount the bucket (gcsfuse) and give the mount's local path instead.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

from etils import epath

CACHE_ENV = "BERTJAX_CACHE_DIR"
_LAST = "metadata.json"  # uploaded last: its presence marks a complete prepared directory


def is_remote(path: str | os.PathLike) -> bool:
    return "://" in os.fspath(path)


# The fsspec package a bucket scheme needs, and the install that brings it (etils reads buckets through fsspec
# unless TensorFlow is installed, whose gfile it prefers).
_FILESYSTEM_INSTALL = {"gs": ("gcsfs", "pip install 'bertjax[gcs]'"), "s3": ("s3fs", "pip install 'etils[epath-s3]'")}


def require_filesystem(uri: str | os.PathLike, name: str | None = None) -> None:
    """Refuse a bucket path whose filesystem package is missing, in one line naming `name` (the config field or
    option) and the install: etils raises that ImportError only at the path's first use, as a long traceback (for a
    checkpoint directory, after the model is built). Local paths pass."""
    if not is_remote(uri) or importlib.util.find_spec("tensorflow") is not None:
        return
    import fsspec

    scheme = os.fspath(uri).split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError) as error:  # ValueError: a scheme fsspec does not know
        package, install = _FILESYSTEM_INSTALL.get(scheme, (None, None))
        what = f"{name} {os.fspath(uri)}" if name else os.fspath(uri)
        if package is None:
            raise ValueError(f"{what}: no filesystem for {scheme}:// paths ({error})") from None
        raise ValueError(f"{what}: {scheme}:// paths need the {package} package: {install}") from None


@contextlib.contextmanager
def reading(uri: str | os.PathLike) -> Iterator[None]:
    """Errors a filesystem package raises in classes of its own while `uri` is read (huggingface_hub's httpx
    ConnectError for an hf:// path without network) as an OSError naming the path, which the command line reports
    in one line like any other unreadable path, not as a traceback."""
    try:
        yield
    except (OSError, ValueError, KeyboardInterrupt):
        raise
    except Exception as error:  # noqa: BLE001 (any package's own error class)
        raise OSError(f"{os.fspath(uri)}: cannot be read ({type(error).__name__}: {error})") from None


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "bertjax" / "remote")


def _copy(source, destination) -> None:
    with source.open("rb") as reader, destination.open("wb") as writer:
        shutil.copyfileobj(reader, writer, length=1 << 24)


def _refuse_dot_segments(name: str, uri: str | os.PathLike) -> None:
    """Object stores allow `..` inside object names, and fsspec lists them as path segments: copied as they are,
    such an object (written by whoever else can write the bucket) would land outside the cache, over the user's own
    files (six of them reach ~ from the default cache)."""
    if any(segment in (".", "..") for segment in name.split("/")):
        raise ValueError(f"{os.fspath(uri)}: a bucket object named with a '.' or '..' segment ({name!r}) would be "
                         f"copied outside bertjax's cache ({cache_dir()}); refused")


def cached_path(uri: str | epath.Path) -> pathlib.Path:
    """Where the cache keeps a copy of `uri`: the URI's own layout (gs://b/x/y -> <cache>/gs/b/x/y), so copies
    sort as their originals do (the sources order files by path)."""
    scheme, rest = os.fspath(uri).split("://", 1)
    _refuse_dot_segments(rest.strip("/"), uri)
    return cache_dir() / scheme / rest.strip("/")


def local_file(uri: str | epath.Path) -> pathlib.Path:
    """The local cached copy of one remote file (copied now if absent or of another size)."""
    require_filesystem(uri)
    remote = epath.Path(uri)
    local = cached_path(remote)
    size = remote.stat().length
    if local.is_file() and local.stat().st_size == size:
        return local
    local.parent.mkdir(parents=True, exist_ok=True)
    partial = local.with_name(f".{local.name}.{os.getpid()}.partial")
    _copy(remote, partial)
    partial.replace(local)  # atomic: a reader never sees a half-copied file
    return local


def files_under(directory: epath.Path) -> list[tuple[str, epath.Path]]:
    """(path relative to `directory`, remote path) of every file below it, sorted. (Bucket paths walk, not rglob:
    epath refuses recursive globs on buckets.)"""
    base = os.fspath(directory).split("://", 1)[-1].strip("/")
    found = []
    for root, _, names in directory.walk():
        # fsspec walks without the scheme ("bucket/dir"); compare without it
        relative_dir = os.fspath(root).split("://", 1)[-1].strip("/")[len(base):].strip("/")
        for name in names:
            relative = f"{relative_dir}/{name}" if relative_dir else name
            found.append((relative, directory / relative))
    return sorted(found, key=lambda item: item[0])


def local_directory(uri: str | epath.Path) -> pathlib.Path:
    """A local copy of a remote directory tree (a prepared directory: metadata, tokenizer, ArrayRecord files)."""
    require_filesystem(uri)
    remote = epath.Path(uri)
    root = cached_path(remote)
    # metadata.json last: a local copy holding it is complete, as for the remote directory.
    listed = sorted(files_under(remote), key=lambda item: (item[0] == _LAST, item[0]))
    for relative, _ in listed:  # all checked before anything is copied
        _refuse_dot_segments(relative, uri)
    for relative, path in listed:
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if not (target.is_file() and target.stat().st_size == path.stat().length):
            partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
            _copy(path, partial)
            partial.replace(target)
    return root


def expand(spec: str, suffixes: tuple[str, ...]) -> list[epath.Path]:
    """The remote files of one input spec: a file, a directory (its files with a data suffix) or a glob."""
    require_filesystem(spec)
    with reading(spec):
        return _expand(spec, suffixes)


def _expand(spec: str, suffixes: tuple[str, ...]) -> list[epath.Path]:
    path = epath.Path(spec)
    if any(char in spec.split("://", 1)[1] for char in "*?["):
        scheme, rest = spec.split("://", 1)
        parts = rest.split("/")
        fixed = next(i for i, part in enumerate(parts) if any(c in part for c in "*?["))
        base = epath.Path(f"{scheme}://{'/'.join(parts[:fixed])}")
        pattern = "/".join(parts[fixed:])
        matches = [path for relative, path in files_under(base) if fnmatch.fnmatch(relative, pattern)]
        if not matches:
            raise FileNotFoundError(f"no file matches {spec!r}")
        return matches
    if path.is_dir():
        matches = [p for _, p in files_under(path) if p.suffix.lower() in suffixes]
        if not matches:
            raise FileNotFoundError(f"directory {spec!r} holds no file of a known type ({', '.join(suffixes)})")
        return matches
    if not path.exists():
        raise FileNotFoundError(f"input {spec!r} does not exist")
    return [path]


@contextlib.contextmanager
def staged_output(out: str | os.PathLike) -> Iterator[pathlib.Path]:
    """A local directory standing for `out`: `out` itself when local, else uploaded when the block succeeds."""
    if not is_remote(out):
        yield pathlib.Path(out)
        return
    require_filesystem(out, "--out")
    remote = epath.Path(out)
    with tempfile.TemporaryDirectory(prefix="bertjax-upload-") as staging:
        yield pathlib.Path(staging)
        files = [p for p in pathlib.Path(staging).rglob("*") if p.is_file()]
        for path in sorted(files, key=lambda p: (p.name == _LAST, str(p))):
            target = remote / path.relative_to(staging).as_posix()
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy(path, target)
