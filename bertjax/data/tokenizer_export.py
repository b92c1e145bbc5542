"""Any bertjax tokenizer as the files transformers loads: tokenizer.json, tokenizer_config.json, special tokens.

    save_for_transformers(tokenizer, "hf_dir", model_max_length=512, model_input_names=["input_ids", ...])
    AutoTokenizer.from_pretrained("hf_dir")  # then encodes text to the same ids as `tokenizer.encode`

but for texts that spell a special token ("[SEP]"): a SentencePiece model bertjax trained holds its specials as
control symbols, which text never encodes to, while the export reads them as every transformers tokenizer does.

Every kind becomes one `tokenizers` JSON (registry `TO_TOKENIZERS_JSON`), with the special tokens registered as
added tokens (so "[MASK]" in a text is the mask token) and a post-processor that wraps texts in [CLS] ... [SEP]
as the bertjax data pipeline and fill-mask do:

- SentencePiece (the models bertjax trains, BPE or unigram, with byte fallback): the vocabulary and scores are
  read from the model proto; BPE merges are recovered from the vocabulary (a merge of two pieces ranks by the id
  of the piece it makes, which is SentencePiece's merge order); SentencePiece's normalisation (its precompiled
  character map, then whitespace stripping and collapsing) and its word-boundary marker are reproduced.
- tokenizer.json of a checkpoint: kept, with specials and post-processor added only where missing.
- WordPiece vocab.txt: the BERT pipeline bertjax already runs it with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from bertjax.data.tokenizers import (SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG, HuggingFaceTokenizer,
                                     SentencePieceTokenizer, Tokenizer, WordPieceTokenizer)

TOKENIZER_JSON = "tokenizer.json"
WORD_MARKER = "\u2581"  # SentencePiece's "▁": the piece starts a word

# sentencepiece_model.proto enums
_SP_UNIGRAM, _SP_BPE = 1, 2
_SP_NORMAL, _SP_UNKNOWN, _SP_CONTROL, _SP_USER_DEFINED, _SP_UNUSED, _SP_BYTE = 1, 2, 3, 4, 5, 6
# Score given to pieces SentencePiece never matches in text (control, unused, byte) so unigram's search avoids them.
_NEVER_MATCHED = -1e9


def _sentencepiece_json(tokenizer: SentencePieceTokenizer) -> str:
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Regex, Tokenizer as HfTokenizer, decoders, models, normalizers, pre_tokenizers

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tokenizer._proto)
    pieces = [(p.piece, p.score, p.type) for p in proto.pieces]
    byte_fallback = proto.trainer_spec.byte_fallback
    unk_id = next(i for i, (_, _, kind) in enumerate(pieces) if kind == _SP_UNKNOWN)
    model_type = proto.trainer_spec.model_type
    if model_type == _SP_UNIGRAM:
        vocab = [(piece, score if kind in (_SP_NORMAL, _SP_USER_DEFINED, _SP_UNKNOWN) else _NEVER_MATCHED)
                 for piece, score, kind in pieces]
        model = models.Unigram(vocab, unk_id=unk_id, byte_fallback=byte_fallback)
    elif model_type == _SP_BPE:
        ids = {piece: i for i, (piece, _, _) in enumerate(pieces)}
        mergeable = {piece: i for i, (piece, _, kind) in enumerate(pieces) if kind in (_SP_NORMAL, _SP_USER_DEFINED)}
        merges = sorted((i, mergeable[piece[:k]], mergeable[piece[k:]], piece[:k], piece[k:])
                        for piece, i in mergeable.items() for k in range(1, len(piece))
                        if piece[:k] in mergeable and piece[k:] in mergeable)
        model = models.BPE(ids, [(left, right) for *_, left, right in merges], unk_token=pieces[unk_id][0],
                           byte_fallback=byte_fallback, fuse_unk=True)
    else:
        raise ValueError(f"SentencePiece model type {model_type} (word/char) cannot be exported for transformers; "
                         "bertjax trains bpe or unigram models")

    hf = HfTokenizer(model)
    spec = proto.normalizer_spec
    steps = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    if steps:
        hf.normalizer = normalizers.Sequence(steps)
    prepend = "always" if spec.add_dummy_prefix else "never"
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=WORD_MARKER, prepend_scheme=prepend, split=True)
    decode_steps = [decoders.Replace(WORD_MARKER, " ")]
    if byte_fallback:
        decode_steps.append(decoders.ByteFallback())
    decode_steps.append(decoders.Fuse())
    if spec.add_dummy_prefix:
        decode_steps.append(decoders.Strip(content=" ", left=1, right=0))
    hf.decoder = decoders.Sequence(decode_steps)
    return hf.to_str()


def _tokenizers_json(tokenizer: HuggingFaceTokenizer) -> str:
    return tokenizer._json


# Tokenizer class -> its `tokenizers` JSON (before specials and post-processor). Add a line to add a kind.
TO_TOKENIZERS_JSON: dict[type, Callable[[Tokenizer], str]] = {
    SentencePieceTokenizer: _sentencepiece_json,
    WordPieceTokenizer: _tokenizers_json,  # built from vocab.txt with BERT's normaliser and pre-tokeniser
    HuggingFaceTokenizer: _tokenizers_json,
}


def special_tokens(tokenizer: Tokenizer, hf) -> dict[str, str]:
    """{"cls_token": "[CLS]", ...}: the text of each special token (in `hf`, its `tokenizers` form), by
    transformers' attribute names (no unk_token for a vocabulary without one)."""
    ids = {"cls_token": tokenizer.cls_id, "sep_token": tokenizer.sep_id, "mask_token": tokenizer.mask_id,
           "pad_token": tokenizer.pad_id, "unk_token": tokenizer.unk_id}
    return {name: hf.id_to_token(i) for name, i in ids.items() if i is not None}


def to_hf_tokenizer(tokenizer: Tokenizer):
    """The `tokenizers.Tokenizer` that encodes like `tokenizer` and wraps texts in [CLS] ... [SEP]."""
    from tokenizers import AddedToken, Tokenizer as HfTokenizer, processors

    convert = next((fn for cls, fn in TO_TOKENIZERS_JSON.items() if type(tokenizer) is cls), None)
    if convert is None:
        raise ValueError(f"no transformers export for {type(tokenizer).__name__}; known: "
                         f"{[cls.__name__ for cls in TO_TOKENIZERS_JSON]}")
    hf = HfTokenizer.from_str(convert(tokenizer))
    names = special_tokens(tokenizer, hf)
    registered = {token.content for token in hf.get_added_tokens_decoder().values() if token.special}
    # The mask takes the space before it (as in "The [MASK] ..."), as bertjax's fill-mask does.
    hf.add_special_tokens([AddedToken(text, special=True, normalized=False, lstrip=(name == "mask_token"))
                           for name, text in names.items() if text not in registered])
    if hf.post_processor is None:
        cls, sep = names["cls_token"], names["sep_token"]
        hf.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, tokenizer.cls_id), (sep, tokenizer.sep_id)])
    return hf


def save_for_transformers(tokenizer: Tokenizer, directory: str | Path, *, model_max_length: int | None = None,
                          model_input_names: Sequence[str] | None = None,
                          padding_side: str | None = None) -> list[str]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json; returns the file names.

    `model_input_names` says which encodings the model takes (ModernBERT has no token_type_ids: transformers'
    pipelines pass every encoding the tokenizer returns to the model).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf = to_hf_tokenizer(tokenizer)
    (directory / TOKENIZER_JSON).write_text(_with_portable_merges(hf.to_str(pretty=True)), encoding="utf-8")
    names = special_tokens(tokenizer, hf)
    # A checkpoint's own class and options (RobertaTokenizer, add_prefix_space, ...) when it came with them.
    kept = {key: _tagged_added_token(value) for key, value in getattr(tokenizer, "transformers_config", {}).items()}
    side = {"padding_side": padding_side} if padding_side else _padding_side(tokenizer)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **side, **kept, **names,
              "clean_up_tokenization_spaces": False}
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    if model_input_names is not None:
        config["model_input_names"] = list(model_input_names)
    if isinstance(tokenizer, WordPieceTokenizer):
        config["do_lower_case"] = tokenizer._lowercase
    (directory / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=1) + "\n")
    (directory / SPECIAL_TOKENS_MAP).write_text(json.dumps(names, indent=1) + "\n")
    return [TOKENIZER_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP]


def _with_portable_merges(tokenizer_json: str) -> str:
    """BPE merges as "left right" strings, which every `tokenizers` release reads; releases since 0.20 write
    [left, right] pairs, which those before (transformers <= 4.44) refuse. A pair whose parts hold a space has no
    string form, and the file then keeps the pairs."""
    described = json.loads(tokenizer_json)
    model = described.get("model") or {}
    merges = model.get("merges")
    if model.get("type") != "BPE" or not merges or not all(isinstance(m, list) for m in merges):
        return tokenizer_json
    if any(" " in part for merge in merges for part in merge):
        return tokenizer_json
    model["merges"] = [" ".join(merge) for merge in merges]
    return json.dumps(described, indent=2, ensure_ascii=False)


def _tagged_added_token(value):
    """A special token saved by transformers 4 as a bare {"content": ...} dict (special_tokens_map.json) carries the
    "__type" tag transformers 4 needs to read it back in tokenizer_config.json (5 reads either)."""
    if isinstance(value, dict) and "content" in value and "__type" not in value:
        return {"__type": "AddedToken", **value}
    return value


def _padding_side(tokenizer: Tokenizer) -> dict[str, str]:
    """Left padding for a layout that ends with its [CLS] (XLNet's `A <sep> <cls>`), as XLNetTokenizer pads:
    transformers' heads of such models read the last position. (A checkpoint's own padding_side wins.)"""
    return {"padding_side": "left"} if tokenizer.special_template.ends_with(tokenizer.cls_id) else {}


def save_for_model(tokenizer: Tokenizer, directory: str | Path, config) -> list[str]:
    """`save_for_transformers` with what a model's EncoderConfig says: the longest input (its positions, past
    RoBERTa's offset), the encodings it takes (no token_type_ids with fewer than two token types: RoBERTa's one
    type would index past its table at a pair's type 1) and, for XLNet, left padding (its heads read the last
    position, whatever the tokenizer's layout)."""
    names = ["input_ids", "token_type_ids", "attention_mask"] if config.type_vocab_size > 1 else \
        ["input_ids", "attention_mask"]
    return save_for_transformers(tokenizer, directory,
                                 model_max_length=config.max_position_embeddings - config.position_offset,
                                 model_input_names=names, padding_side="left" if config.family == "xlnet" else None)
