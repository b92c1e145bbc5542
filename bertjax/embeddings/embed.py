"""Embedding a corpus through the inference layer: packed rows, shape buckets, a token budget, bf16 compute on
accelerators.

    from bertjax.embeddings import Embedder, load_sentence_encoder
    embedder = Embedder(load_sentence_encoder("model_dir"))  # bfloat16 on GPU/TPU; max_tokens: 2048 on CPU, else 16384
    vectors = embedder.embed(texts, prompt_name="document")        # float32 [len(texts), dim], input order

`SentenceEncoder.encode` runs one text per row (small jobs, parity tests); `Embedder` is the fast path: many texts
share a row (segment ids keep them apart, positions restart per text), rows take one of a few bucket shapes, and
every batch holds about `max_tokens` tokens. The backbone computes in `dtype`; pooling, Dense layers, truncation
and normalisation stay float32 (EncoderForEmbedding), and so do the outputs.

Long texts are truncated to the encoder's max_seq_length (sentence-transformers' behaviour) unless
`overflow="chunk"`: prompt + text are tokenised together as sentence-transformers does, and a text that fits is
embedded exactly as with truncation; a longer one is cut into chunks of max_seq_length tokens, neighbours sharing
`stride` tokens, each chunk embedded with the prompt's tokens in front, and the chunk embeddings averaged (then
re-normalised when the model normalises). Empty texts are embedded like any other ([CLS] [SEP]); the row count
always equals the input count.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

import numpy as np

from bertjax.embeddings.encoder import SentenceEncoder
from bertjax.inference.buckets import DEFAULT_LENGTHS, BucketConfig
from bertjax.inference.pipeline import SequenceFormat, supports_packing, to_sequences
from bertjax.inference.texts import TextInference, text_list, with_compute_dtype


@functools.lru_cache(maxsize=16)
def embedding_row_fn(model):
    """Row function (bertjax.inference.runner) of an EncoderForEmbedding: per slot, its embedding. Cached per
    model (modules hash by their fields), so every Embedder of an equal model shares compiled programs."""

    def row_fn(params, batch, max_segments):
        vectors = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"], max_segments,
                              batch.get("prompt_lengths"))
        return {"segments": {"embedding": vectors}}

    return row_fn


class Embedder:
    """Texts -> float32 embeddings of `encoder`, through one TextInference (compiled programs are reused across
    calls: `compiles` counts them).

    max_tokens: token budget of one batch (None: 2,048 on CPU, 16,384 on accelerators; buckets.default_max_tokens);
    lengths: bucket row lengths (the encoder's max_seq_length is added);
    max_segments: texts per packed row at most (1: no packing); dtype: compute dtype of the backbone ("auto":
    bfloat16 on GPU/TPU, float32 on CPU, where bfloat16 matmuls run slower; "bfloat16", "float32"; None keeps the
    encoder's); overflow / stride: "truncate" (default) or "chunk" with `stride` tokens
    shared by neighbouring chunks; mesh: a data mesh (default: every local device).
    """

    def __init__(self, encoder: SentenceEncoder, *, max_tokens: int | None = None,
                 lengths: Sequence[int] = DEFAULT_LENGTHS, max_segments: int = 32, dtype: str | None = "auto",
                 overflow: str = "truncate", stride: int = 0, mesh=None):
        # At construction, not at the first embed: the checks to_sequences makes of every batch.
        to_sequences([], SequenceFormat.for_tokenizer(encoder.tokenizer, encoder.max_seq_length), overflow, stride)
        self.encoder = encoder
        self.model = with_compute_dtype(encoder.model, dtype)
        self.overflow, self.stride = overflow, stride
        packing = supports_packing(encoder.config) and max_segments > 1
        buckets = BucketConfig(lengths=tuple(lengths), max_tokens=max_tokens,
                               max_segments=max_segments if packing else 1)
        self._buckets, self._mesh = buckets, mesh
        self._by_prompt: dict[str | None, TextInference] = {}
        self._params = None

    @property
    def dim(self) -> int:
        return self.encoder.dim

    @property
    def compiles(self) -> int:
        """XLA programs compiled by this Embedder so far (every prompt shares one runner)."""
        return next(iter(self._by_prompt.values())).compiles if self._by_prompt else 0

    def _inference(self, prompt: str | None) -> TextInference:
        if prompt not in self._by_prompt:
            encoder = self.encoder
            # [CLS] prompt + text [SEP]: the prompt is tokenised with the text (token_ids), chunks repeat its tokens.
            fmt = SequenceFormat.for_tokenizer(encoder.tokenizer, encoder.max_seq_length)
            inference = TextInference(embedding_row_fn(self.model), encoder.tokenizer, encoder.max_seq_length,
                                      buckets=self._buckets, packing=self._buckets.max_segments > 1,
                                      mesh=self._mesh, overflow=self.overflow, stride=self.stride,
                                      sequence_format=fmt, vocab_size=self.model.config.vocab_size)
            if self._by_prompt:  # share one compiled function: the programs depend on shapes only
                inference.runner = next(iter(self._by_prompt.values())).runner
            self._by_prompt[prompt] = inference
        return self._by_prompt[prompt]

    def _prompt_tokens(self, token_ids: Sequence[np.ndarray], prompt: str | None) -> list[int] | None:
        """Chunking: per text, how many of its leading tokens are the prompt's (None: no prompt, or truncation).

        The prompt's tokens inside prompt + text are those the prompt alone tokenises to, up to the first that
        differs: byte-level BPE tokenises "query: " alone with a trailing space token that, before a word, is
        part of the word's first token instead. That first text token, merged or not, belongs to the text."""
        if self.overflow != "chunk" or not prompt:
            return None
        alone = np.asarray(self.encoder.tokenize([prompt], truncate=False)[0][1:-1], np.int32)
        counts = []
        for ids in token_ids:
            shared = min(len(ids), len(alone))
            differs = np.flatnonzero(np.asarray(ids[:shared]) != alone[:shared])
            counts.append(int(differs[0]) if len(differs) else shared)
        return counts

    def _placed_params(self):
        if self._params is None:
            self._params = self._inference(None).runner.place_params(self.encoder.params)
        return self._params

    def _segment_inputs(self, prompt: str | None, count: int) -> dict[str, np.ndarray] | None:
        """Per-text inputs of the row function: prompt lengths, when pooling leaves the prompt out."""
        if self.encoder.pooling.include_prompt:
            return None
        return {"prompt_lengths": np.full(count, self.encoder.prompt_length(prompt), np.int32)}

    def warm_up(self, prompt_name: str | None = None, prompt: str | None = None,
                token_ids: Sequence[np.ndarray] | None = None) -> int:
        """Compile every program `embed` may need (TextInference.warm_up); returns how many were compiled.
        `token_ids` (`token_ids(texts)` of a known job): only the programs that job runs, for models with many
        buckets (8,192 positions: up to 24 programs) where compiling all would cost more than the job."""
        text_prompt = self.encoder.resolve_prompt(prompt_name, prompt)
        inference = self._inference(text_prompt)
        shapes = None if token_ids is None else inference.batch_shapes_of(
            token_ids, self._prompt_tokens(token_ids, text_prompt))
        return inference.warm_up(self._placed_params(), self._segment_inputs(text_prompt, 1), shapes)

    def token_ids(self, texts: Iterable[str], prompt: str | None = None) -> list[np.ndarray]:
        """Token ids per text without [CLS]/[SEP]: prompt + text as sentence-transformers tokenizes them (also when
        chunking, which finds the prompt's tokens at the start of each). `texts`: any iterable of strings."""
        texts = text_list(texts, "embed")  # once: a generator would be used up by the checks
        if prompt:
            texts = [prompt + text for text in texts]
        return [ids[1:-1] for ids in self.encoder.tokenize(texts, truncate=False)] if texts else []

    def embed(self, texts: Iterable[str], prompt_name: str | None = None, prompt: str | None = None) -> np.ndarray:
        """float32 numpy [len(texts), dim], in input order (prompts resolved as SentenceEncoder.encode does);
        `texts`: a list, or any iterable of strings (read once)."""
        text_prompt = self.encoder.resolve_prompt(prompt_name, prompt)
        return self.embed_token_ids(self.token_ids(texts, text_prompt), prompt=text_prompt)

    def embed_token_ids(self, token_ids: Sequence[np.ndarray], prompt_name: str | None = None,
                        prompt: str | None = None) -> np.ndarray:
        """As `embed`, for texts already tokenised by `token_ids(texts, prompt)` (with the same prompt): a corpus
        tokenised once and embedded again, or a benchmark that times the model apart from the tokenizer."""
        text_prompt = self.encoder.resolve_prompt(prompt_name, prompt)
        if not token_ids:
            return np.zeros((0, self.dim), np.float32)
        inference, params = self._inference(text_prompt), self._placed_params()
        segment_inputs = self._segment_inputs(text_prompt, len(token_ids))
        outputs = inference.run_tokens(params, token_ids, segment_inputs,
                                       self._prompt_tokens(token_ids, text_prompt))
        vectors = outputs.segments["embedding"].astype(np.float32)
        if self.overflow == "chunk" and self.encoder.pooling.normalize:
            # The mean of unit vectors is shorter than one; normalise again, as the model promises unit vectors.
            vectors /= np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
        if vectors.shape[0] != len(token_ids):  # the pipeline's promise; a failure here is a bug, not bad input
            raise AssertionError(f"{vectors.shape[0]} embeddings for {len(token_ids)} texts")
        return vectors
