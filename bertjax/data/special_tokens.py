"""Which token of a vocabulary plays which role: cls, sep, mask, pad and unk.

In order: the token a checkpoint's tokenizer_config.json (or special_tokens_map.json) names for the role, as
transformers reads them (`cls_token`, or `bos_token` for an encoder without one: EuroBERT's `<|begin_of_text|>`);
the token the tokenizer's own layout puts there (its post-processor: XLNet's `A <sep> <cls>`); else the first of
the usual names the vocabulary has. Only unk may be missing (byte-level BPE encodes every text without it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from bertjax.data.special_template import TEXT

# Names the special tokens go by across checkpoints, in order of preference, for tokenizers whose files do not
# name them (a bare tokenizer.json, vocab.txt or SentencePiece model).
SPECIAL_TOKEN_NAMES: dict[str, tuple[str, ...]] = {
    # XLNet's vocabulary has <s> and </s> too, but its texts end in <sep> <cls>.
    "cls": ("[CLS]", "<cls>", "<s>", "<|begin_of_text|>"),
    "sep": ("[SEP]", "<sep>", "</s>", "<|end_of_text|>"),
    "mask": ("[MASK]", "<mask>", "<|mask|>"),
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
}
# The tokenizer_config.json keys that name each role, in transformers' order: an encoder whose tokenizer has no
# cls/sep (EuroBERT's Llama-3 vocabulary) starts and ends its texts with bos/eos.
SPECIAL_TOKEN_KEYS: dict[str, tuple[str, ...]] = {
    "cls": ("cls_token", "bos_token"),
    "sep": ("sep_token", "eos_token"),
    "mask": ("mask_token",),
    "pad": ("pad_token",),
    "unk": ("unk_token",),
}
OPTIONAL_SPECIALS = ("unk",)  # byte-level vocabularies encode every text without an unknown token


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    cls: int
    sep: int
    mask: int
    pad: int
    unk: int | None


def find_specials(lookup: Callable[[str], int | None], source: str, declared: dict[str, str],
                   laid_out: dict[str, int] | None = None) -> SpecialIds:
    """Each role's id: the token `declared` (a tokenizer_config.json) names for it, else the one the tokenizer's
    own layout puts there (`laid_out`, `layout_roles`), else the first of the usual names the vocabulary has."""
    found = {}
    for role, names in SPECIAL_TOKEN_NAMES.items():
        key = next((key for key in SPECIAL_TOKEN_KEYS[role] if key in declared), None)
        if key is not None:
            found[role] = lookup(declared[key])
            if found[role] is None or found[role] < 0:
                raise ValueError(f"tokenizer {source}: its tokenizer_config.json names {key} {declared[key]!r}, "
                                 "which the vocabulary does not have")
            continue
        if laid_out and role in laid_out:
            found[role] = laid_out[role]
            continue
        ids = [lookup(name) for name in names]
        ids = [i for i in ids if i is not None and i >= 0]
        if not ids and role not in OPTIONAL_SPECIALS:
            hint = "" if declared else f"; or name it as {SPECIAL_TOKEN_KEYS[role][0]} in tokenizer_config.json"
            raise ValueError(f"tokenizer {source} has no {role} token (looked for {', '.join(names)}{hint})")
        found[role] = ids[0] if ids else None
    return SpecialIds(**found)


def layout_roles(template) -> dict[str, int]:
    """cls and sep as a post-processor's single-text layout places them: cls first (BERT's [CLS], RoBERTa's <s>)
    or, after the text, last (XLNet's `A <sep> <cls>`); sep right after the text. {} without a layout."""
    if template is None:
        return {}
    items = template.single
    text = next(i for i, item in enumerate(items) if item.token == TEXT)
    roles = {}
    if text > 0:
        roles["cls"] = items[0].token
    elif len(items) > 1:
        roles["cls"] = items[-1].token
    if text + 1 < len(items) and items[text + 1].token != roles.get("cls"):
        roles["sep"] = items[text + 1].token
    return roles


def declared_special_tokens(config: dict) -> dict[str, str]:
    """The special tokens a tokenizer_config.json names ({"cls_token": "[CLS]", ...}); a token may be written as
    text or as transformers' AddedToken dict."""
    declared = {}
    for key in {key for keys in SPECIAL_TOKEN_KEYS.values() for key in keys}:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str) and value:
            declared[key] = value
    return declared
