"""JSON Lines, one JSON object per line: fine-tuning data, predictions, and a run's metrics.jsonl."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def json_objects(lines: Iterable[str], path: str | Path) -> list[dict[str, Any]]:
    """The objects of `lines` in order, blank lines skipped; a line that is not a JSON object is an error naming
    `path` and the line's number."""
    objects = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{path}, line {number}: each line must be a JSON object, got {type(value).__name__}")
        objects.append(value)
    return objects


def write_json_objects(path: str | Path, objects: Iterable[dict[str, Any]], *, allow_nan: bool = True) -> Path:
    """Write `objects` to `path`, one per line, UTF-8 (text kept as it is, not escaped).

    `allow_nan=False` (files for other programs, such as `bertjax predict`'s): NaN and infinities are an error naming
    the line, since standard JSON has no such values and strict readers refuse the file. The default keeps them as
    Python's json writes them, as metrics.jsonl has them (a diverged loss is a record, not a reason to fail)."""
    path = Path(path)
    lines = []
    for number, value in enumerate(objects, start=1):
        try:
            lines.append(json.dumps(value, ensure_ascii=False, allow_nan=allow_nan) + "\n")
        except ValueError as error:
            raise ValueError(f"{path}, line {number}: {error} (a NaN or infinity in {str(value)[:200]})") from None
    path.write_text("".join(lines), encoding="utf-8")
    return path
