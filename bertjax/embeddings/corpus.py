"""Texts in from files, embedding matrices out to .npy with a small JSON description beside them.

Inputs (`read_texts`): a text file (any suffix but the ones below) holds one text per line: every line is a text,
an empty line is the empty text (it gets an embedding, as sentence-transformers embeds ""), a final newline ends
the last line rather than adding an empty text, and a trailing "\\r" (Windows line ends) is dropped. JSONL, CSV, TSV
and Parquet files give the texts of one column (`column`, default "text"); a missing or null cell is an error that
names the row. Bytes that are not UTF-8 are an error naming the line and byte, or with errors="replace" become
U+FFFD (the count is reported), never a silently shorter output.

Outputs (`write_embeddings`): FILE.npy (float32 [texts, dim], row i = text i) and FILE.json: the model directory,
a fingerprint of the model's weights and settings, dim, count, normalisation, the prompt and the input (file,
column and the file's sha256), so `bertjax search` can check that queries are embedded by the same model and show
the matching texts (`described_texts`: only from the file that was embedded).
`check_output_paths` refuses, before any work, an output that would overwrite the input (under any name: a link
too) or a FILE.json that an earlier `bertjax embed` did not write (a results.json beside results.npy is the user's,
not ours to replace).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from bertjax.file_digest import sha256_of
from bertjax.jsonl import json_type_name, read_json_file

STRUCTURED_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")


def _decode(data: bytes, path: Path, errors: str) -> tuple[str, int]:
    """(text, number of bytes replaced)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a byte-order mark is not text
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError as error:
        if errors != "replace":
            line = data[:error.start].count(b"\n") + 1
            raise ValueError(f"{path}, line {line}: not UTF-8 (byte {error.start} is {data[error.start]:#04x}); "
                             "save the file as UTF-8, or pass --errors replace to read such bytes as U+FFFD") from None
    text = data.decode("utf-8", errors="replace")
    return text, text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")


def read_texts(path: str | os.PathLike, column: str = "text", errors: str = "strict") -> tuple[list[str], int]:
    """(texts, bytes replaced) of a text file (one text per line) or a column of a JSONL/CSV/TSV/Parquet file."""
    if errors not in ("strict", "replace"):
        raise ValueError(f"errors must be 'strict' or 'replace', got {errors!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file {path} " + ("is a directory; give one file of texts" if path.is_dir()
                                                         else "does not exist"))
    if path.suffix.lower() not in STRUCTURED_SUFFIXES:
        text, replaced = _decode(path.read_bytes(), path, errors)
        if not text:
            return [], 0
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()  # the newline that ends the last line
        return [line[:-1] if line.endswith("\r") else line for line in lines], replaced
    if path.stat().st_size == 0:
        return [], 0
    from bertjax.finetune.readers import READERS, TEXT_PARSERS

    suffix = path.suffix.lower()
    if suffix in TEXT_PARSERS and errors == "replace":
        # Decode with replacement here, then parse the repaired text; errors still name the user's file.
        text, replaced = _decode(path.read_bytes(), path, errors)
        return _column(TEXT_PARSERS[suffix](text, path), column, path), replaced
    return _column(READERS[suffix](path), column, path), 0


def _column(rows: list[dict], column: str, path: Path) -> list[str]:
    texts = []
    for i, row in enumerate(rows):
        if column not in row:
            raise ValueError(f"{path}, row {i + 1}: no column {column!r} (columns: {sorted(row)}); name the column "
                             "that holds the texts with --column NAME")
        value = row[column]
        if not isinstance(value, str):
            raise ValueError(f"{path}, row {i + 1}: column {column!r} holds {type(value).__name__} {value!r}, "
                             "not a text")
        texts.append(value)
    return texts


def model_fingerprint(encoder) -> str:
    """A short hash of the embedding model: its settings and a sample of every parameter array, so two copies of
    one model agree wherever they are stored and two different models (almost surely) do not."""
    from bertjax.models.params import params_fingerprint

    return params_fingerprint(encoder.params, repr((encoder.config, encoder.pooling, encoder.dense,
                                                    encoder.max_seq_length, encoder.do_lower_case)))


def description_path(npy: str | os.PathLike) -> Path:
    return Path(npy).with_suffix(".json")


# Keys every FILE.json written by `write_embeddings` holds: a file without them is someone else's, never replaced.
DESCRIPTION_KEYS = ("model_fingerprint", "count", "dim")


def is_embeddings_description(path: Path) -> bool:
    """Whether `path` is a FILE.json that `write_embeddings` wrote (and may write again)."""
    try:
        value = read_json_file(path)
    except (OSError, ValueError):
        return False
    return all(key in value for key in DESCRIPTION_KEYS)


def check_output_paths(npy: str | os.PathLike, input_path: str | os.PathLike | None = None) -> None:
    """Refuse, before any work, an --output whose FILE.npy or FILE.json would destroy a file that is not an earlier
    `bertjax embed` output: the input itself, an existing FILE.json of another kind (a results.json beside
    results.npy), or an existing FILE.npy without its FILE.json."""
    from bertjax.output_paths import check_output_file  # the check `predict` makes of its --output too

    npy = Path(npy)
    if npy.suffix != ".npy":
        raise ValueError(f"--output {npy}: the embeddings are written as a .npy file; name it FILE.npy")
    described = description_path(npy)
    check_output_file(npy, input_path, what="the embeddings")
    check_output_file(npy, input_path, writes=described, what="their description")
    if described.exists() and not is_embeddings_description(described):
        raise ValueError(f"--output {npy} writes its description to {described}, which exists and was not written "
                         f"by bertjax embed; move {described} away or choose another --output name")
    if npy.exists() and not described.exists():
        raise ValueError(f"--output {npy} exists and has no {described.name} beside it, so it is no earlier "
                         f"`bertjax embed` output (which this would replace); move it away or choose another name")


def write_embeddings(path: str | os.PathLike, vectors: np.ndarray, description: dict) -> Path:
    """Write FILE.npy (atomically: a partial file never carries the final name) and FILE.json."""
    path = Path(path)
    check_output_paths(path, description.get("input"))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial.npy")
    np.save(partial, np.asarray(vectors, np.float32))
    os.replace(partial, path)
    description = {**description, "count": int(vectors.shape[0]), "dim": int(vectors.shape[1])}
    description_path(path).write_text(json.dumps(description, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


# The JSON types of FILE.json's keys (what `embed` writes); None is allowed where `embed` writes null.
# (`input` is checked where it is read, `described_texts`.)
_DESCRIPTION_TYPES = {"model": (str,), "model_fingerprint": (str,), "input_sha256": (str,),
                      "column": (str, type(None)), "prompt": (str, type(None)), "normalized": (bool,),
                      "truncate_dim": (int, type(None)), "similarity_fn_name": (str, type(None)), "overflow": (str,),
                      "stride": (int,), "max_seq_length": (int,), "count": (int,), "dim": (int,)}


def read_description(npy: str | os.PathLike, shape: tuple[int, ...] | None = None) -> dict | None:
    """FILE.json beside FILE.npy, or None for an embedding matrix saved by other means. A key of another JSON type
    than `embed` writes, or a count and dim that are not the matrix's `shape`, is an error naming the key (search
    would otherwise act on it, or quietly ignore it)."""
    path = description_path(npy)
    if not path.is_file():
        return None
    description = read_json_file(path)
    for key, types in _DESCRIPTION_TYPES.items():
        value = description.get(key)
        if key in description and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            names = " or ".join("null" if t is type(None) else {str: "a string", int: "an integer",
                                                                  bool: "true/false"}[t] for t in types)
            raise ValueError(f"{path}: {key!r} must be {names}, got {json_type_name(value)}")
    if shape is not None:
        for key, size in (("count", shape[0]), ("dim", shape[1])):
            if key in description and description[key] != size:
                raise ValueError(f"{path}: {key!r} is {description[key]}, but {Path(npy).name} holds "
                                 f"{shape[0]} x {shape[1]}: FILE.json describes another matrix")
    return description


def described_texts(npy: str | os.PathLike, description: dict) -> Path | None:
    """The texts file FILE.json names as its `input`, checked to be the file that was embedded; None when it names
    none or the file is not on this machine (a corpus embedded elsewhere: hits are shown without texts).

    FILE.json travels with a shared corpus, so its `input` is not taken on its word: `search` would print whatever
    file of the user's it names (a private key, whose line count is easy to guess). The file must have the sha256
    that `embed` recorded, which whoever wrote FILE.json cannot know for a file they have not read; a FILE.json from
    before the digest was recorded is trusted only for a file inside the corpus's folder. Anything else is an error
    asking for --texts."""
    named = description.get("input")
    if named is None:
        return None
    where = description_path(npy)
    if not isinstance(named, str):
        raise ValueError(f"{where}: 'input' must be a file name, got {json_type_name(named)}; name the corpus "
                         "texts with --texts FILE")
    path = Path(named)
    if not path.is_file():
        return None
    recorded = description.get("input_sha256")
    if recorded is not None:
        if recorded == sha256_of(path):
            return path
        why = "its content is not what was embedded (it changed since, or FILE.json names another file)"
    elif path.resolve().is_relative_to(Path(npy).resolve().parent):
        return path
    else:
        why = "FILE.json records no digest of it and it lies outside the corpus's folder"
    raise ValueError(f"{where} names {path} as the corpus texts, but {why}; give the texts that were embedded with "
                     "--texts FILE")
