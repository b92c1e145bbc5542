"""Random-access document sources: text files, JSONL, Parquet, prepared ArrayRecord, the embedded default corpus.

A source is a grain `RandomAccessDataSource` (`len`, `[i]`) of documents: `str` for raw text, int32 numpy arrays
for prepared (already tokenized) data, `source.tokenized` says which. Files are indexed once when the source is
built: bad documents (empty or whitespace-only, invalid UTF-8, a JSONL line that is not JSON or lacks the text
field) are skipped there and counted in `source.stats`, so every index a source hands out is a good document.
Bad *inputs* (a missing path, a glob matching nothing, an unknown file type, a Parquet file without the field,
no document at all) raise an error naming the path.

Every source holds one split: a document goes to "eval" when the hash of its text says so (see
`default_corpus.in_split`), so the same text lands in the same split whatever file or format it comes from.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import mmap
import os
import pathlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from bertjax.data import remote
from bertjax.data.default_corpus import default_corpus_documents, in_split
from bertjax.data.text_checks import (NON_TEXT_REASONS, check_mostly_records, check_mostly_text, is_binary,
                                      is_malformed_record)
from bertjax.jsonl import loads

SPLITS = ("train", "eval", "all")
TEXT_FORMATS = ("lines", "paragraphs")
PREPARED_METADATA = "metadata.json"
DEFAULT_INPUT = "default"
_MAX_EXAMPLES = 5  # skip locations kept for the report


class NoDocuments(ValueError):
    """A split of the inputs holds no document (callers that know which setting decides the split name it)."""


@dataclasses.dataclass
class SourceStats:
    """What indexing the inputs found: kept documents, documents of the other split, skips by reason."""

    files: int = 0
    documents: int = 0
    other_split: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: list[str] = dataclasses.field(default_factory=list)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(f"{where}: {reason}")

    def merge(self, other: "SourceStats") -> None:
        self.files += other.files
        self.documents += other.documents
        self.other_split += other.other_split
        self.skipped.update(other.skipped)
        self.examples.extend(other.examples[: _MAX_EXAMPLES - len(self.examples)])

    def to_dict(self) -> dict:
        return {"files": self.files, "documents": self.documents, "other_split": self.other_split,
                "skipped": dict(sorted(self.skipped.items())), "examples": list(self.examples)}

    def report(self) -> str:
        line = f"{self.documents} documents from {self.files} files ({self.other_split} in the other split)"
        if self.skipped:
            reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(self.skipped.items()))
            line += f"; skipped {sum(self.skipped.values())}: {reasons}; e.g. {'; '.join(self.examples)}"
        return line


class DocumentSource:
    """Base of all sources: `len`, `[i]`, `get_many(indices)`, `tokenized`, `stats`."""

    tokenized = False
    stats: SourceStats
    # Tokenizer metadata ({"fingerprint", "vocab_size", ...}) of each prepared part; empty for raw text.
    prepared_with: tuple[dict, ...] = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int):
        raise NotImplementedError

    def get_many(self, indices: Sequence[int]) -> list:
        return [self[int(i)] for i in indices]


class InMemorySource(DocumentSource):
    """Documents held in a list: the default corpus, or texts given directly (tests, notebooks)."""

    def __init__(self, documents: Sequence[str], split: str = "all", eval_fraction: float = 0.0,
                 name: str = "<memory>"):
        self.stats = SourceStats(files=1)
        self._documents = []
        for i, doc in enumerate(documents):
            if not isinstance(doc, str) or not doc.strip():
                self.stats.skip("empty_document" if isinstance(doc, str) else "not_text", f"{name}[{i}]")
            elif in_split(doc.strip(), split, eval_fraction):
                self._documents.append(doc.strip())
            else:
                self.stats.other_split += 1
        self.stats.documents = len(self._documents)

    def __len__(self) -> int:
        return len(self._documents)

    def __getitem__(self, index: int) -> str:
        return self._documents[index]


def default_corpus_source(split: str, eval_fraction: float) -> InMemorySource:
    # Every document goes in and the source keeps its split, so the stats count the other split's documents too.
    return InMemorySource(default_corpus_documents("all"), split, eval_fraction, name="default corpus")


class _Files:
    """Files opened lazily per process (memory maps neither pickle nor survive a fork safely)."""

    def __init__(self, paths: Sequence[pathlib.Path]):
        self.paths = list(paths)
        self._maps: dict[int, mmap.mmap] = {}

    def read(self, file: int, start: int, end: int) -> bytes:
        data = self._maps.get(file)
        if data is None:
            with open(self.paths[file], "rb") as handle:
                data = self._maps[file] = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        return data[start:end]

    def __getstate__(self):
        return {"paths": self.paths}

    def __setstate__(self, state):
        self.__init__(state["paths"])


# A scanner turns one file's bytes into (start, end, text) for good documents and (start, end, reason) for bad
# ones; an extractor turns the stored bytes of a good document back into its text.
Scan = Callable[[bytes], Iterator[tuple[int, int, str | None, str | None]]]


class IndexedFileSource(DocumentSource):
    """Text or JSONL files: indexed once (byte ranges of good documents), read back through memory maps."""

    def __init__(self, paths: Sequence[pathlib.Path], scan: Scan, extract: Callable[[bytes], str], split: str,
                 eval_fraction: float):
        self.stats = SourceStats(files=len(paths))
        self._files = _Files(paths)
        self._extract = extract
        files, starts, ends = [], [], []
        for file_index, path in enumerate(paths):
            data = _map_file(path)
            line_starts = None
            records = non_text = 0
            malformed, first_malformed = collections.Counter(), ""
            for start, end, text, reason in scan(data):
                records += 1
                non_text += reason in NON_TEXT_REASONS
                if reason is not None:
                    if line_starts is None:
                        line_starts = np.flatnonzero(np.frombuffer(data, np.uint8) == ord("\n"))
                    line = int(np.searchsorted(line_starts, start)) + 1
                    self.stats.skip(reason, f"{path}:{line}")
                    if is_malformed_record(reason):
                        malformed[reason] += 1
                        first_malformed = first_malformed or f"{path}:{line}"
                elif in_split(text, split, eval_fraction):
                    files.append(file_index)
                    starts.append(start)
                    ends.append(end)
                else:
                    self.stats.other_split += 1
            if records == 0:
                self.stats.skip("empty_file", str(path))
            check_mostly_text(path, records, non_text)
            check_mostly_records(path, records, malformed, first_malformed)
        self._file = np.array(files, np.int32)
        self._start = np.array(starts, np.int64)
        self._end = np.array(ends, np.int64)
        self.stats.documents = len(self._file)

    def __len__(self) -> int:
        return len(self._file)

    def __getitem__(self, index: int) -> str:
        return self._extract(self._files.read(int(self._file[index]), int(self._start[index]), int(self._end[index])))


def _map_file(path: pathlib.Path) -> bytes | mmap.mmap:
    """The file's bytes without reading them all into memory (an empty file cannot be mapped)."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return b""
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def _decode(raw: bytes) -> tuple[str | None, str | None]:
    # Documents are compared, hashed (for the split) and returned stripped, whatever the file format.
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, "invalid_utf8"
    if not text:
        return None, "empty_document"
    if is_binary(text):
        return None, "binary"
    return text, None


def _line_spans(data: bytes) -> Iterator[tuple[int, int]]:
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        yield start, end
        start = end + 1


def scan_lines(data: bytes):
    """One document per line (a blank line is an empty document: skipped and counted)."""
    for start, end in _line_spans(data):
        yield (start, end, *_decode(data[start:end]))


def scan_paragraphs(data: bytes):
    """Documents separated by blank lines (the format of BERT's original pretraining data)."""
    doc_start = doc_end = None
    for start, end in _line_spans(data):
        if data[start:end].strip():
            doc_start = start if doc_start is None else doc_start
            doc_end = end
        elif doc_start is not None:
            yield (doc_start, doc_end, *_decode(data[doc_start:doc_end]))
            doc_start = None
    if doc_start is not None:
        yield (doc_start, doc_end, *_decode(data[doc_start:doc_end]))


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8").strip()


def jsonl_scanner(field: str) -> Scan:
    def scan(data: bytes):
        for start, end in _line_spans(data):
            yield (start, end, *_jsonl_text(data[start:end], field))
    return scan


def _jsonl_text(raw: bytes, field: str) -> tuple[str | None, str | None]:
    if not raw.strip():
        return None, "empty_document"
    try:
        record = loads(raw)  # nesting too deep to read is malformed JSON too: this line is skipped, not the scan
    except UnicodeDecodeError:
        return None, "invalid_utf8"
    except ValueError:
        return None, "not_json"
    if not isinstance(record, dict) or field not in record:
        return None, f"missing_field_{field}"
    text = record[field]
    if not isinstance(text, str):
        return None, f"field_{field}_not_text"
    text = text.strip()
    if not text:
        return None, "empty_document"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape ("\ud800"): valid JSON, but no UTF-8 text
        return None, "invalid_utf8"
    return text, None


class _JsonlExtract:
    """Picklable (a closure would not be) extractor of one field."""

    def __init__(self, field: str):
        self.field = field

    def __call__(self, raw: bytes) -> str:
        return json.loads(raw)[self.field].strip()


def import_pyarrow():
    """(pyarrow, pyarrow.parquet); pyarrow is the optional `parquet` extra, so its absence is an install hint."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as error:
        raise ValueError("reading Parquet needs pyarrow: pip install 'bertjax[parquet]'") from error
    return pyarrow, pyarrow.parquet


class ParquetSource(DocumentSource):
    """Parquet files (needs pyarrow): the string column `field`; null and empty values are skipped."""

    def __init__(self, paths: Sequence[pathlib.Path], field: str, split: str, eval_fraction: float):
        pa, pq = import_pyarrow()
        self.stats = SourceStats(files=len(paths))
        self._columns, self._file, self._row = [], [], []
        for file_index, path in enumerate(paths):
            try:  # pyarrow's errors ("Parquet magic bytes not found in footer") name no file
                schema = pq.read_schema(path)
            except (pa.ArrowException, OSError, ValueError) as error:
                raise ValueError(f"Parquet file {str(path)!r} is not readable as Parquet: {error}") from None
            if field not in schema.names:
                raise ValueError(f"Parquet file {str(path)!r} has no column {field!r} (text_field); "
                                 f"columns: {schema.names}")
            try:
                column = pq.read_table(path, columns=[field]).column(field).combine_chunks()
            except (pa.ArrowException, OSError, ValueError) as error:
                raise ValueError(f"Parquet file {str(path)!r} is not readable as Parquet: {error}") from None
            self._columns.append(column)
            if len(column) == 0:
                self.stats.skip("empty_file", str(path))
            for row, value in enumerate(column.to_pylist()):
                if not isinstance(value, str) or not value.strip():
                    self.stats.skip("empty_document" if isinstance(value, str) or value is None
                                    else f"field_{field}_not_text", f"{path}[{row}]")
                elif in_split(value.strip(), split, eval_fraction):
                    self._file.append(file_index)
                    self._row.append(row)
                else:
                    self.stats.other_split += 1
        self.stats.documents = len(self._file)

    def __len__(self) -> int:
        return len(self._file)

    def __getitem__(self, index: int) -> str:
        return self._columns[self._file[index]][self._row[index]].as_py().strip()


class PreparedSource(DocumentSource):
    """ArrayRecord files written by `bertjax prepare`: one record per document, its token ids."""

    tokenized = True

    def __init__(self, directory: pathlib.Path, split: str):
        import grain

        metadata = read_prepared_metadata(directory)
        splits = ("train", "eval") if split == "all" else (split,)
        paths = [str(directory / name) for s in splits for name in metadata["splits"][s]["files"]]
        self.metadata = metadata
        self.prepared_with = (metadata["tokenizer"],)
        self._dtype = np.dtype(metadata["dtype"])
        self._records = grain.sources.ArrayRecordDataSource(paths) if paths else None
        documents = sum(metadata["splits"][s]["documents"] for s in splits)
        self.stats = SourceStats(files=len(paths), documents=documents)
        if self._records is not None and len(self._records) != documents:
            raise ValueError(f"prepared data {str(directory)!r}: metadata says {documents} documents, the "
                             f"ArrayRecord files hold {len(self._records)}")

    def __len__(self) -> int:
        return self.stats.documents

    def __getitem__(self, index: int) -> np.ndarray:
        return np.frombuffer(self._records[int(index)], self._dtype).astype(np.int32)

    def get_many(self, indices: Sequence[int]) -> list[np.ndarray]:
        records = self._records.__getitems__([int(i) for i in indices])
        return [np.frombuffer(r, self._dtype).astype(np.int32) for r in records]


def read_prepared_metadata(directory: pathlib.Path) -> dict:
    path = pathlib.Path(directory) / PREPARED_METADATA
    try:
        metadata = loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{str(directory)!r} is not prepared data: {PREPARED_METADATA} is missing") from None
    except ValueError as error:
        raise ValueError(f"prepared data metadata {str(path)!r} is not valid JSON: {error}") from None
    required = {"": ("format", "dtype", "splits", "tokenizer"), "tokenizer": ("fingerprint", "vocab_size"),
                "splits": ("train", "eval")}
    for section, keys in required.items():
        table = metadata.get(section, {}) if section else metadata
        for key in keys:
            if not isinstance(table, dict) or key not in table:
                where = f"{section}.{key}" if section else key
                raise ValueError(f"prepared data metadata {str(path)!r} lacks the key {where!r}")
    return metadata


class ConcatSource(DocumentSource):
    """Several sources of the same kind (text or tokens) end to end."""

    def __init__(self, sources: Sequence[DocumentSource]):
        if len({s.tokenized for s in sources}) > 1:
            raise ValueError("cannot mix prepared (tokenized) data with raw text inputs")
        self._sources = list(sources)
        self._offsets = np.cumsum([0] + [len(s) for s in sources])
        self.tokenized = sources[0].tokenized
        self.prepared_with = tuple(info for source in sources for info in source.prepared_with)
        self.stats = SourceStats()
        for source in sources:
            self.stats.merge(source.stats)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getitem__(self, index: int):
        which = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return self._sources[which][index - int(self._offsets[which])]


# File suffix -> kind of file; kind -> how to build a source over a list of such files.
FILE_KINDS: dict[str, str] = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".ndjson": "jsonl",
                              ".parquet": "parquet"}
_SCANNERS: dict[str, Callable[[bytes], Iterator]] = {"lines": scan_lines, "paragraphs": scan_paragraphs}


def _text_source(paths, *, text_format, text_field, split, eval_fraction):
    if text_format not in _SCANNERS:
        raise ValueError(f"text_format must be one of {TEXT_FORMATS}, got {text_format!r}")
    return IndexedFileSource(paths, _SCANNERS[text_format], _decode_text, split, eval_fraction)


def _jsonl_source(paths, *, text_format, text_field, split, eval_fraction):
    return IndexedFileSource(paths, jsonl_scanner(text_field), _JsonlExtract(text_field), split, eval_fraction)


def _parquet_source(paths, *, text_format, text_field, split, eval_fraction):
    return ParquetSource(paths, text_field, split, eval_fraction)


SOURCE_BUILDERS: dict[str, Callable[..., DocumentSource]] = {
    "text": _text_source, "jsonl": _jsonl_source, "parquet": _parquet_source}


def open_documents(inputs: str | Sequence[str], *, split: str = "train", text_format: str = "lines",
                   text_field: str = "text", eval_fraction: float = 0.02) -> DocumentSource:
    """The documents of `inputs` in `split`: "default" (the embedded corpus), a prepared-data directory, or
    files, directories and globs (a comma-separated string or a list), local or remote (`gs://...`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    specs = [s.strip() for s in inputs.split(",")] if isinstance(inputs, str) else [str(s) for s in inputs]
    specs = [s for s in specs if s]
    if not specs:
        raise ValueError("no input given (input is empty)")
    sources: list[DocumentSource] = []
    files_by_kind: dict[str, list[pathlib.Path]] = collections.defaultdict(list)
    for spec in specs:
        prepared = None if spec == DEFAULT_INPUT else prepared_directory(spec)
        if spec == DEFAULT_INPUT:
            sources.append(default_corpus_source(split, eval_fraction))
        elif prepared is not None:
            sources.append(PreparedSource(prepared, split))
        else:
            if remote.is_remote(spec):
                with remote.reading(spec):
                    paths = [remote.local_file(p) for p in remote.expand(spec, tuple(FILE_KINDS))]
            else:
                paths = _expand(spec)
            for path in paths:
                kind = FILE_KINDS.get(path.suffix.lower())
                if kind is None:
                    raise ValueError(f"unknown file type {str(path)!r}; supported suffixes: "
                                     f"{', '.join(FILE_KINDS)} (or a directory prepared by `bertjax prepare`)")
                files_by_kind[kind].append(path)
    for kind, paths in files_by_kind.items():
        sources.append(SOURCE_BUILDERS[kind](_each_file_once(paths), text_format=text_format, text_field=text_field,
                                             split=split, eval_fraction=eval_fraction))
    source = sources[0] if len(sources) == 1 else ConcatSource(sources)
    if len(source) == 0:
        raise NoDocuments(f"no {'' if split == 'all' else split + ' '}documents in {', '.join(specs)} "
                          f"({source.stats.report()})")
    return source


def prepared_directory(spec: str) -> pathlib.Path | None:
    """The local directory of a `bertjax prepare` output given as input (a remote one is copied into the local
    cache, see `bertjax.data.remote`); None when `spec` is not prepared data."""
    if remote.is_remote(spec):
        from etils import epath

        remote.require_filesystem(spec)  # (the error names the path: data.input's, or prepare's --input)
        with remote.reading(spec):
            if "*" in spec or not (epath.Path(spec) / PREPARED_METADATA).exists():
                return None
            return remote.local_directory(spec)
    if os.path.isdir(spec) and os.path.isfile(os.path.join(spec, PREPARED_METADATA)):
        return pathlib.Path(spec)
    return None


def _each_file_once(paths: list[pathlib.Path]) -> list[pathlib.Path]:
    """Each file once however the inputs name it (`corp/a.txt` and its absolute path, a link, a directory and a
    file in it), in sorted order; the spelling given first is kept for messages."""
    by_file: dict[str, pathlib.Path] = {}
    for path in paths:
        by_file.setdefault(os.path.realpath(path), path)
    return sorted(by_file.values())


# Files in an input directory that hold data this cannot read: dropped without a word, a corpus would shrink.
# `.json` is data when its first line is a JSON object (JSON Lines under another suffix); the metadata files data
# set tools write beside their data (Hugging Face's dataset_info.json, state.json, ...) are not.
_UNREAD_DATA_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".csv", ".tsv", ".arrow")
_METADATA_JSON = {"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json", "config.json",
                  PREPARED_METADATA}


def _json_lines_file(path: str) -> bool:
    if os.path.basename(path) in _METADATA_JSON:
        return False
    try:
        with open(path, "rb") as handle:
            first = handle.readline(1 << 20).strip()
        return first.startswith(b"{") and isinstance(loads(first), dict)
    except (OSError, ValueError):  # not one object on its first line: a document of its own, not JSON Lines
        return False


def _directory_files(spec: str) -> list[pathlib.Path]:
    """The data files under directory `spec`. Other files there (READMEs, metadata) are not data; a `bertjax
    prepare` output inside it (its tokenizer's vocab.txt is a text file) is not raw text, and is passed over; a file
    of data in a form this cannot read (compressed, JSON Lines named .json, CSV) is an error naming it."""
    paths, unread = [], []
    for root, directories, files in os.walk(spec):  # links to directories not followed, as rglob
        if root != spec and (PREPARED_METADATA in files or any(f.endswith(".array_record") for f in files)):
            directories[:] = []  # prepared data, or a prepare stopped halfway
            continue
        for name in files:
            suffix = pathlib.Path(name).suffix.lower()
            if suffix in FILE_KINDS:
                paths.append(pathlib.Path(root, name))
            elif suffix in _UNREAD_DATA_SUFFIXES or suffix == ".json" and _json_lines_file(os.path.join(root, name)):
                unread.append(os.path.join(root, name))
    if unread:
        shown = ", ".join(sorted(unread)[:5]) + (f" and {len(unread) - 5} more" if len(unread) > 5 else "")
        found = collections.Counter(path.suffix.lower() for path in paths).most_common(1)
        glob_hint = os.path.join(spec, "**", f"*{found[0][0] if found else '.txt'}")
        raise ValueError(f"directory {spec!r} holds files this cannot read as documents: {shown}. Readable: "
                         f"{', '.join(FILE_KINDS)} (decompress them; JSON Lines as .jsonl), or name the files to read "
                         f"with a glob such as {glob_hint!r}")
    if not paths:
        raise FileNotFoundError(f"directory {spec!r} holds no file of a known type ({', '.join(FILE_KINDS)})")
    return sorted(paths)


def _expand(spec: str) -> list[pathlib.Path]:
    if os.path.isdir(spec):
        return _directory_files(spec)
    if glob.has_magic(spec):
        paths = sorted(pathlib.Path(p) for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
        if not paths:
            raise FileNotFoundError(f"no file matches {spec!r}")
        return paths
    if not os.path.exists(spec):
        raise FileNotFoundError(f"input {spec!r} does not exist")
    return [pathlib.Path(spec)]
