"""A loaded sentence-embedding model: the Flax model, its parameters, the tokenizer and sentence-transformers'
settings (maximum length, lower-casing, prompts), with one pure function for jitted inference on packed rows.

    encoder = load_sentence_encoder("all-MiniLM-L6-v2/")     # bertjax.embeddings
    encoder.encode(["a sentence", "another"])                 # float32 [2, dim], as SentenceTransformer.encode

    ids = encoder.tokenize(["query: a", "query: b"])          # token ids with [CLS]/[SEP], truncated
    embed = jax.jit(encoder.embed_rows, static_argnames="max_segments")
    embed(encoder.params, input_ids, segment_ids, max_segments=8)   # float32 [batch, 8, dim]

`encode` runs one text per row and is meant for small jobs and tests; the inference layer packs many texts per
row through `embed_rows` and `tokenize`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.embeddings.config import DenseConfig, PoolingConfig
from bertjax.embeddings.model import EncoderForEmbedding
from bertjax.embeddings.similarity import SIMILARITY_FUNCTIONS
from bertjax.inference.texts import check_tokenizer_fits, text_list

_MIN_PAD_LENGTH = 8  # `encode` pads rows to a power of two from here: few compiled shapes


# One compiled program per (model, shapes), shared by every encoder with an equal model (Flax modules hash by
# their fields): reloading a model, or a copy with the same settings, compiles nothing new.
@functools.partial(jax.jit, static_argnames=("model", "max_segments"))
def _embed_rows_jit(model, params, input_ids, segment_ids, max_segments, prompt_lengths):
    return model.apply({"params": params}, input_ids, segment_ids, max_segments, prompt_lengths)


def check_single_text_layout(tokenizer, where: str) -> None:
    """Texts are embedded as [CLS] text [SEP] (the tokenizer's cls and sep ids), all of token type 0: the layout
    of BERT, RoBERTa, ModernBERT, DeBERTa and the other families' tokenizers. A tokenizer.json whose post-processor
    lays a text out otherwise (XLNet's `text <sep> <cls>`, its <cls> of token type 2) would be embedded in a layout
    its model never saw, and differ from sentence-transformers' embeddings without a sign: refused instead."""
    from bertjax.data.special_template import TEXT

    items = tokenizer.special_template.single
    expected = (tokenizer.cls_id, TEXT, tokenizer.sep_id)
    if tuple(item.token for item in items) != expected or any(item.type_id for item in items):
        raise ValueError(f"{where}: the tokenizer lays a text out as {tokenizer.special_template.describe()}; "
                         f"sentence embeddings are computed on [CLS] text [SEP] (ids {tokenizer.cls_id} and "
                         f"{tokenizer.sep_id}) of token type 0, which this model's tokenizer does not build "
                         "(XLNet's text <sep> <cls>): not supported")


@dataclasses.dataclass(frozen=True, eq=False)
class SentenceEncoder:
    """Everything needed to turn texts into sentence embeddings the way sentence-transformers does.

    model: the EncoderForEmbedding (EncoderConfig, PoolingConfig, Dense layers); params: its parameter pytree.
    max_seq_length: texts are truncated to this many tokens, [CLS] and [SEP] included.
    do_lower_case: lower-case texts (and prompts) before tokenizing (sentence-transformers' Transformer option).
    prompts: name -> text prepended to the input ("query" -> "query: "); default_prompt_name: the prompt used
    when a call names none. similarity_fn_name: how the model's embeddings are meant to be compared.
    """

    model: EncoderForEmbedding
    params: dict
    tokenizer: object  # a bertjax.data Tokenizer
    max_seq_length: int
    do_lower_case: bool = False
    prompts: Mapping[str, str] = dataclasses.field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity_fn_name: str = "cosine"

    def __post_init__(self) -> None:
        if not isinstance(self.model, EncoderForEmbedding):
            raise TypeError(f"SentenceEncoder.model must be an EncoderForEmbedding, got {type(self.model).__name__}")
        if self.tokenizer is None:
            raise ValueError("SentenceEncoder needs a tokenizer (the model directory holds none)")
        config = self.model.config
        check_tokenizer_fits(self.tokenizer, config, "SentenceEncoder")  # load_sentence_encoder names the directory
        check_single_text_layout(self.tokenizer, "SentenceEncoder")
        limit = config.max_position_embeddings - config.position_offset
        if not 2 <= self.max_seq_length <= limit:
            raise ValueError(f"SentenceEncoder.max_seq_length must be in [2, {limit}] (the model's positions), "
                             f"got {self.max_seq_length}")
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ValueError(f"default_prompt_name {self.default_prompt_name!r} is not one of the prompts "
                             f"{sorted(self.prompts)}")
        if self.similarity_fn_name not in SIMILARITY_FUNCTIONS:
            raise ValueError(f"similarity_fn_name must be one of {tuple(SIMILARITY_FUNCTIONS)}, got "
                             f"{self.similarity_fn_name!r}")
        truncate = self.pooling.truncate_dim
        if truncate is not None and truncate > self.full_dim:
            raise ValueError(f"PoolingConfig.truncate_dim={truncate} exceeds the embedding size {self.full_dim}")

    # ---------------------------------------------------------------------------------------------------------
    # Settings.

    @property
    def config(self):
        """The backbone's EncoderConfig."""
        return self.model.config

    @property
    def pooling(self) -> PoolingConfig:
        return self.model.pooling

    @property
    def dense(self) -> tuple[DenseConfig, ...]:
        return self.model.dense

    @property
    def full_dim(self) -> int:
        """Size of the embedding before Matryoshka truncation."""
        if self.dense:
            return self.dense[-1].out_features
        return len(self.pooling.modes) * self.config.hidden_size

    @property
    def dim(self) -> int:
        """Size of the embeddings this encoder returns."""
        return self.pooling.truncate_dim or self.full_dim

    def replace(self, **changes) -> "SentenceEncoder":
        """A copy with fields replaced; `pooling=` / `dense=` rebuild the model (same parameters)."""
        model_changes = {k: changes.pop(k) for k in ("pooling", "dense") if k in changes}
        if model_changes:
            changes["model"] = self.model.clone(**model_changes)
        return dataclasses.replace(self, **changes)

    def similarity(self, a, b) -> jax.Array:
        """float32 [n, m] similarity of embeddings a [n, dim] and b [m, dim] by the model's similarity_fn_name
        (sentence-transformers' `similarity`). Pure: jit it for large matrices."""
        return SIMILARITY_FUNCTIONS[self.similarity_fn_name](a, b)

    # ---------------------------------------------------------------------------------------------------------
    # Text -> tokens.

    def resolve_prompt(self, prompt_name: str | None = None, prompt: str | None = None) -> str | None:
        """The prompt text a call uses, as sentence-transformers resolves it: `prompt` wins, then `prompt_name`,
        then the default prompt."""
        if prompt is not None:
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                raise ValueError(f"prompt name {prompt_name!r} is not one of the model's prompts "
                                 f"{sorted(self.prompts)}")
            return self.prompts[prompt_name]
        if self.default_prompt_name is not None:
            return self.prompts[self.default_prompt_name]
        return None

    def _ids(self, texts: Sequence[str], truncate: bool = True) -> list[np.ndarray]:
        if self.do_lower_case:
            # The `tokenizers` library's lowercasing, as sentence-transformers 6 adds it to the tokenizer: character
            # by character, where str.lower() makes a word-final Σ the final-form ς and so another token.
            from tokenizers.normalizers import Lowercase

            texts = [Lowercase().normalize_str(t) for t in texts]
        cls, sep = np.array([self.tokenizer.cls_id], np.int32), np.array([self.tokenizer.sep_id], np.int32)
        body = self.max_seq_length - 2 if truncate else None
        return [np.concatenate([cls, ids[:body], sep]) for ids in self.tokenizer.encode_batch(list(texts))]

    def tokenize(self, texts: Sequence[str], prompt: str | None = None, truncate: bool = True) -> list[np.ndarray]:
        """int32 token ids per text: [CLS] prompt + text [SEP], truncated to max_seq_length (the prompt is part of
        the text, as in sentence-transformers, so it counts against the length). `truncate=False` keeps every
        token (for callers that split long texts into chunks)."""
        texts = text_list(texts, "tokenize")
        if prompt:
            texts = [prompt + text for text in texts]
        return self._ids(texts, truncate)

    def prompt_length(self, prompt: str | None) -> int:
        """Tokens the prompt occupies at the start of a tokenized text: [CLS] and the prompt's own tokens (0 for no
        prompt). Pooling leaves them out when `pooling.include_prompt` is False."""
        if not prompt:
            return 0
        return len(self._ids([prompt])[0]) - 1  # without the trailing [SEP], as sentence-transformers counts

    # ---------------------------------------------------------------------------------------------------------
    # Tokens -> vectors.

    def embed_rows(self, params, input_ids, segment_ids, max_segments: int, prompt_lengths=None) -> jax.Array:
        """Pure and jit-able: float32 [batch, max_segments, dim], slot k the text of segment id k + 1.

        input_ids, segment_ids: int [batch, seq]; each text a run of one segment id (1..max_segments), 0 marks
        padding. prompt_lengths: None, an int, or int [batch, max_segments] (`prompt_length` of each text's prompt;
        used only when the pooling excludes prompts). Empty slots hold zeros.
        """
        return self.model.apply({"params": params}, input_ids, segment_ids, max_segments, prompt_lengths)

    def encode(self, texts: Sequence[str], prompt_name: str | None = None, prompt: str | None = None,
               batch_size: int = 32) -> np.ndarray:
        """float32 numpy [len(texts), dim]: sentence-transformers' `encode(texts, prompt_name=, prompt=)`.

        One text per row, rows sorted by length; lengths and row counts padded to powers of two (few compiled
        shapes). An empty text is embedded like any other ([CLS] [SEP]).
        """
        texts = text_list(texts, "encode")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        text_prompt = self.resolve_prompt(prompt_name, prompt)
        tokens = self.tokenize(texts, text_prompt)
        prompt_length = self.prompt_length(text_prompt)
        out = np.zeros((len(tokens), self.dim), np.float32)
        order = np.argsort([-len(t) for t in tokens], kind="stable")
        for start in range(0, len(order), batch_size):
            chosen = order[start:start + batch_size]
            longest = max(len(tokens[i]) for i in chosen)
            seq = min(max(_MIN_PAD_LENGTH, 1 << (longest - 1).bit_length()), self.max_seq_length)
            rows = min(batch_size, 1 << (len(chosen) - 1).bit_length())
            input_ids = np.full((rows, seq), self.config.pad_token_id, np.int32)
            segment_ids = np.zeros((rows, seq), np.int32)
            for row, i in enumerate(chosen):
                input_ids[row, :len(tokens[i])] = tokens[i]
                segment_ids[row, :len(tokens[i])] = 1
            vectors = _embed_rows_jit(self.model, self.params, jnp.asarray(input_ids), jnp.asarray(segment_ids),
                                      max_segments=1, prompt_lengths=prompt_length)
            out[chosen] = np.asarray(vectors)[:len(chosen), 0]  # sliced on the host: no eager program per size
        return out
