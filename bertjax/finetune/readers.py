"""Read a fine-tuning data file into rows (one dict per example), whatever its format.

CSV (header line), TSV (header line), JSONL (one object per line) and Parquet, chosen by the file's suffix in
`READERS`. Each problem with the file is an error that names it and says what to do: an empty file, bytes that
are not UTF-8, a malformed line, a missing column. Columns are looked up by `require_columns` with the name of the
config key that renames them, so the message can say which override to set.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bertjax.jsonl import json_objects

Row = dict[str, Any]


def _text(path: Path) -> str:
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"{path}: the file is empty")
    try:
        return data.decode("utf-8-sig")  # a byte-order mark written by spreadsheet programs is not data
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (byte {error.start} is {data[error.start]:#04x}); "
                         "save the file as UTF-8") from None


def _delimited(path: Path, delimiter: str) -> list[Row]:
    # QUOTE_MINIMAL reading: quoted fields may hold the delimiter and newlines; TSV files usually quote nothing.
    reader = csv.DictReader(io.StringIO(_text(path), newline=""), delimiter=delimiter)
    if not reader.fieldnames:
        raise ValueError(f"{path}: no header line (the first line must name the columns)")
    rows = []
    for row in reader:
        if None in row:  # more fields than the header names
            raise ValueError(f"{path}, line {reader.line_num}: {len(row) - 1 + len(row[None])} fields but the "
                             f"header names {len(reader.fieldnames)}")
        rows.append(dict(row))
    return rows


def read_csv(path: Path) -> list[Row]:
    return _delimited(path, ",")


def read_tsv(path: Path) -> list[Row]:
    return _delimited(path, "\t")


def read_jsonl(path: Path) -> list[Row]:
    return json_objects(_text(path).splitlines(), path)


def read_parquet(path: Path) -> list[Row]:
    import pyarrow.lib
    import pyarrow.parquet as pq

    if path.stat().st_size == 0:
        raise ValueError(f"{path}: the file is empty")
    try:
        return pq.read_table(path).to_pylist()
    except pyarrow.lib.ArrowException as error:
        raise ValueError(f"{path}: not a readable Parquet file ({error})") from None


# suffix -> reader. Add a line to read another format.
READERS: dict[str, Callable[[Path], list[Row]]] = {
    ".csv": read_csv,
    ".tsv": read_tsv,
    ".jsonl": read_jsonl,
    ".json": read_jsonl,  # JSON Lines saved under .json (as `datasets` writes them)
    ".parquet": read_parquet,
}


def read_rows(path: str | Path) -> list[Row]:
    """The rows of a data file; an error when it holds none."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"{path}: unknown data format {path.suffix!r}; expected one of {', '.join(READERS)}")
    rows = reader(path)
    if not rows:
        raise ValueError(f"{path}: no examples (only a header, or blank lines)")
    return rows


def require_columns(rows: Sequence[Row], path: str | Path, columns: dict[str, str]) -> None:
    """Every row has each column; `columns` maps config key (`data.text_column`) -> column name."""
    for index, row in enumerate(rows):
        for key, name in columns.items():
            if name not in row:
                where = "" if index == 0 else f", row {index + 1}"
                raise ValueError(f"{path}{where}: no column {name!r} (columns: {sorted(row)}); name the column "
                                 f"that holds it with {key}=NAME")


def as_list(value: Any, what: str) -> list:
    """A list cell: a list (JSONL, Parquet), or in CSV/TSV a JSON list or whitespace-separated words."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if hasattr(value, "tolist"):
        return list(value.tolist())
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"{what}: not a valid JSON list ({error.msg}): {text[:60]!r}") from None
            if isinstance(parsed, list):
                return parsed
        return text.split()
    raise ValueError(f"{what}: expected a list, got {type(value).__name__}: {value!r}")


def as_mapping(value: Any, what: str) -> dict:
    """A mapping cell: a dict (JSONL, Parquet) or a JSON object in CSV/TSV."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"{what}: not a valid JSON object ({error.msg}): {value[:60]!r}") from None
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(f"{what}: expected an object, got {type(value).__name__}: {value!r}")
