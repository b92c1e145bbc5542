"""Special tokens named by a checkpoint's tokenizer_config.json, against transformers' AutoTokenizer.

EuroBERT's tokenizer is Llama 3's byte-level BPE: no [CLS]/[SEP]/<unk>, texts start with <|begin_of_text|> (its
bos) and end with <|end_of_text|> (its eos, also its pad), and <|mask|> is its mask. Nothing can be downloaded
here, so the fixture builds a tokenizer laid out as EuroBERT's (the same special tokens, ids at the end of the
vocabulary, a post-processor adding bos/eos, a tokenizer_config.json naming bos/eos/mask/pad) on a small BPE
trained on the embedded corpus.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertjax.data.default_corpus import default_corpus_documents
from bertjax.data.tokenizer_export import save_for_transformers
from bertjax.data.tokenizers import load_tokenizer

transformers = pytest.importorskip("transformers")

BOS, EOS, MASK = "<|begin_of_text|>", "<|end_of_text|>", "<|mask|>"
EUROBERT_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
                   "mask_token": MASK, "pad_token": EOS, "model_max_length": 8192,
                   "model_input_names": ["input_ids", "attention_mask"]}
TEXTS = ["The loop ends when the iterator is exhausted.", "  Leading spaces, café and naïve!", "x"]
PAIRS = [("What does a return statement do?", "It leaves the function."), ("a", "b c")]


def eurobert_style_tokenizer(directory, config=EUROBERT_CONFIG, single=f"{BOS} $A {EOS}",
                              pair=f"{BOS} $A {EOS} $B {EOS}"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(default_corpus_documents()[:300], trainer)
    # Llama 3 puts its specials after the BPE vocabulary; EuroBERT's mask replaced a reserved one.
    tok.add_special_tokens([BOS, EOS, MASK, "<|reserved_special_token_1|>"])
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=single, pair=pair, special_tokens=[(BOS, bos), (EOS, eos)])])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


def transformers_ids(directory, first, second=None):
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    return reference(first, second)["input_ids"]


def test_eurobert_style_specials_come_from_the_config(tmp_path):
    hf = eurobert_style_tokenizer(tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")
    assert tokenizer.cls_id == hf.token_to_id(BOS) and tokenizer.sep_id == hf.token_to_id(EOS)
    assert tokenizer.mask_id == hf.token_to_id(MASK) and tokenizer.pad_id == hf.token_to_id(EOS)
    assert tokenizer.unk_id is None  # byte-level BPE has none, and none is needed
    assert set(tokenizer.special_ids) == {hf.token_to_id(t) for t in (BOS, EOS, MASK, "<|reserved_special_token_1|>")}

    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert (reference.bos_token_id, reference.mask_token_id) == (tokenizer.cls_id, tokenizer.mask_id)
    template = tokenizer.special_template
    for text in TEXTS:
        assert template.build(tokenizer.encode(text))[0] == reference(text)["input_ids"]
    for first, second in PAIRS:
        assert template.build(tokenizer.encode(first), tokenizer.encode(second))[0] == \
            reference(first, second)["input_ids"]


def test_eurobert_style_tokenizer_survives_save_and_export(tmp_path):
    eurobert_style_tokenizer(tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")
    ids = lambda t: (t.cls_id, t.sep_id, t.mask_id, t.pad_id, t.unk_id)  # noqa: E731

    again = load_tokenizer(tokenizer.save(tmp_path / "copy"))  # what prepare and pretrain keep in a workdir
    assert ids(again) == ids(tokenizer) and again.fingerprint == tokenizer.fingerprint

    save_for_transformers(tokenizer, tmp_path / "export")
    exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    assert (exported.bos_token, exported.eos_token, exported.mask_token, exported.pad_token) == (BOS, EOS, MASK, EOS)
    assert exported.unk_token is None
    for first, second in PAIRS:
        assert exported(first, second)["input_ids"] == transformers_ids(tmp_path / "tok", first, second)
    assert ids(load_tokenizer(tmp_path / "export")) == ids(tokenizer)


def test_fill_mask_on_a_eurobert_checkpoint_matches_transformers(tmp_path):
    """The transformers docs' EuroBERT example, `<|mask|>` spelling included: a <|begin_of_text|> ... <|end_of_text|>
    row, and the top tokens and probabilities of transformers' model on it (special tokens banned, as bertjax's
    fill-mask does; the README says so)."""
    import torch

    from bertjax.inference.fill_mask import encode_with_masks, load_predictor

    hf = eurobert_style_tokenizer(tmp_path / "hf")
    config = transformers.EuroBertConfig(
        vocab_size=hf.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64, bos_token_id=hf.token_to_id(BOS),
        eos_token_id=hf.token_to_id(EOS), pad_token_id=hf.token_to_id(EOS), mask_token_id=hf.token_to_id(MASK))
    torch.manual_seed(0)
    model = transformers.EuroBertForMaskedLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # peaked, so the top tokens are well separated
    model.save_pretrained(str(tmp_path / "hf"))

    text = f"The loop ends when the {MASK} is exhausted."
    tokenizer = load_tokenizer(tmp_path / "hf")
    ids, masks = encode_with_masks(tokenizer, text)
    assert ids[0] == hf.token_to_id(BOS) and ids[-1] == hf.token_to_id(EOS) and ids[masks[0]] == tokenizer.mask_id
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ids[None].astype(np.int64))).logits[0, masks[0]]
    logits[torch.tensor(tokenizer.special_ids.astype(np.int64))] = -float("inf")
    expected = torch.softmax(logits, -1).topk(3)

    got = load_predictor(tmp_path / "hf")(text, top_k=3)
    assert [p.token_id for p in got[0]] == expected.indices.tolist()
    np.testing.assert_allclose([p.probability for p in got[0]], expected.values.numpy(), atol=1e-5)


def test_tokenizer_json_post_processor_wins_over_add_bos_eos_flags_as_in_transformers(tmp_path):
    """Llama 3's own post-processor adds only <|begin_of_text|>. transformers drops tokenizer_config.json's
    add_bos_token / add_eos_token when a tokenizer.json is present, and so does bertjax."""
    eurobert_style_tokenizer(tmp_path / "tok", config={**EUROBERT_CONFIG, "add_bos_token": True, "add_eos_token": True},
                             single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B")
    tokenizer = load_tokenizer(tmp_path / "tok")
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    template = tokenizer.special_template
    for text in TEXTS:
        assert template.build(tokenizer.encode(text))[0] == reference(text)["input_ids"]
    for first, second in PAIRS:
        ids, types = template.build(tokenizer.encode(first), tokenizer.encode(second))
        expected = reference(first, second, return_token_type_ids=True)
        assert (ids, types) == (expected["input_ids"], expected["token_type_ids"])
    # fill-mask lays its row out the same way: no <|end_of_text|> that transformers would not add.
    from bertjax.inference.fill_mask import encode_with_masks
    row, masks = encode_with_masks(tokenizer, f"The loop {MASK} here.")
    assert row.tolist() == reference(f"The loop {MASK} here.")["input_ids"] and row[masks[0]] == tokenizer.mask_id


def test_a_bare_llama3_tokenizer_json_without_a_pad_says_how_to_name_one(tmp_path):
    eurobert_style_tokenizer(tmp_path / "tok", config=None)
    with pytest.raises(ValueError, match=r"no pad token .*pad_token in tokenizer_config.json"):
        load_tokenizer(tmp_path / "tok")


def test_a_declared_token_missing_from_the_vocabulary_is_named(tmp_path):
    eurobert_style_tokenizer(tmp_path / "tok", config={**EUROBERT_CONFIG, "mask_token": "<|no_such|>"})
    with pytest.raises(ValueError, match=r"names mask_token '<\|no_such\|>', which the vocabulary does not have"):
        load_tokenizer(tmp_path / "tok")


def test_special_tokens_map_names_the_tokens_of_an_older_checkpoint(tmp_path):
    eurobert_style_tokenizer(tmp_path / "tok", config={"tokenizer_class": "PreTrainedTokenizerFast"})
    (tmp_path / "tok" / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": {"content": BOS, "lstrip": False}, "eos_token": EOS, "mask_token": MASK, "pad_token": EOS}))
    tokenizer = load_tokenizer(tmp_path / "tok")
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert (tokenizer.cls_id, tokenizer.mask_id, tokenizer.pad_id) == \
        (reference.bos_token_id, reference.mask_token_id, reference.pad_token_id)


@pytest.mark.parametrize("lstrip", [False, True])
def test_fill_mask_gives_the_space_before_the_mask_where_the_mask_token_says(lstrip, tmp_path):
    """A mask token with lstrip (RoBERTa's <mask>) takes the space before it; one without (this Llama-3 layout's
    <|mask|>) leaves it to the text, a token of its own: the row is what transformers' tokenizer makes of the text,
    whitespace after the last mask included."""
    from tokenizers import AddedToken, Tokenizer

    from bertjax.inference.fill_mask import encode_with_masks

    eurobert_style_tokenizer(tmp_path / "tok")
    hf = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    hf.add_special_tokens([AddedToken(MASK, special=True, lstrip=lstrip, normalized=False)])
    hf.save(str(tmp_path / "tok" / "tokenizer.json"))
    tokenizer = load_tokenizer(tmp_path / "tok")
    assert tokenizer.mask_takes_space_before is lstrip
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    for text in (f"The loop {MASK} here.", f"{MASK} ends, {MASK}  {MASK}", f"A {MASK} ", f"x {MASK}\n"):
        row, masks = encode_with_masks(tokenizer, text)
        assert row.tolist() == reference(text)["input_ids"], text
        assert all(row[m] == tokenizer.mask_id for m in masks)
