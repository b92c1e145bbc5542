"""Is an input file text? Binary data given as text (a model file, an archive, a `.txt` that is really UTF-16)
would otherwise be indexed line by line: most lines skipped as invalid UTF-8, and the rest, fragments of bytes
that happen to decode, trained on. A file whose share of undecodable or binary lines passes
`MAX_NON_TEXT_SHARE` is refused instead, with an error naming it. So is a JSONL file whose share of lines that are
not JSON, or lack the text field, passes it: another schema (the text under another key) or another format, whose
documents would otherwise be skipped nearly all, exit 0."""

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


def is_malformed_record(reason: str | None) -> bool:
    """A JSONL line that is not JSON, not an object with the text field, or whose field is not text."""
    return reason is not None and (reason == "not_json" or reason.startswith(("missing_field_", "field_")))


def check_mostly_records(path, records: int, malformed: dict[str, int], first: str) -> None:
    """Raise ValueError when more than MAX_NON_TEXT_SHARE of a JSONL file's lines (and at least
    MIN_NON_TEXT_RECORDS) are malformed; `malformed`: their count by reason, `first`: where the first one is."""
    count = sum(malformed.values())
    if count >= MIN_NON_TEXT_RECORDS and count > MAX_NON_TEXT_SHARE * records:
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(malformed.items()))
        raise ValueError(f"{str(path)!r}: {count} of its {records} lines are not JSON objects with a text field "
                         f"({reasons}; more than {MAX_NON_TEXT_SHARE:.0%}; the first at {first}); name the field "
                         "that holds the text (data.text_field, prepare's --text-field), or fix the file")


def check_mostly_text(path, records: int, non_text: int) -> None:
    """Raise ValueError when more than MAX_NON_TEXT_SHARE of a file's records (and at least MIN_NON_TEXT_RECORDS)
    are not text."""
    if non_text >= MIN_NON_TEXT_RECORDS and non_text > MAX_NON_TEXT_SHARE * records:
        raise ValueError(f"{str(path)!r} does not look like text: {non_text} of its {records} records are invalid "
                         f"UTF-8 or binary (more than {MAX_NON_TEXT_SHARE:.0%}); give text (UTF-8), JSONL or "
                         "Parquet files")
