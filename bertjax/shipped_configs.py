"""The run configs shipped with bertjax: the repository's configs/ (linked into the package as bertjax/configs, so
a wheel carries them). A command given a config path that does not exist here reads the shipped one of that name:
the README's `--config configs/pretrain/tiny.yaml` works from any directory of an installed bertjax, as do
`pretrain/tiny.yaml` and, for the command's own kind, `tiny`."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent / "configs"
KINDS = ("pretrain", "finetune", "embedder")  # the run types, one directory each


def names(kind: str | None = None) -> list[str]:
    """The shipped configs as `kind/name` (without .yaml), of one kind or all."""
    kinds = KINDS if kind is None else (kind,)
    return [f"{k}/{path.stem}" for k in kinds for path in sorted((ROOT / k).glob("*.yaml"))]


def resolve(path: str | Path, kind: str | None = None) -> Path:
    """`path` itself when it exists (or is absolute); else the shipped config it names, if one does; else `path`
    (for the caller's not-found error, which `describe` completes)."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts[:1] == ("configs",) else path.parts
    candidates = [PurePosixPath(*parts)] if parts else []
    if kind is not None and len(parts) == 1:  # a bare name: the command's own kind
        candidates.insert(0, PurePosixPath(kind, *parts))
    for candidate in candidates:
        for name in (candidate, candidate.with_name(candidate.name + ".yaml")):
            if ".." not in name.parts and (ROOT / name).is_file():
                return ROOT / name
    return path


def describe(kind: str | None = None) -> str:
    """For a not-found error: the names a command of `kind` accepts besides a file's path."""
    return f"the configs shipped with bertjax: {', '.join(name.split('/', 1)[1] for name in names(kind))}" \
        if kind is not None else f"the configs shipped with bertjax: {', '.join(names())}"
