"""Where the special tokens go around one text or a pair, as each family's tokenizer places them.

    BERT, ALBERT, ELECTRA, DeBERTa, ModernBERT:  [CLS] A [SEP]        [CLS] A [SEP] B [SEP]    (B: token type 1)
    RoBERTa, Longformer:                         <s> A </s>           <s> A </s></s> B </s>    (all token type 0)

A `tokenizer.json` says which in its post-processor (TemplateProcessing, RobertaProcessing, BertProcessing, or a
Sequence of them); rather than re-implementing each kind, `from_post_processor` runs the tokenizer's own
post-processor once on a probe pair and reads the template off the result (which positions are specials, where
each text starts, the token types). Tokenizers without a post-processor (a bare vocab.txt or SentencePiece model)
get BERT's layout with their own [CLS]/[SEP] ids, and so do those whose post-processor adds no special token
(a classification head needs its [CLS]).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

TEXT = -1  # `Item.token` of the place where a text goes


@dataclasses.dataclass(frozen=True)
class Item:
    token: int  # a special token id, or TEXT
    type_id: int
    text: int = 0  # which text (0 first, 1 second) when token is TEXT


@dataclasses.dataclass(frozen=True)
class SpecialTemplate:
    single: tuple[Item, ...]
    pair: tuple[Item, ...] | None  # None: the tokenizer lays out one text only (`pair_error` says why)
    pair_error: str = ""

    def layout(self, pair: bool) -> tuple[Item, ...]:
        """The items of one text's row, or of a pair's (a ValueError where the tokenizer has no pair layout)."""
        if not pair:
            return self.single
        if self.pair is None:
            raise ValueError(self.pair_error)
        return self.pair

    def describe(self, pair: bool = False) -> str:
        """The layout for messages: `id 1 text id 2` (token types [0, 0, 0])."""
        items = self.layout(pair)
        layout = " ".join("text" if item.token == TEXT else f"id {item.token}" for item in items)
        return f"`{layout}` (token types {[item.type_id for item in items]})"

    def specials(self, pair: bool) -> int:
        """How many special tokens the layout adds (what truncation must leave room for)."""
        return sum(item.token != TEXT for item in self.layout(pair))

    def text_start(self, text: int, first_length: int, pair: bool) -> int:
        """Row position of the first token of text `text` (0 or 1), the first text being `first_length` long."""
        position = 0
        for item in self.layout(pair):
            if item.token == TEXT and item.text == text:
                return position
            position += first_length if item.token == TEXT else 1
        raise ValueError(f"internal: the template has no text {text}")

    def ends_with(self, token: int) -> bool:
        """Whether one text's row ends with `token` after a separator (XLNet's `A <sep> <cls>`: its heads read the
        last position, so its tokenizer pads on the left and question answering puts the context first). A layout
        `A </s>` does not: a tokenizer that names no [CLS] has its last token taken for one."""
        single = self.single
        return len(single) >= 3 and single[0].token == TEXT and single[-1].token == token != single[-2].token

    def position_of(self, token: int, first_length: int, second_length: int | None = None) -> int | None:
        """Row position of the first `token` the layout adds (of a pair's when `second_length` is given), the texts
        being that long; None when the layout has no such token."""
        position = 0
        for item in self.layout(second_length is not None):
            if item.token == token:
                return position
            position += 1 if item.token != TEXT else first_length if item.text == 0 else second_length
        return None

    def build(self, first: Sequence[int], second: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
        """(ids, token type ids) of a row holding `first` (and `second`) with the special tokens."""
        texts = (list(first), None if second is None else list(second))
        ids: list[int] = []
        types: list[int] = []
        for item in self.layout(second is not None):
            piece = [item.token] if item.token != TEXT else texts[item.text]
            ids += piece
            types += [item.type_id] * len(piece)
        return ids, types


def bert_template(cls_id: int, sep_id: int) -> SpecialTemplate:
    return SpecialTemplate(
        single=(Item(cls_id, 0), Item(TEXT, 0, 0), Item(sep_id, 0)),
        pair=(Item(cls_id, 0), Item(TEXT, 0, 0), Item(sep_id, 0), Item(TEXT, 1, 1), Item(sep_id, 1)))


def _read(encoding) -> tuple[Item, ...]:
    """Items of a post-processed encoding: each run of non-special positions is one TEXT item, the first run the
    first text. (The special-tokens mask, not `sequence_ids`, which `post_process` leaves unset for the first text
    of a pair.)"""
    items: list[Item] = []
    previous_special = True
    for token, type_id, special in zip(encoding.ids, encoding.type_ids, encoding.special_tokens_mask):
        if special:
            items.append(Item(int(token), int(type_id)))
        elif previous_special:
            items.append(Item(TEXT, int(type_id), sum(item.token == TEXT for item in items)))
        previous_special = bool(special)
    return tuple(items)


PROBES = ("a", "the", "0", "x", ".")  # texts that every vocabulary encodes to at least one token


def from_post_processor(hf_tokenizer) -> SpecialTemplate | None:
    """The template a `tokenizers.Tokenizer`'s post-processor applies; None when it has none."""
    if hf_tokenizer.post_processor is None:
        return None
    text = next((t for t in PROBES if hf_tokenizer.encode(t, add_special_tokens=False).ids), None)
    if text is None:
        return None

    def probe():  # a fresh encoding each time: post-processing may mark its argument in place
        return hf_tokenizer.encode(text, add_special_tokens=False)

    single = _read(hf_tokenizer.post_process(probe(), None, add_special_tokens=True))
    if all(item.token == TEXT for item in single):
        return None  # a post-processor that adds no special token (ByteLevel offsets only): BERT's layout then
    pair = _read(hf_tokenizer.post_process(probe(), probe(), add_special_tokens=True))
    texts = [sorted(item.text for item in items if item.token == TEXT) for items in (single, pair)]
    if texts == [[0], [0, 1]]:
        return SpecialTemplate(single=single, pair=pair)
    hint = " (a pair of texts loses the second: a TemplateProcessing without a `pair` template)" \
        if texts[1] == [0] else ""
    problem = (f"tokenizer post-processor {type(hf_tokenizer.post_processor).__name__} lays out texts as {texts}"
               f"{hint}; bertjax needs each text once, a pair as [0, 1]")
    if texts[0] != [0]:  # a post-processor that does not keep even one text whole
        raise ValueError(problem)
    # One text laid out right: single texts (embeddings, fill-mask, MLM) work; a pair is an error when built.
    return SpecialTemplate(single=single, pair=None, pair_error=problem)
