"""Texts -> token sequences -> packed batches -> row function -> one output per text, in input order.

Texts longer than the model are truncated (the default) or, with `overflow="chunk"`, cut into overlapping chunks
(`stride` tokens shared by neighbours) whose per-slot outputs are averaged back into one per text. An empty text is
still a sequence (its special tokens alone) and gets its own output, as in sentence-transformers: the output count
always equals the input count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from bertjax.inference.buckets import BucketPlan
from bertjax.inference.packing import Placement, pack
from bertjax.inference.runner import Runner

OVERFLOW_MODES = ("truncate", "chunk")
# Attention kinds whose segment ids fully separate packed sequences (positions restart per segment, or only
# relative distances inside a segment count: DeBERTa's disentangled and XLNet's relative attention).
# tests/test_inference.py holds a packed row equal to one text per row for a preset of each.
PACKABLE_ATTENTION_KINDS = {"standard", "disentangled", "two_stream"}


def supports_packing(config) -> bool:
    return config.attention_kind in PACKABLE_ATTENTION_KINDS


@dataclasses.dataclass(frozen=True)
class SequenceFormat:
    """How token ids of a text become a model sequence: `prefix` + ids + `suffix` (e.g. [CLS] ... [SEP])."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    max_length: int  # the longest sequence, special tokens included

    @property
    def room(self) -> int:
        room = self.max_length - len(self.prefix) - len(self.suffix)
        if room <= 0:
            raise ValueError(f"max length {self.max_length} leaves no room for text between the special tokens")
        return room

    @classmethod
    def for_tokenizer(cls, tokenizer, max_length: int) -> "SequenceFormat":
        """The tokenizer's own layout of one text ([CLS] text [SEP], <s> text </s>, ...). Rows here are all of
        token type 0: a layout with other types (XLNet's text <sep> <cls>, its <cls> of type 2) is refused rather
        than run in a form its model never saw."""
        from bertjax.data.special_template import TEXT

        items = tokenizer.special_template.single
        tokens = [item.token for item in items]
        if tokens.count(TEXT) != 1 or any(item.type_id for item in items):
            raise ValueError(f"the tokenizer lays a text out as {tokenizer.special_template.describe()}; inference on "
                             "texts builds rows of token type 0 only (XLNet's layout is not served here: run its "
                             "model on ids you build)")
        at = tokens.index(TEXT)
        return cls(prefix=tuple(int(t) for t in tokens[:at]), suffix=tuple(int(t) for t in tokens[at + 1:]),
                   max_length=max_length)


@dataclasses.dataclass(frozen=True)
class Sequences:
    ids: list[np.ndarray]  # model sequences, special tokens included
    source: np.ndarray  # [len(ids)]: the text each sequence came from
    count: int  # number of texts


def to_sequences(token_ids: Sequence[np.ndarray], fmt: SequenceFormat, overflow: str = "truncate",
                 stride: int = 0, prompt_tokens: Sequence[int] | None = None) -> Sequences:
    """Model sequences of texts already tokenised without special tokens.

    `prompt_tokens` (chunking): per text, how many of its leading tokens are a prompt. A text that fits is one
    sequence, exactly as truncation makes it; a longer one is cut after its prompt, and every chunk carries the
    prompt in front of its `room - prompt` text tokens (prompt and text tokenised together, so byte-level BPE
    merges the prompt's trailing space into the text's first word as sentence-transformers tokenises it)."""
    if overflow not in OVERFLOW_MODES:
        raise ValueError(f"overflow must be one of {OVERFLOW_MODES}, got {overflow!r}")
    room = fmt.room
    if overflow == "chunk" and not 0 <= stride < room:
        raise ValueError(f"stride must be in [0, {room}) (the text tokens of one chunk), got {stride}")
    if prompt_tokens is not None and len(prompt_tokens) != len(token_ids):
        raise ValueError(f"prompt_tokens holds {len(prompt_tokens)} values for {len(token_ids)} texts")
    prefix, suffix = np.asarray(fmt.prefix, np.int32), np.asarray(fmt.suffix, np.int32)
    ids, source = [], []
    for i, tokens in enumerate(token_ids):
        tokens = np.asarray(tokens, np.int32)
        if overflow == "truncate" or len(tokens) <= room:
            ids.append(np.concatenate([prefix, tokens[:room], suffix]))
            source.append(i)
            continue
        lead = 0 if prompt_tokens is None else int(prompt_tokens[i])
        for chunk in _chunks(tokens[lead:], room - lead, stride, lead, fmt.max_length):
            ids.append(np.concatenate([prefix, tokens[:lead], chunk, suffix]))
            source.append(i)
    return Sequences(ids=ids, source=np.asarray(source, np.int64), count=len(token_ids))


def _chunks(text: np.ndarray, room: int, stride: int, prompt: int, max_length: int) -> list[np.ndarray]:
    """Windows of `room` tokens over `text`, neighbours sharing `stride`; `prompt` tokens go before each one."""
    if room <= 0:
        raise ValueError(f"overflow='chunk': the prompt is {prompt} tokens, which leaves no room for text in a chunk "
                         f"of {max_length} tokens (special tokens included); shorten the prompt or use "
                         "overflow='truncate'")
    if room <= stride:
        raise ValueError(f"overflow='chunk': the prompt is {prompt} tokens, which leaves {room} text tokens per chunk "
                         f"of {max_length}, no more than stride={stride}; lower the stride or shorten the prompt")
    step = room - stride
    return [text[start:start + room] for start in range(0, len(text) - stride, step)]


@dataclasses.dataclass
class Outputs:
    segments: dict[str, np.ndarray]  # name -> [sequences, ...]: one value per sequence
    tokens: dict[str, list[np.ndarray]]  # name -> per sequence, [its length, ...]


def run_sequences(runner: Runner, params, sequences: Sequence[np.ndarray], plan: BucketPlan, pad_id: int, *,
                  packing: bool = True, segment_inputs: dict[str, np.ndarray] | None = None,
                  token_inputs: dict[str, Sequence[np.ndarray]] | None = None) -> Outputs:
    """The row function's outputs for every sequence, in the order given. `segment_inputs`: one value per sequence
    (handed to the row function per slot, [rows, K, ...]); `token_inputs`: one array per sequence, as long as the
    sequence (e.g. token type ids), placed at the sequence's tokens ([rows, length], 0 on padding)."""
    segment_inputs = segment_inputs or {}
    token_inputs = token_inputs or {}
    for name, values in token_inputs.items():
        if len(values) != len(sequences) or any(len(v) != len(s) for v, s in zip(values, sequences)):
            raise ValueError(f"token input {name!r} must hold one array per sequence, as long as the sequence")
    batches, placement = pack(sequences, plan, pad_id, packing=packing, devices=runner.devices)
    max_segments = plan.max_segments if packing else 1

    def host_batches():
        for b, batch in enumerate(batches):
            arrays = {"input_ids": batch.input_ids, "segment_ids": batch.segment_ids}
            mine = placement.batch == b
            for name, values in segment_inputs.items():
                slots = np.zeros((batch.input_ids.shape[0], max_segments) + values.shape[1:], values.dtype)
                slots[placement.row[mine], placement.slot[mine]] = values[mine]
                arrays[name] = slots
            for name, values in token_inputs.items():
                tokens = np.zeros(batch.input_ids.shape, np.asarray(values[0]).dtype)
                for i in np.flatnonzero(mine):
                    start = placement.start[i]
                    tokens[placement.row[i], start:start + placement.length[i]] = values[i]
                arrays[name] = tokens
            yield arrays

    results = list(runner.run(params, host_batches(), max_segments))
    return unpack(results, placement)


def unpack(results: list[dict], placement: Placement) -> Outputs:
    """Per-batch row outputs -> per-sequence values (slot outputs by slot, token outputs by span)."""
    count = len(placement.batch)
    segments: dict[str, np.ndarray] = {}
    tokens: dict[str, list[np.ndarray]] = {}
    if not results:
        return Outputs(segments, tokens)
    for name, first in results[0].get("segments", {}).items():
        out = np.zeros((count,) + first.shape[2:], first.dtype)
        for b, result in enumerate(results):
            mine = np.flatnonzero(placement.batch == b)
            out[mine] = result["segments"][name][placement.row[mine], placement.slot[mine]]
        segments[name] = out
    for name in results[0].get("tokens", {}):
        spans = zip(placement.batch, placement.row, placement.start, placement.length)
        tokens[name] = [results[b]["tokens"][name][r, s:s + n] for b, r, s, n in spans]
    return Outputs(segments, tokens)


def pool_chunks(values: np.ndarray, source: np.ndarray, count: int) -> np.ndarray:
    """Per-sequence values -> per-text mean over the text's chunks (identity when every text is one sequence)."""
    if len(source) == count:
        return values
    sums = np.zeros((count,) + values.shape[1:], np.float64)
    np.add.at(sums, source, values)
    return (sums / np.bincount(source, minlength=count).reshape((count,) + (1,) * (values.ndim - 1))).astype(values.dtype)
