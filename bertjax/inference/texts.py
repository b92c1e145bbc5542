"""`TextInference`: the public entry point for jitted inference over raw texts.

    inference = TextInference(row_fn, tokenizer, max_length=model_max_length(model.config))
    outputs = inference.run(params, ["first text", "second", ""])
    outputs.segments["embedding"]  # [3, dim], in input order

It tokenises, truncates or chunks, packs into shape buckets under a token budget, runs the row function (jitted,
data-parallel over the mesh) and hands back one output per text. `fill-mask`, `predict` and `embed` use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import jax
import numpy as np

from bertjax.inference.buckets import BucketConfig, plan_buckets
from bertjax.inference.packing import batch_shapes, pack
from bertjax.inference.pipeline import Outputs, SequenceFormat, pool_chunks, run_sequences, to_sequences
from bertjax.inference.runner import Runner, RowFunction


def model_max_length(config) -> int:
    """Tokens per row the model takes (learned positions lose `position_offset` of their table, as RoBERTa)."""
    return config.max_position_embeddings - config.position_offset


def check_tokenizer_fits(tokenizer, model_config, where) -> None:
    """A tokenizer with more tokens than the model has embedding rows is the wrong tokenizer (or the embedding was
    not resized after tokens were added): some text would become ids past the table, which a jitted gather turns
    into NaN rows instead of an error (and packing spreads a NaN row's attention to its neighbours). Every command
    that tokenizes for a model (finetune, predict, embed, search, train-embedder) refuses it at load time, before
    any data is read or any workdir made; `where` names the model (its directory). An embedding larger than the
    tokenizer (rows padded to a multiple of 64, as ModernBERT's) is fine."""
    if tokenizer.vocab_size > model_config.vocab_size:
        raise ValueError(
            f"{where}: the tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is "
            f"{model_config.vocab_size}, so ids {model_config.vocab_size}..{tokenizer.vocab_size - 1} have no "
            "embedding; use the tokenizer the model was trained with, or a model whose vocab_size is at least "
            f"{tokenizer.vocab_size}")


def text_list(texts: Iterable[str], caller: str) -> list[str]:
    """`texts` as a list, every element checked to be a string: a None or a number would otherwise reach the
    tokenizer, whose error ("List elements must be str or bytes") names neither the call nor the text. One string
    is refused too: it is an iterable of characters, so it would silently embed each character. `caller` names
    the function in the message ("encode", "embed")."""
    if isinstance(texts, str):
        raise TypeError(f"{caller} takes a list of texts, got one string; wrap it in a list")
    texts = list(texts)  # once: a generator would be used up by the checks below
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"text {i} is a {type(text).__name__}, not a string")
    return texts


def resolve_compute_dtype(dtype: str | None) -> str | None:
    """"auto": bfloat16 on accelerators, float32 on CPU, where XLA runs bfloat16 matmuls slower than float32
    (accelerators run them at twice the rate or more). Any other value as it is."""
    if dtype != "auto":
        return dtype
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def with_compute_dtype(model, dtype: str | None):
    """The same module computing in `dtype` (e.g. "bfloat16", or "auto": resolve_compute_dtype); parameters stay
    as they are (float32)."""
    dtype = resolve_compute_dtype(dtype)
    if dtype is None or dtype == model.config.dtype:
        return model
    return model.clone(config=model.config.replace(dtype=dtype))


def check_token_ids(sequences: Sequence[np.ndarray], vocab_size: int, what: str) -> None:
    """Ids given as arrays (`run_tokens`, `Embedder.embed_token_ids`: a corpus tokenised earlier, maybe by another
    tokenizer) must be rows of the embedding: one past it gathers a NaN row inside jit, and packing spreads that
    NaN to every text sharing the row; a negative one reads the last row. `what` names an item ("text")."""
    arrays = [np.asarray(ids) for ids in sequences]
    every = np.concatenate([ids.ravel() for ids in arrays]) if arrays else np.zeros(0, np.int32)
    if every.size and np.issubdtype(every.dtype, np.integer) and every.min() >= 0 and every.max() < vocab_size:
        return  # the common case, in one pass
    from bertjax.models.inputs import check_ids

    for i, ids in enumerate(arrays):  # find the first culprit, to name it (the range check the models make)
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"{what} {i}: token ids must be integers, got an array of {ids.dtype}")
        check_ids(ids, vocab_size, f"{what} {i}: token ids", " (the model's vocabulary: were these ids made by "
                  "another tokenizer?)")


class TextInference:
    """Texts in, one output per text out. `row_fn` as in bertjax.inference.runner; `segment_inputs` of `run` are
    per-text values handed to the row function per slot (e.g. prompt lengths). `vocab_size`: the model's, which
    token ids given as arrays are checked against (default: the tokenizer's `vocab_size`, if it has one)."""

    def __init__(self, row_fn: RowFunction, tokenizer, max_length: int, *, buckets: BucketConfig = BucketConfig(),
                 packing: bool = True, mesh=None, overflow: str = "truncate", stride: int = 0,
                 sequence_format: SequenceFormat | None = None, vocab_size: int | None = None):
        vocab_size = getattr(tokenizer, "vocab_size", None) if vocab_size is None else vocab_size
        self.vocab_size = None if vocab_size is None else int(vocab_size)  # None: ids unchecked
        self.runner = Runner(row_fn, mesh)
        self.tokenizer = tokenizer
        self.max_length = max_length
        self._format = sequence_format
        self.plan = plan_buckets(buckets, max_length, self.runner.devices, self.runner.platform)
        self.packing = packing and buckets.max_segments > 1
        self.overflow, self.stride = overflow, stride
        self.pad_id = int(tokenizer.pad_id)

    @property
    def format(self) -> SequenceFormat:
        """How a text becomes a sequence: built when texts are first given, so that `run_sequences` (complete rows,
        such as XLNet's `text <sep> <cls>` with its own token types) serves tokenizers whose layout texts can't."""
        if self._format is None:
            self._format = SequenceFormat.for_tokenizer(self.tokenizer, self.max_length)
        return self._format

    @property
    def compiles(self) -> int:
        return self.runner.compiles

    def warm_up(self, params, segment_inputs: dict[str, np.ndarray] | None = None,
                shapes: Iterable[tuple[int, int]] | None = None) -> int:
        """Compile every program a job may need (each [rows, length] of packing.batch_shapes) by running one batch of
        padding per shape, so that the first real texts, or a timed run, compile nothing (as text-embeddings-inference
        warms up when it starts). `segment_inputs`: per-text values by name as `run` is given them (any number of
        texts: only their dtypes and trailing shapes matter, which are part of the program). `shapes`: only these
        [rows, length] (e.g. the batches of a known job, `batch_shapes_of`), where compiling all of them would cost
        more than the job: a model of 8,192 positions has 24. Returns the number of programs compiled."""
        possible = batch_shapes(self.plan, self.runner.devices)
        shapes = possible if shapes is None else {tuple(shape) for shape in shapes}
        if not shapes <= possible:
            raise ValueError(f"warm_up: shapes {sorted(shapes - possible)} are not batch shapes of this plan "
                             f"({sorted(possible)})")
        before = self.compiles
        slots = self.plan.max_segments if self.packing else 1
        pending = []
        for rows, length in sorted(shapes):
            batch = {"input_ids": np.full((rows, length), self.pad_id, np.int32),
                     "segment_ids": np.ones((rows, length), np.int32)}  # outputs are dropped: only shapes matter
            for name, value in (segment_inputs or {}).items():
                value = np.asarray(value)
                batch[name] = np.zeros((rows, slots) + value.shape[1:], value.dtype)
            pending.append(self.runner.dispatch(params, batch, slots))
        jax.block_until_ready(pending)
        return self.compiles - before

    def batch_shapes_of(self, token_ids: Sequence[np.ndarray],
                        prompt_tokens: Sequence[int] | None = None) -> set[tuple[int, int]]:
        """The [rows, length] of the batches `run_tokens` makes of these texts (packing only, nothing computed)."""
        sequences = to_sequences(token_ids, self.format, self.overflow, self.stride, prompt_tokens).ids
        batches, _ = pack(sequences, self.plan, self.pad_id, packing=self.packing, devices=self.runner.devices)
        return {batch.input_ids.shape for batch in batches}

    def tokenize(self, texts: Iterable[str]) -> list[np.ndarray]:
        texts = text_list(texts, "TextInference")
        return list(self.tokenizer.encode_batch(texts)) if texts else []

    def run(self, params, texts: Iterable[str], segment_inputs: dict[str, np.ndarray] | None = None) -> Outputs:
        return self.run_tokens(params, self.tokenize(texts), segment_inputs)

    def run_tokens(self, params, token_ids: Sequence[np.ndarray],
                   segment_inputs: dict[str, np.ndarray] | None = None,
                   prompt_tokens: Sequence[int] | None = None) -> Outputs:
        """As `run`, for texts already tokenised (without special tokens); `prompt_tokens`: per text, the leading
        tokens that are a prompt, repeated in front of every chunk (pipeline.to_sequences)."""
        if self.vocab_size is not None:
            check_token_ids(token_ids, self.vocab_size, "text")
        sequences = to_sequences(token_ids, self.format, self.overflow, self.stride, prompt_tokens)
        per_sequence = {k: np.asarray(v)[sequences.source] for k, v in (segment_inputs or {}).items()}
        outputs = self._run(params, sequences.ids, per_sequence)
        chunked = len(sequences.ids) != sequences.count
        if chunked and outputs.tokens:
            raise ValueError("token outputs cannot be pooled over chunks; use overflow='truncate'")
        return Outputs(segments={k: pool_chunks(v, sequences.source, sequences.count)
                                 for k, v in outputs.segments.items()}, tokens=outputs.tokens)

    def run_sequences(self, params, sequences: Sequence[np.ndarray],
                      segment_inputs: dict[str, np.ndarray] | None = None,
                      token_inputs: dict[str, Sequence[np.ndarray]] | None = None) -> Outputs:
        """As `run`, for complete model sequences (special tokens included, at most max_length each);
        `token_inputs` as in pipeline.run_sequences (per-token arrays such as token type ids)."""
        if self.vocab_size is not None:
            check_token_ids(sequences, self.vocab_size, "sequence")
        return self._run(params, sequences, segment_inputs, token_inputs)

    def _run(self, params, sequences, segment_inputs=None, token_inputs=None) -> Outputs:
        return run_sequences(self.runner, params, sequences, self.plan, self.pad_id, packing=self.packing,
                             segment_inputs=segment_inputs, token_inputs=token_inputs)
