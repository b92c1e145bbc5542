"""Is an input file text? Binary data given as text (a model file, an archive, a `.txt` that is really UTF-16)
would otherwise be indexed line by line: most lines skipped as invalid UTF-8, and the rest, fragments of bytes
that happen to decode, trained on. A file whose share of undecodable or binary lines passes
`MAX_NON_TEXT_SHARE` is refused instead, with an error naming it."""

from __future__ import annotations

import re

MAX_NON_TEXT_SHARE = 0.1  # real corpora have a stray bad line now and then, not one in ten
MIN_NON_TEXT_RECORDS = 3  # below this, a share says little (a 4-line file with one bad line is text)
NON_TEXT_REASONS = ("invalid_utf8", "binary")
# C0 control characters other than tab, newline, vertical tab, form feed and carriage return.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f]")
_MAX_CONTROL_SHARE = 0.05


def is_binary(text: str) -> bool:
    """Decoded, but not text: NUL bytes, or more than a few control characters."""
    if "\x00" in text:
        return True
    return len(_CONTROL.findall(text)) > _MAX_CONTROL_SHARE * len(text)


def check_mostly_text(path, records: int, non_text: int) -> None:
    """Raise ValueError when more than MAX_NON_TEXT_SHARE of a file's records (and at least MIN_NON_TEXT_RECORDS)
    are not text."""
    if non_text >= MIN_NON_TEXT_RECORDS and non_text > MAX_NON_TEXT_SHARE * records:
        raise ValueError(f"{str(path)!r} does not look like text: {non_text} of its {records} records are invalid "
                         f"UTF-8 or binary (more than {MAX_NON_TEXT_SHARE:.0%}); give text (UTF-8), JSONL or "
                         "Parquet files")
