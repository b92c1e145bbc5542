"""Fill-mask prediction: the most likely tokens at each [MASK] of a text, from a masked language model.

`load_predictor(DIR)` reads any directory `bertjax.model_dirs.load_model_dir` reads (a pretraining workdir, a
Hugging Face checkpoint, a bertjax model directory); `make_predictor` takes a model, its parameters and tokenizer.
Texts run packed through `bertjax.inference`, as `embed` does. The `bertjax fill-mask` command prints them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.ops.masks import flagged_first, scatter_slots

# Mask spellings accepted in the text, whatever the tokenizer's own mask token is (EuroBERT's is <|mask|>).
MASK_PATTERN = re.compile(r"\[MASK\]|<mask>|<\|mask\|>")

# Heads (keys of bertjax.models.MODEL_CLASSES) whose `logits` score the vocabulary at every token. Other heads'
# `logits` are per label or per sequence (or absent, on a bare encoder): fed to the softmax they crash or mislead.
MLM_HEADS = ("masked_lm", "pretraining")


@dataclass(frozen=True)
class Prediction:
    token: str
    token_id: int
    probability: float


def encode_with_masks(tokenizer, text: str) -> tuple[np.ndarray, np.ndarray]:
    """(the row of `text` with the mask id at each [MASK], laid out as the tokenizer lays out one text, e.g.
    `[CLS] text [SEP]`; positions of the masks)."""
    pieces = MASK_PATTERN.split(text)
    if len(pieces) < 2:
        raise ValueError(f"no [MASK] in {text!r}")
    ids = []
    masks = []
    absorbs_space = tokenizer.mask_takes_space_before
    for i, piece in enumerate(pieces):
        # The mask absorbs the space before it where its token says so (RoBERTa's <mask>: lstrip), as transformers'
        # tokenizer does; the space after it stays with the next word, which byte-level BPE needs to pick the
        # word-initial token.
        if i < len(pieces) - 1 and absorbs_space:
            piece = piece.rstrip()
        if piece:  # whitespace after the last mask stays a token, as transformers keeps it
            ids.extend(int(t) for t in tokenizer.encode(piece))
        if i < len(pieces) - 1:
            masks.append(len(ids))
            ids.append(tokenizer.mask_id)
    template = tokenizer.special_template
    row, _ = template.build(ids)
    start = template.text_start(0, len(ids), pair=False)
    return np.asarray(row, np.int32), np.asarray(masks, np.int32) + start


@functools.lru_cache(maxsize=16)
def fill_mask_row_fn(model, special_ids: tuple[int, ...], tokenizer_size: int, top_k: int, mask_id: int,
                     mask_slots: int, query_stream: bool = False):
    """Row function (bertjax.inference.runner) of a masked language model: at each [MASK] (`mask_id`), the top_k
    token ids and their probabilities (the special tokens and the rows from `tokenizer_size` on, beyond the
    tokenizer's vocabulary, banned), float32; zeros at the other tokens. The MLM head projects only the first
    `mask_slots` masks of a row onto the vocabulary (the caller's bound on masks per row): that projection, not
    the encoder, is most of the cost at every token. `query_stream` (XLNet pretrained as a permutation LM): predict
    through the query stream, as it was trained: no token sees a mask's content (`perm_mask`) and a query slot reads
    each mask's position (`target_mapping`), the use of XLNetLMHeadModel transformers documents. Cached on hashable
    arguments: predictors of an equal model share programs."""
    type_vocab_size = model.config.type_vocab_size
    if query_stream and model.config.attention_kind != "two_stream":
        raise ValueError(f"query_stream: the model has no query stream (attention_kind "
                         f"{model.config.attention_kind!r}; XLNet's is 'two_stream')")
    banned = np.zeros(model.config.vocab_size, bool)
    banned[[i for i in special_ids if i < model.config.vocab_size]] = True
    banned[tokenizer_size:] = True  # padding rows of an embedding larger than the vocabulary

    def row_fn(params, batch, max_segments):
        ids = batch["input_ids"]
        is_mask = (ids == mask_id) & (batch["segment_ids"] != 0)
        positions, valid = flagged_first(is_mask, mask_slots)
        # The layout's token types where the batch has them (XLNet's <cls> has its own), else all 0.
        types = batch.get("token_type_ids")
        if types is None and query_stream:  # XLNet's <cls> is of type 2: zeros would be a layout it never saw
            raise ValueError("fill_mask_row_fn(query_stream=True): the batch needs the layout's token_type_ids")
        kwargs = {"token_type_ids": jnp.zeros_like(ids) if types is None else types} if type_vocab_size else {}
        if query_stream:
            kwargs["perm_mask"] = jnp.broadcast_to(is_mask[:, None, :], (*ids.shape, ids.shape[1])).astype(jnp.float32)
            kwargs["target_mapping"] = jax.nn.one_hot(positions, ids.shape[1]) * valid[..., None]
        else:
            kwargs["masked_positions"] = positions
        logits = model.apply({"params": params}, ids, segment_ids=batch["segment_ids"], **kwargs).logits
        probs = jax.nn.softmax(jnp.where(jnp.asarray(banned), -jnp.inf, logits.astype(jnp.float32)), axis=-1)
        top_probs, top_ids = jax.lax.top_k(probs, top_k)
        # Back to per-token outputs, zeros at the tokens that are no mask.
        per_token = lambda values: scatter_slots(jnp.zeros((*ids.shape, top_k), values.dtype), positions, valid,
                                                 values)  # noqa: E731
        return {"tokens": {"top_ids": per_token(top_ids), "top_probs": per_token(top_probs)}}

    return row_fn


def check_masked_lm(model, source: str | None = None, elsewhere: str = "") -> None:
    """Refuse a model without an MLM head before anything is compiled: its outputs would fail deep in JAX (a bare
    encoder has no `logits`) or broadcast into nonsense (a classifier's logits are per label).
    `source` (e.g. "--model DIR") names where the model came from in the error, `elsewhere` where a masked
    language model of the same run is."""
    from bertjax.hf.pretrained import head_of
    from bertjax.models import MODEL_CLASSES

    if isinstance(model, tuple(MODEL_CLASSES[head] for head in MLM_HEADS)):
        return
    try:
        head = head_of(model)
    except ValueError:  # not one of bertjax's classes: its class name is all there is to say
        head = "non-bertjax"
    held = f"{'an' if head[0] in 'aeiou' else 'a'} {head} model ({type(model).__name__})"
    said = f"{source} holds {held}" if source else f"the model is {held}"
    raise ValueError(f"{said}, not a masked language model; fill-mask needs one with an MLM head "
                     f"(heads {', '.join(MLM_HEADS)}), "
                     f"{elsewhere or 'e.g. an MLM pretraining workdir or a *ForMaskedLM checkpoint'}")


def make_predictor(model, params, tokenizer, *, max_tokens: int | None = None,
                   query_stream: bool | None = None) -> Callable[[str, int], list[list[Prediction]]]:
    """`predict(text, top_k)`: for each [MASK] of `text`, the top_k tokens and their probabilities.
    `predict.many(texts, top_k)` does a list of texts in packed batches (bertjax.inference, as `embed`).
    A model without an MLM head is a ValueError. `query_stream`: predict through XLNet's query stream (None: where
    the model has one, as every XLNet pretrained as a permutation LM; False for one trained by the `mlm` objective,
    whose query stream never learned)."""
    from bertjax.inference import BucketConfig, TextInference, model_max_length, supports_packing
    from bertjax.models.inputs import check_ids

    check_masked_lm(model)
    config = model.config
    query_stream = config.attention_kind == "two_stream" if query_stream is None else query_stream
    template = tokenizer.special_template
    special_ids = tuple(sorted(int(i) for i in tokenizer.special_ids))
    if all(i in special_ids for i in range(min(tokenizer.vocab_size, config.vocab_size))):
        # Every candidate banned: the softmax would be NaN, and the error would blame the dtype.
        raise ValueError(f"the tokenizer's {tokenizer.vocab_size} tokens are all special tokens ({list(special_ids)}): "
                         "there is no word for fill-mask to propose; is this the tokenizer the model was trained with?")
    max_length = model_max_length(config)
    packing = supports_packing(config)
    buckets = BucketConfig(max_tokens=max_tokens, max_segments=16 if packing else 1)
    by_k: dict[tuple[int, int], TextInference] = {}
    placed = []

    def many(texts: list[str], top_k: int = 5) -> list[list[list[Prediction]]]:
        if top_k <= 0:
            raise ValueError(f"top_k must be positive, got {top_k}")
        if not texts:  # as `Embedder.embed([])`: nothing to run, nothing compiled
            return []
        encoded = [encode_with_masks(tokenizer, text) for text in texts]
        for text, (ids, _) in zip(texts, encoded):
            if len(ids) > max_length:
                raise ValueError(f"text is {len(ids)} tokens; the model takes at most {max_length}: {text[:60]!r}")
            check_ids(ids, config.vocab_size, "token ids")  # a tokenizer larger than the model's vocabulary
        # Spare candidates (pieces that decode to nothing are skipped), rounded up to a power of two: a service
        # passing each request's top_k compiles a few programs, not one set per value.
        k = min(max(16, 1 << (top_k + 8 - 1).bit_length()), config.vocab_size)
        # A row holds at most max_segments texts, so at most that many times the most masks a text has (rounded up
        # to a power of two, so that few programs compile).
        most = max(int(np.sum(ids == tokenizer.mask_id)) for ids, _ in encoded)
        slots = min(buckets.max_segments * (1 << (most - 1).bit_length()), max_length)
        if (k, slots) not in by_k:
            row_fn = fill_mask_row_fn(model, special_ids, tokenizer.vocab_size, k, tokenizer.mask_id, slots,
                                      query_stream)
            by_k[k, slots] = TextInference(row_fn, tokenizer, max_length, buckets=buckets, packing=packing,
                                           vocab_size=config.vocab_size)
        inference = by_k[k, slots]
        if not placed:
            placed.append(inference.runner.place_params(params))
        # The layout's token types (XLNet's <cls> has its own), the text's tokens being all of one type.
        specials = template.specials(pair=False)
        types = [np.asarray(template.build([0] * (len(ids) - specials))[1], np.int32) for ids, _ in encoded]
        outputs = inference.run_sequences(placed[0], [ids for ids, _ in encoded],
                                          token_inputs={"token_type_ids": types})
        for text, (_, masks), top_probs in zip(texts, encoded, outputs.tokens["top_probs"]):
            if not np.isfinite(top_probs[list(masks)]).all():  # else read as "no candidate decodes to text"
                raise ValueError(f"the model's outputs are not finite (NaN or infinity) for {text[:60]!r}; it computes "
                                 f"in {config.dtype}: a float16 model can overflow where float32 does not")
        results = []
        for (_, masks), top_ids, top_probs in zip(encoded, outputs.tokens["top_ids"], outputs.tokens["top_probs"]):
            per_mask = []
            for position in masks:
                options = []
                for t, p in zip(top_ids[position], top_probs[position]):
                    if p == 0.0:
                        break
                    token = tokenizer.decode([int(t)]).strip()
                    if token:  # pieces that decode to nothing (a lone word-boundary marker) say nothing to a reader
                        options.append(Prediction(token, int(t), float(p)))
                per_mask.append(options[:top_k])
            results.append(per_mask)
        return results

    def predict(text: str, top_k: int = 5) -> list[list[Prediction]]:
        return many([text], top_k)[0]

    predict.many = many
    return predict


def load_predictor(model_dir: str | Path, step: int | None = None,
                   allow_pickle: bool = False) -> Callable[[str, int], list[list[Prediction]]]:
    from bertjax.inference.texts import check_tokenizer_fits
    from bertjax.model_dirs import EXPORTS_DIR, load_model_dir, trained_objective

    model, params, tokenizer = load_model_dir(model_dir, step=step, allow_pickle=allow_pickle)
    # An ELECTRA workdir reads as its discriminator; the run's masked language model is its generator export.
    generator = Path(model_dir) / EXPORTS_DIR / "generator"
    check_masked_lm(model, f"--model {model_dir}",  # first: with the wrong model a tokenizer would not help
                    f"such as this run's generator: --model {generator}" if generator.is_dir() else "")
    if tokenizer is None:
        raise FileNotFoundError(f"--model {model_dir}: no tokenizer in the directory (tokenizer.json, *.model, "
                                "vocab.txt or vocab.json + merges.txt); copy the checkpoint's tokenizer files next "
                                "to its weights")
    check_tokenizer_fits(tokenizer, model.config, f"--model {model_dir}")  # before any text: ids past the table
    objective = trained_objective(model_dir)  # a pretraining workdir's; None for a model directory
    return make_predictor(model, params, tokenizer,
                          query_stream=None if objective is None else objective == "permutation_lm")


def format_predictions(text: str, predictions: list[list[Prediction]]) -> str:
    """The text with each [MASK] filled by its best guess, then the top-k list per mask. A mask whose candidates
    all decode to nothing (control or word-boundary pieces, as an untrained model may rank first) stays [MASK]."""
    best = iter(options[0].token if options else "MASK" for options in predictions)
    filled = MASK_PATTERN.sub(lambda _: f"[{next(best)}]", text)
    lines = [filled]
    for i, options in enumerate(predictions):
        shown = ", ".join(f"{p.token!r} {p.probability:.3f}" for p in options) or \
            "no candidate among the top ones decodes to text"
        lines.append(f"  mask {i + 1}: {shown}")
    return "\n".join(lines)
