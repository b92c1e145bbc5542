"""Tokenize a corpus once into ArrayRecord files: train many times without paying for tokenization again.

Layout of a prepared directory:

    metadata.json                     format, token dtype, tokenizer fingerprint, split sizes, source stats
    tokenizer/                        the tokenizer used (load it with `load_tokenizer(dir / "tokenizer")`)
    train-00000.array_record, ...     one record per document: its token ids (uint16, or int32 for big vocabularies)
    eval-00000.array_record, ...      the held-out documents (same hash split as raw inputs)

`out_dir` may be a bucket (`gs://...`, see `bertjax.data.remote`): the files are written locally, then uploaded.
Records are written with `group_size:1` so that any document can be read on its own (random access for grain).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from etils import epath

from bertjax.data import remote
from bertjax.data.default_corpus import in_split
from bertjax.data.sources import PREPARED_METADATA, open_documents

FORMAT = "bertjax-prepared"
VERSION = 1
TOKENIZER_DIR = "tokenizer"
SPLIT_NAMES = ("train", "eval")  # the files of a split: <split>-00000.array_record, ...
SPLIT_FILE_SUFFIX = ".array_record"
_ENCODE_BATCH = 1024  # documents tokenized per call (the tokenizers batch internally)


def check_output_dir(out: str | pathlib.Path, overwrite: bool) -> None:
    """Refuse to write over prepared data unless asked to (called before any work, the tokenizer's included);
    `out` may be a bucket path."""
    remote.require_filesystem(out, "--out")  # before the first look at a bucket
    path = epath.Path(out)
    if path.exists() and not path.is_dir():  # else a FileExistsError traceback when the directory is made
        raise ValueError(f"output {str(out)!r} is a file, not a directory: give a new or empty directory for the "
                         "prepared data")
    if (path / PREPARED_METADATA).exists() and not overwrite:
        raise ValueError(f"{str(out)!r} already holds prepared data; pass --overwrite (overwrite=True in Python) "
                         "to replace it")


def _remove_prepared(out: epath.Path) -> None:
    """The prepared data an overwrite replaces (local or in a bucket), metadata.json first: a rewrite stopped
    halfway must read as incomplete, not as the old data over new files; and an old tokenizer of another kind (a
    tokenizer.json beside a new .model) must not be left for `load_tokenizer` to prefer. Other files are kept."""
    (out / PREPARED_METADATA).unlink(missing_ok=True)
    if out.is_dir():
        for split in SPLIT_NAMES:  # the files prepare names, not any ArrayRecord file of the user's
            for path in out.glob(f"{split}-[0-9]*{SPLIT_FILE_SUFFIX}"):
                path.unlink()
    (out / TOKENIZER_DIR).rmtree(missing_ok=True)


def prepare_corpus(inputs: str, tokenizer, out_dir: str | pathlib.Path, *, text_format: str = "lines",
                   text_field: str = "text", eval_fraction: float = 0.02, documents_per_file: int = 100_000,
                   overwrite: bool = False) -> dict:
    """Tokenize every document of `inputs` into `out_dir`; returns the metadata written."""
    from array_record.python.array_record_module import ArrayRecordWriter

    check_output_dir(out_dir, overwrite)
    if documents_per_file <= 0:
        raise ValueError(f"documents_per_file must be positive, got {documents_per_file}")
    source = open_documents(inputs, split="all", text_format=text_format, text_field=text_field)
    if source.tokenized:
        raise ValueError(f"{inputs!r} is already prepared data")
    if overwrite:
        _remove_prepared(epath.Path(out_dir))
    with remote.staged_output(out_dir) as out:  # a bucket: written locally, uploaded when complete
        out.mkdir(parents=True, exist_ok=True)
        dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)

        splits = {name: {"files": [], "documents": 0, "tokens": 0} for name in SPLIT_NAMES}
        writers: dict[str, ArrayRecordWriter] = {}
        empty_after_tokenization = 0

        def write(split: str, ids: np.ndarray) -> None:
            info = splits[split]
            if info["documents"] % documents_per_file == 0:
                if split in writers:
                    writers[split].close()
                name = f"{split}-{len(info['files']):05d}{SPLIT_FILE_SUFFIX}"
                writers[split] = ArrayRecordWriter(str(out / name), "group_size:1")
                info["files"].append(name)
            writers[split].write(ids.astype(dtype).tobytes())
            info["documents"] += 1
            info["tokens"] += len(ids)

        try:
            for start in range(0, len(source), _ENCODE_BATCH):
                texts = [source[i] for i in range(start, min(start + _ENCODE_BATCH, len(source)))]
                for text, ids in zip(texts, tokenizer.encode_batch(texts)):
                    if not len(ids):
                        empty_after_tokenization += 1
                        continue
                    write("eval" if in_split(text, "eval", eval_fraction) else "train", ids)
        finally:
            for writer in writers.values():
                writer.close()

        tokenizer.save(out / TOKENIZER_DIR)
        stats = source.stats.to_dict()
        stats["empty_after_tokenization"] = empty_after_tokenization
        metadata = {
            "format": FORMAT, "version": VERSION, "dtype": dtype.name, "input": inputs, "text_format": text_format,
            "text_field": text_field, "eval_fraction": eval_fraction,
            "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                          "fingerprint": tokenizer.fingerprint, "directory": TOKENIZER_DIR},
            "splits": splits, "source_stats": stats,
        }
        # Metadata last: a directory with metadata.json is complete.
        (out / PREPARED_METADATA).write_text(json.dumps(metadata, indent=2), encoding="utf-8")
    return metadata
