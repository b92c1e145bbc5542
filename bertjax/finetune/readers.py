"""Read a fine-tuning data file into rows (one dict per example), whatever its format.

CSV (header line), TSV (header line), JSONL (one object per line), JSON (a list of objects, SQuAD's nested
articles, or JSON Lines) and Parquet, chosen by the file's suffix in `READERS`. Each problem with the file is an
error that names it and says what to do: an empty file, bytes that
are not UTF-8, a malformed line, a missing column. Columns are looked up by `require_columns` with the name of the
config key that renames them, so the message can say which override to set.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bertjax.jsonl import json_objects, loads

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


def parse_delimited(text: str, path: Path, delimiter: str) -> list[Row]:
    """The rows of CSV/TSV `text` (read from `path`, which the errors name)."""
    # CSV: quoted fields may hold the delimiter and newlines. TSV: nothing is quoted (GLUE's files, and most NLP
    # data sets, hold quote marks as text), else a text starting with `"` would swallow the rows after it.
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting)
    if not reader.fieldnames:
        raise ValueError(f"{path}: no header line (the first line must name the columns)")
    rows = []
    for row in reader:
        if None in row:  # more fields than the header names
            raise ValueError(f"{path}, line {reader.line_num}: {len(row) - 1 + len(row[None])} fields but the "
                             f"header names {len(reader.fieldnames)}")
        rows.append(dict(row))
    return rows


def parse_jsonl(text: str, path: Path) -> list[Row]:
    """The objects of JSON Lines `text`. Lines end at a line feed only (a carriage return before it is JSON
    whitespace): str.splitlines would also split at U+2028, U+2029, U+0085 and the other separators JSON allows
    unescaped inside strings, cutting such a line in two."""
    return json_objects(text.split("\n"), path)


def parse_json(text: str, path: Path) -> list[Row]:
    """A .json file: one JSON document, a list of objects or SQuAD's nested articles (flattened by `squad_rows`),
    or else JSON Lines saved under .json (as `datasets` writes them)."""
    try:
        document = loads(text)
    except json.JSONDecodeError:  # several lines of objects: JSON Lines
        return parse_jsonl(text, path)
    if isinstance(document, dict) and _is_squad(document):
        return squad_rows(document, path)
    if isinstance(document, dict):
        # {"version": ..., "data": [rows]} and the like: the examples are a list under one key, not this object.
        nested = [key for key, value in document.items()
                  if isinstance(value, list) and value and all(isinstance(item, dict) for item in value)]
        if nested:
            raise ValueError(f"{path}: one JSON object whose examples are the list under {nested[0]!r}; write them "
                             "one object per line (JSON Lines), or as a JSON list")
        return [document]  # one example, however it is indented
    if isinstance(document, list):
        for index, item in enumerate(document):
            if not isinstance(item, dict):
                raise ValueError(f"{path}: item {index + 1} of its list is {type(item).__name__}, not an object "
                                 "(one example as {column: value})")
        return document
    raise ValueError(f"{path}: a JSON {type(document).__name__}, not examples (JSON Lines, a list of objects, or "
                     "SQuAD's articles)")


def _is_squad(document: dict) -> bool:
    articles = document.get("data")
    return isinstance(articles, list) and bool(articles) and all(
        isinstance(a, dict) and "paragraphs" in a for a in articles)


def squad_rows(document: dict, path: Path) -> list[Row]:
    """SQuAD's v1.1 / v2.0 layout ({"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
    "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}) as one row per question, in the layout of
    Hugging Face's `squad` data sets: id, title, context, question, answers {text: [...], answer_start: [...]}.
    An impossible question (v2.0) has no answers; its plausible_answers are not answers."""
    rows = []
    for a, article in enumerate(document["data"]):
        for p, paragraph in enumerate(_items(article, "paragraphs", f"{path}, article {a + 1}")):
            where = f"{path}, article {a + 1}, paragraph {p + 1}"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str):
                raise ValueError(f"{where}: no \"context\" text")
            for q, qa in enumerate(_items(paragraph, "qas", where)):
                at = f"{where}, question {q + 1}"
                if not isinstance(qa, dict) or not isinstance(qa.get("question"), str):
                    raise ValueError(f"{at}: no \"question\" text")
                answers = [] if qa.get("is_impossible") else _items(qa, "answers", at, required=False)
                if not all(isinstance(x, dict) and "text" in x and "answer_start" in x for x in answers):
                    raise ValueError(f"{at}: each answer must be {{\"text\": ..., \"answer_start\": ...}}")
                rows.append({"id": qa.get("id"), "title": article.get("title"), "context": paragraph["context"],
                             "question": qa["question"],
                             "answers": {"text": [x["text"] for x in answers],
                                         "answer_start": [x["answer_start"] for x in answers]}})
    return rows


def _items(parent: dict, key: str, where: str, required: bool = True) -> list:
    value = parent.get(key, None if required else [])
    if not isinstance(value, list):
        raise ValueError(f"{where}: \"{key}\" must be a list, got {type(value).__name__}")
    return value


def read_csv(path: Path) -> list[Row]:
    return parse_delimited(_text(path), path, ",")


def read_tsv(path: Path) -> list[Row]:
    return parse_delimited(_text(path), path, "\t")


def read_jsonl(path: Path) -> list[Row]:
    return parse_jsonl(_text(path), path)


def read_json(path: Path) -> list[Row]:
    return parse_json(_text(path), path)


def read_parquet(path: Path) -> list[Row]:
    from bertjax.data.sources import import_pyarrow

    pa, pq = import_pyarrow()
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: the file is empty")
    try:
        return pq.read_table(path).to_pylist()
    except pa.lib.ArrowException as error:
        raise ValueError(f"{path}: not a readable Parquet file ({error})") from None


# suffix -> reader. Add a line to read another format.
READERS: dict[str, Callable[[Path], list[Row]]] = {
    ".csv": read_csv,
    ".tsv": read_tsv,
    ".jsonl": read_jsonl,
    ".json": read_json,  # one document (a list, SQuAD's articles) or JSON Lines saved under .json
    ".parquet": read_parquet,
}

# For --help texts: the suffixes READERS reads.
DATA_FILES = ", ".join(READERS)

# suffix -> parser of text already decoded (`bertjax embed --errors replace` repairs the bytes first): every format
# of READERS but Parquet, which is binary.
TEXT_PARSERS: dict[str, Callable[[str, Path], list[Row]]] = {
    ".csv": lambda text, path: parse_delimited(text, path, ","),
    ".tsv": lambda text, path: parse_delimited(text, path, "\t"),
    ".jsonl": parse_jsonl,
    ".json": parse_json,
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


def is_null(value: Any) -> bool:
    """A missing value: None (JSONL null, Parquet null, a CSV row with too few fields) or a float NaN (pandas)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def text_cell(row: Row, column: str, key: str, where: str, *, optional: bool = False) -> str | None:
    """The text in `column` of one row (`where`: file and row; `key`: the config key that renames the column). A
    number is its text, as a CSV file would hold it. A missing or null cell is an error naming all three, never the
    text "None"; with `optional` it is None (e.g. no text_pair: a single text)."""
    value = row.get(column)
    if is_null(value):
        if optional:
            return None
        state = "null" if column in row else "missing"
        raise ValueError(f"{where}: column {column!r} is {state}; every example needs its text (fill it in or drop "
                         f"the row; {key}=NAME reads another column)")
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{where}: column {column!r} holds {type(value).__name__} {str(value)[:60]!r}, not a text")


def text_list(value: Any, what: str) -> list[str]:
    """A list cell of texts (words, choices) via `as_list`; a null item is an error naming it, never "None"."""
    items = as_list(value, what)
    for index, item in enumerate(items):
        if is_null(item) or not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise ValueError(f"{what}: item {index + 1} is {'null' if is_null(item) else repr(item)}, not a text")
    return [str(item) for item in items]


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
                parsed = loads(text)
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
            parsed = loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"{what}: not a valid JSON object ({error.msg}): {value[:60]!r}") from None
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(f"{what}: expected an object, got {type(value).__name__}: {value!r}")
