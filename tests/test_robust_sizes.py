"""Sizes a model directory claims are compared with what its files hold before anything is built at those sizes
(audit 6, security findings 2, 4 and 10): a config.json / model_config.json claiming a million layers is refused
before the model is traced layer by layer, a workdir checkpoint whose metadata claims other shapes than its
model_config.json before any array is read, and a tokenizer.json naming id 2000000000 before a list of that length
is built. Each error is one line naming the file."""

from __future__ import annotations

import json

import pytest

from bertjax.data import load_tokenizer
from bertjax.data.tokenizers import InvalidTokenizerFile


# ---------------------------------------------------------------------------------------------------------------
# tokenizer.json ids.

def _word_level(path, vocab: dict[str, int]):
    path.mkdir()
    (path / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}))
    return path


SPECIALS = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[MASK]": 3, "[PAD]": 4, "the": 5}


def test_tokenizer_whose_largest_id_is_far_beyond_its_tokens_is_refused(tmp_path):
    # 5e6 keeps the old code's list at 40 MB (it built 2e9 entries, 16 GB, for the audit's file).
    path = _word_level(tmp_path / "tok", {**SPECIALS, "cat": 5_000_000})
    with pytest.raises(InvalidTokenizerFile, match=r"tok/tokenizer.json is not a valid tokenizer: its largest "
                                                   r"token id is 5000000, but it has 7 tokens"):
        load_tokenizer(path)


def test_tokenizer_with_a_few_unused_ids_still_loads(tmp_path):
    tokenizer = load_tokenizer(_word_level(tmp_path / "tok", {**SPECIALS, "cat": 900}))
    assert tokenizer.vocab_size == 901 and tokenizer.encode("the cat").tolist() == [5, 900]
