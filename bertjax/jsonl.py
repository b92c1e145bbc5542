"""JSON Lines, one JSON object per line: fine-tuning data, predictions, and a run's metrics.jsonl; and the JSON
readers every file bertjax did not write goes through (`loads`, `read_json_file`), so malformed JSON is one clear
error naming the file, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


# Python's JSON parser recurses once per nesting level: a few hundred KB of "[" exceeds the recursion limit and
# raises RecursionError, which no reader's `except JSONDecodeError` catches.
def loads(text: str | bytes) -> Any:
    """`json.loads` for text from outside: nesting too deep to parse is a `json.JSONDecodeError` like any other
    malformed JSON (so the readers' handlers catch it)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", "", 0) from None


_JSON_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
                    bool: "true or false", type(None): "null"}


def json_type_name(value: Any) -> str:
    """What `value`, parsed from JSON, is in JSON's words (for errors about files people edit as JSON)."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def read_json_file(path: str | Path, expected: type = dict) -> Any:
    """The JSON value of the UTF-8 file `path`, whose top level must be an `expected` (dict: an object, list: an
    array); anything else is a ValueError naming the file. A missing file stays a FileNotFoundError, which callers
    word as they need."""
    path = Path(path)
    try:
        value = loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: invalid JSON ({error})") from None
    if not isinstance(value, expected):
        raise ValueError(f"{path}: expected {_JSON_TYPE_NAMES.get(expected, expected.__name__)} at the top "
                         f"level, got {json_type_name(value)}")
    return value


def json_objects(lines: Iterable[str], path: str | Path) -> list[dict[str, Any]]:
    """The objects of `lines` in order, blank lines skipped; a line that is not a JSON object is an error naming
    `path` and the line's number."""
    objects = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = loads(line)
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
