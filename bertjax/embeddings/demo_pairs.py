"""Retrieval pairs that need no download: the docstrings of the embedded default corpus (bertjax.data.default_corpus,
the running interpreter's own documentation), each split into its one-line summary and the rest.

    python -m bertjax.embeddings.demo_pairs --out data/docstring-pairs
    -> train.jsonl, validation.jsonl: {"anchor": "Return the number of items in the queue.",
                                       "positive": "<the docstring's body: arguments, behaviour, exceptions>"}

A document qualifies when its first paragraph is one line of MIN_SUMMARY_WORDS to MAX_SUMMARY_WORDS words (a
summary line, as PEP 257 asks) and the rest holds at least MIN_BODY_WORDS words. The task is the one code search
and documentation search have: find the full description from a short one, with few words in common. Summaries
that occur twice (overloads, copies) are dropped, so each anchor has one right answer. A pair goes to validation
when the hash of its summary falls below VALIDATION_FRACTION: stable across runs and machines.
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
from collections import Counter

from bertjax.jsonl import write_json_objects

MIN_SUMMARY_WORDS = 4
MAX_SUMMARY_WORDS = 30
MIN_BODY_WORDS = 12
VALIDATION_FRACTION = 0.1


def split_docstring(text: str) -> tuple[str, str] | None:
    """(summary line, body) of a docstring-shaped document, or None."""
    head, sep, body = text.strip().partition("\n\n")
    if not sep or "\n" in head.strip():
        return None
    summary = " ".join(head.split())
    body = body.strip()
    if not MIN_SUMMARY_WORDS <= len(summary.split()) <= MAX_SUMMARY_WORDS or len(body.split()) < MIN_BODY_WORDS:
        return None
    return summary, body


def is_validation(summary: str) -> bool:
    digest = int.from_bytes(hashlib.sha256(summary.encode("utf-8")).digest()[:8], "big")
    return digest / 2 ** 64 < VALIDATION_FRACTION


def docstring_pairs(documents: list[str] | None = None) -> list[dict[str, str]]:
    """{"anchor", "positive"} for every qualifying document (the default corpus when `documents` is None)."""
    if documents is None:
        from bertjax.data.default_corpus import default_corpus_documents
        documents = default_corpus_documents("all")
    pairs = [split for split in map(split_docstring, documents) if split is not None]
    counts = Counter(summary for summary, _ in pairs)
    return [{"anchor": summary, "positive": body} for summary, body in pairs if counts[summary] == 1]


def write_pairs(out: str | pathlib.Path, documents: list[str] | None = None) -> dict[str, int]:
    """Write train.jsonl and validation.jsonl under `out`; returns the number of pairs per split."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    splits: dict[str, list[dict]] = {"train": [], "validation": []}
    for pair in docstring_pairs(documents):
        splits["validation" if is_validation(pair["anchor"]) else "train"].append(pair)
    for split, pairs in splits.items():
        write_json_objects(out / f"{split}.jsonl", pairs)
    return {split: len(pairs) for split, pairs in splits.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))  # the first paragraph
    parser.add_argument("--out", required=True, help="directory for train.jsonl and validation.jsonl")
    counts = write_pairs(parser.parse_args(argv).out)
    print(f"{counts['train']} training and {counts['validation']} validation pairs (docstring summary -> body)")


if __name__ == "__main__":
    main()
