"""Shape buckets: the short fixed list of batch shapes an inference job may compile.

Every distinct [rows, length] shape is a new XLA program, so a stream of texts of any lengths must map onto a few
shapes. A bucket is a row length; its rows per batch follow from the token budget (`max_tokens // length`, rounded
down to a multiple of the data-parallel device count), so every batch holds about the same number of tokens; the last
rows of a length run in batches of a quarter or a sixteenth of that (packing.tail_rows). A job therefore
compiles at most three programs per bucket length (`packing.batch_shapes` lists them), whatever its texts.
"""

from __future__ import annotations

import dataclasses

DEFAULT_LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
# Token budget of one batch when none is given, by the platform the job runs on. On CPU a big batch's activations
# spill the caches: one thread of XLA CPU embeds with bert-base at 1,142 tokens/s in batches of 2,048 tokens and 806
# in batches of 16,384 (modernbert-base 807 and 608; 128-token rows, docs/benchmarks.md). Accelerators want big ones.
DEFAULT_MAX_TOKENS = {"cpu": 2048}
ACCELERATOR_MAX_TOKENS = 16384


def default_max_tokens(platform: str) -> int:
    """The token budget of one batch on `platform` ("cpu", "gpu", "tpu") when the caller gives none."""
    return DEFAULT_MAX_TOKENS.get(platform, ACCELERATOR_MAX_TOKENS)


@dataclasses.dataclass(frozen=True)
class BucketConfig:
    """How sequences become fixed-shape batches.

    lengths: row lengths that may be compiled (ascending); those above the model's length are dropped.
    max_tokens: token budget of one batch (rows * length); None: default_max_tokens of the devices' platform.
    max_segments: texts packed into one row at most (the static pooled-slot count K); 1 turns packing off.
    pack_length: row length that short texts are packed into (default: the longest usable bucket up to 512 and up
    to max_tokens).
    """

    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    max_tokens: int | None = None
    max_segments: int = 32
    pack_length: int | None = None

    def __post_init__(self):
        if not self.lengths or any(int(n) <= 0 for n in self.lengths):
            raise ValueError(f"BucketConfig.lengths must be positive row lengths, got {self.lengths}")
        if tuple(sorted(set(self.lengths))) != tuple(self.lengths):
            raise ValueError(f"BucketConfig.lengths must be strictly ascending, got {self.lengths}")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise ValueError(f"BucketConfig.max_tokens must be positive, got {self.max_tokens}")
        if self.max_segments <= 0:
            raise ValueError(f"BucketConfig.max_segments must be positive, got {self.max_segments}")
        if self.pack_length is not None and self.pack_length not in self.lengths:
            raise ValueError(f"BucketConfig.pack_length {self.pack_length} is not one of lengths {self.lengths}")


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """The buckets of one model and device count: the usable lengths and the rows of each."""

    lengths: tuple[int, ...]
    rows: dict[int, int]
    pack_length: int
    max_segments: int

    @property
    def max_length(self) -> int:
        return self.lengths[-1]

    def length_for(self, tokens: int) -> int:
        """The shortest bucket that holds `tokens`."""
        for length in self.lengths:
            if tokens <= length:
                return length
        raise ValueError(f"a sequence of {tokens} tokens is longer than the longest bucket ({self.max_length})")


def plan_buckets(config: BucketConfig, model_max_length: int, devices: int = 1, platform: str = "cpu") -> BucketPlan:
    """Usable buckets for a model taking at most `model_max_length` tokens per row, over `devices` data shards of
    `platform` (which picks the token budget when the config has none).

    The model's own length is always a bucket (so no text is truncated below what the model takes)."""
    if model_max_length <= 0:
        raise ValueError(f"the model takes no tokens (max length {model_max_length})")
    lengths = tuple(n for n in config.lengths if n < model_max_length) + (model_max_length,)
    max_tokens = config.max_tokens if config.max_tokens is not None else default_max_tokens(platform)
    if config.pack_length is not None and config.pack_length <= model_max_length:
        pack_length = config.pack_length
    else:  # rows of up to 512 tokens, and never longer than the token budget when a bucket fits in it
        pack_length = max([n for n in lengths if n <= min(512, max_tokens)] or [lengths[0]])
    rows = {}
    for length in lengths:
        per_batch = max(max_tokens // length, 1)
        rows[length] = max(per_batch // devices, 1) * devices  # every device gets the same number of rows
    return BucketPlan(lengths=lengths, rows=rows, pack_length=pack_length, max_segments=config.max_segments)
