"""Checkpoints whose tokenizer is a SentencePiece model without tokenizer.json, against transformers' AutoTokenizer.

As the Hub ships them: DeBERTa-v3 (spm.model without [MASK], which added_tokens.json puts after the vocabulary),
ALBERT and XLNet saved by transformers 4's slow tokenizers (spiece.model + tokenizer_config.json: ALBERT
lowercases and strips accents, XLNet lays texts out as `A <sep> <cls>` and pads on the left), and XLNet as
xlnet-base-cased ships (spiece.model + tokenizer.json, no tokenizer_config.json). The SentencePiece models are
trained here on the embedded corpus with each checkpoint's special pieces.
"""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest

from bertjax.data.default_corpus import default_corpus_documents
from bertjax.data.tokenizer_export import save_for_transformers
from bertjax.data.tokenizers import HuggingFaceTokenizer, SentencePieceTokenizer, load_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = ["The Loop ENDS when the iterator is exhausted.", "naïve café  résumé\tend", "It's the [MASK] of it", "x"]
PAIRS = [("What does a Return statement do?", "It leaves the function."), ("a", "b c")]


def train_sentencepiece(**pieces) -> bytes:
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(default_corpus_documents()[:200]), model_writer=model, vocab_size=400,
        model_type="unigram", character_coverage=1.0, minloglevel=2, **pieces)
    return model.getvalue()


def write(directory, files: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = directory / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(json.dumps(content))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    deberta = train_sentencepiece(pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]",
                                  eos_piece="[SEP]", unk_piece="[UNK]")
    write(root / "deberta-v3", {
        "spm.model": deberta, "config.json": {"model_type": "deberta-v2"},
        "tokenizer_config.json": {"do_lower_case": False, "vocab_type": "spm"},
        "special_tokens_map.json": {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]",
                                    "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                                    "mask_token": "[MASK]"},
        "added_tokens.json": {"[MASK]": 400}})
    albert = train_sentencepiece(pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece="<pad>", unk_piece="<unk>",
                                 bos_piece="[CLS]", eos_piece="[SEP]", control_symbols=["[MASK]"])
    write(root / "albert", {
        "spiece.model": albert, "config.json": {"model_type": "albert"},
        "tokenizer_config.json": {"tokenizer_class": "AlbertTokenizer", "do_lower_case": True, "remove_space": True,
                                  "keep_accents": False, "bos_token": "[CLS]", "eos_token": "[SEP]",
                                  "unk_token": "<unk>", "sep_token": "[SEP]", "pad_token": "<pad>",
                                  "cls_token": "[CLS]", "mask_token": "[MASK]"}})
    xlnet = train_sentencepiece(unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"])
    write(root / "xlnet", {
        "spiece.model": xlnet, "config.json": {"model_type": "xlnet"},
        "tokenizer_config.json": {"tokenizer_class": "XLNetTokenizer", "do_lower_case": False, "keep_accents": False,
                                  "padding_side": "left", "bos_token": "<s>", "eos_token": "</s>",
                                  "unk_token": "<unk>", "sep_token": "<sep>", "pad_token": "<pad>",
                                  "cls_token": "<cls>", "mask_token": "<mask>"}})
    # xlnet-base-cased: the tokenizer.json transformers' conversion writes, and no tokenizer_config.json.
    write(root / "xlnet-hub", {"spiece.model": xlnet, "config.json": {"model_type": "xlnet"}})
    transformers.AutoTokenizer.from_pretrained(str(root / "xlnet")).backend_tokenizer.save(
        str(root / "xlnet-hub" / "tokenizer.json"))
    write(root / "bare", {"spiece.model": xlnet})  # a model bertjax trained: no checkpoint files beside it
    # An ALBERT checkpoint with its spiece.model and config.json alone: the config names the family.
    write(root / "albert-model-only", {"spiece.model": albert, "config.json": {"model_type": "albert"}})
    return root


@pytest.mark.parametrize("name", ["deberta-v3", "albert", "xlnet", "xlnet-hub", "albert-model-only"])
def test_sentencepiece_checkpoints_tokenize_as_transformers(checkpoints, name):
    directory = checkpoints / name
    tokenizer = load_tokenizer(directory)
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    assert isinstance(tokenizer, HuggingFaceTokenizer)
    assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, tokenizer.pad_id, tokenizer.unk_id) == \
        (reference.cls_token_id, reference.sep_token_id, reference.mask_token_id, reference.pad_token_id,
         reference.unk_token_id)
    assert tokenizer.vocab_size == len(reference)
    template = tokenizer.special_template
    for text in TEXTS:
        assert template.build(tokenizer.encode(text))[0] == reference(text)["input_ids"], text
    for first, second in PAIRS:
        ids, types = template.build(tokenizer.encode(first), tokenizer.encode(second))
        expected = reference(first, second, return_token_type_ids=True)
        assert (ids, types) == (expected["input_ids"], expected["token_type_ids"])


def test_deberta_v3_mask_is_the_added_token_after_the_vocabulary(checkpoints):
    tokenizer = load_tokenizer(checkpoints / "deberta-v3")
    assert tokenizer.mask_id == 400 and tokenizer.vocab_size == 401 and 400 in tokenizer.special_ids
    assert tokenizer.encode("the [MASK] here").tolist().count(400) == 1


@pytest.mark.parametrize("name", ["xlnet", "xlnet-hub"])
def test_xlnet_exports_with_its_cls_last_and_left_padding(checkpoints, name, tmp_path):
    """transformers' XLNet heads read the last position: the export must pad on the left, as XLNetTokenizer does,
    and name <cls>/<sep>."""
    tokenizer = load_tokenizer(checkpoints / name)
    save_for_transformers(tokenizer, tmp_path / "export")
    exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    original = transformers.AutoTokenizer.from_pretrained(str(checkpoints / name))
    batch = ["a b", "the loop ends when the iterator is exhausted"]
    assert exported(batch, padding=True)["input_ids"] == original(batch, padding=True)["input_ids"]
    assert (exported.cls_token, exported.sep_token, exported.padding_side) == ("<cls>", "<sep>", "left")


def test_a_copy_of_a_converted_tokenizer_needs_no_transformers(checkpoints, tmp_path, monkeypatch):
    tokenizer = load_tokenizer(checkpoints / "albert")
    copy = tokenizer.save(tmp_path / "copy")  # what prepare / pretrain keep in their directories
    monkeypatch.setitem(sys.modules, "transformers", None)
    again = load_tokenizer(copy)
    assert again.fingerprint == tokenizer.fingerprint
    assert [again.encode(t).tolist() for t in TEXTS] == [tokenizer.encode(t).tolist() for t in TEXTS]


def test_without_transformers_a_checkpoint_sentencepiece_says_what_to_install(checkpoints, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match=r"without a tokenizer.json.*pip install 'bertjax\[hf\]'"):
        load_tokenizer(checkpoints / "deberta-v3")


def test_a_sentencepiece_model_bertjax_trained_stays_its_own(checkpoints):
    tokenizer = load_tokenizer(checkpoints / "bare")
    assert isinstance(tokenizer, SentencePieceTokenizer)
    sp = tokenizer._sp
    # No config to say otherwise: the usual names, XLNet's <cls>/<sep> before <s>/</s>.
    assert (tokenizer.cls_id, tokenizer.sep_id) == (sp.piece_to_id("<cls>"), sp.piece_to_id("<sep>"))


def test_convert_from_hf_writes_the_built_tokenizer_json(checkpoints, tmp_path):
    """A DeBERTa-v3 checkpoint converted: its files copied (added_tokens.json too) and the tokenizer.json
    transformers built, so the converted directory tokenizes the same without the source's config.json."""
    import torch

    from bertjax.cli import main

    source = tmp_path / "hf"
    write(source, {name.name: name.read_bytes() for name in (checkpoints / "deberta-v3").iterdir()})
    config = transformers.DebertaV2Config(vocab_size=401, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=40, max_position_embeddings=64, type_vocab_size=0,
                                          relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"],
                                          norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False)
    torch.manual_seed(0)
    transformers.DebertaV2ForMaskedLM(config).save_pretrained(str(source))
    assert main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "converted")]) == 0
    written = sorted(p.name for p in (tmp_path / "converted").iterdir())
    assert {"added_tokens.json", "spm.model", "tokenizer.json"} <= set(written)
    converted, original = load_tokenizer(tmp_path / "converted"), load_tokenizer(source)
    assert converted.mask_id == original.mask_id == 400
    for text in TEXTS:
        np.testing.assert_array_equal(converted.encode(text), original.encode(text))


@pytest.fixture(scope="module")
def roberta_slow_checkpoint(tmp_path_factory):
    """A RoBERTa checkpoint's tokenizer as transformers 4's slow RobertaTokenizer saved it (and many RoBERTa,
    Longformer and DeBERTa v1 checkpoints ship it): vocab.json + merges.txt and configs, no tokenizer.json."""
    from tokenizers import ByteLevelBPETokenizer

    directory = tmp_path_factory.mktemp("roberta-slow")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(default_corpus_documents()[:200], vocab_size=400, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(directory))
    write(directory, {"config.json": {"model_type": "roberta"},
                      "tokenizer_config.json": {"tokenizer_class": "RobertaTokenizer", "model_max_length": 512},
                      # transformers 4 wrote some as bare AddedToken dicts (no "__type")
                      "special_tokens_map.json": {"bos_token": _added("<s>"), "eos_token": _added("</s>"),
                                                  "unk_token": _added("<unk>"), "sep_token": "</s>",
                                                  "pad_token": "<pad>", "cls_token": "<s>",
                                                  "mask_token": _added("<mask>", lstrip=True)}})
    return directory


def _added(content: str, lstrip: bool = False) -> dict:
    return {"content": content, "lstrip": lstrip, "normalized": True, "rstrip": False, "single_word": False}


def test_a_vocab_json_and_merges_checkpoint_tokenizes_as_transformers(roberta_slow_checkpoint):
    assert sorted(p.name for p in roberta_slow_checkpoint.glob("*.json")) == [
        "config.json", "special_tokens_map.json", "tokenizer_config.json", "vocab.json"]
    tokenizer = load_tokenizer(roberta_slow_checkpoint)
    reference = transformers.AutoTokenizer.from_pretrained(str(roberta_slow_checkpoint))
    assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, tokenizer.pad_id) == \
        (reference.cls_token_id, reference.sep_token_id, reference.mask_token_id, reference.pad_token_id)
    template = tokenizer.special_template
    for text in TEXTS:
        assert template.build(tokenizer.encode(text))[0] == reference(text)["input_ids"], text
    for first, second in PAIRS:
        assert template.build(tokenizer.encode(first), tokenizer.encode(second))[0] == \
            reference(first, second)["input_ids"]


def test_an_exported_byte_level_bpe_is_written_for_transformers_4_too(roberta_slow_checkpoint, tmp_path):
    """transformers <= 4.44 (tokenizers < 0.20) reads merges only as "a b" strings, and transformers 4 reads a special
    token dict in tokenizer_config.json only with its "__type" tag."""
    save_for_transformers(load_tokenizer(roberta_slow_checkpoint), tmp_path / "export")
    merges = json.loads((tmp_path / "export" / "tokenizer.json").read_text())["model"]["merges"]
    assert merges and all(isinstance(merge, str) and len(merge.split(" ")) == 2 for merge in merges)
    config = json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())
    assert config["bos_token"] == {"__type": "AddedToken", **_added("<s>")}
    exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    original = transformers.AutoTokenizer.from_pretrained(str(roberta_slow_checkpoint))
    for text in TEXTS:
        assert exported(text)["input_ids"] == original(text)["input_ids"], text


def test_a_vocab_json_without_merges_is_named(roberta_slow_checkpoint, tmp_path):
    write(tmp_path / "half", {"vocab.json": json.loads((roberta_slow_checkpoint / "vocab.json").read_text())})
    with pytest.raises(ValueError, match=r"vocab.json has no merges.txt beside it"):
        load_tokenizer(tmp_path / "half")


def test_convert_from_hf_carries_a_vocab_json_tokenizer(roberta_slow_checkpoint, tmp_path):
    import torch

    from bertjax.cli import main

    source = tmp_path / "hf"
    write(source, {p.name: p.read_bytes() for p in roberta_slow_checkpoint.iterdir()})
    config = transformers.RobertaConfig(vocab_size=400, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=40, max_position_embeddings=64, pad_token_id=1)
    torch.manual_seed(0)
    transformers.RobertaForMaskedLM(config).save_pretrained(str(source))
    assert main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "converted")]) == 0
    assert {"vocab.json", "merges.txt", "tokenizer.json"} <= {p.name for p in (tmp_path / "converted").iterdir()}
    converted, original = load_tokenizer(tmp_path / "converted"), load_tokenizer(source)
    for text in TEXTS:
        np.testing.assert_array_equal(converted.encode(text), original.encode(text))


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cases", "rise", "caf", "##e", "é", "c", "##o",
         "##v", "##i", "##d", "##1", "##9", "<", ">", "e", "##n", "##t", "中", "文", "##文"]


@pytest.mark.parametrize("config,added", [
    ({"do_lower_case": True}, {"covid19": len(VOCAB), "<ent>": len(VOCAB) + 1}),
    ({"do_lower_case": True, "strip_accents": False, "tokenize_chinese_chars": False}, {}),
    ({"do_lower_case": False, "strip_accents": True, "tokenize_chinese_chars": True}, {}),
], ids=["added-tokens", "keep-accents-no-chinese-split", "cased-strip-accents"])
def test_vocab_txt_checkpoints_tokenize_as_transformers(config, added, tmp_path):
    """A BERT checkpoint saved by a slow tokenizer: vocab.txt, its options, tokens added after the vocabulary."""
    write(tmp_path / "bert", {"tokenizer_config.json": config, "config.json": {"model_type": "bert"},
                              **({"added_tokens.json": added} if added else {})})
    (tmp_path / "bert" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tokenizer = load_tokenizer(tmp_path / "bert")
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "bert"))
    assert tokenizer.vocab_size == len(reference)
    for text in ["COVID19 cases <ent> rise", "the [SEP] a [MASK] café", "中文 the", "Café [UNK] é"]:
        ids = tokenizer.special_template.build(tokenizer.encode(text))[0]
        assert ids == reference(text)["input_ids"], text
        assert tokenizer.decode(ids) == reference.decode(ids, skip_special_tokens=True)
    # A copy keeps all of it, in the fingerprint too (prepared data tokenized with it).
    copy = load_tokenizer(tokenizer.save(tmp_path / "copy"))
    assert copy.fingerprint == tokenizer.fingerprint and copy.vocab_size == tokenizer.vocab_size


def _decoder_entry(content: str, special: bool = True) -> dict:
    return {"content": content, "lstrip": False, "normalized": not special, "rstrip": False, "single_word": False,
            "special": special}


SPECIALS_VOCAB = VOCAB + ["<mask>", "[unused0]"]


@pytest.mark.parametrize("config", [
    {"mask_token": "<mask>"},
    {"additional_special_tokens": ["[unused0]", "[E1]"]},
    {"added_tokens_decoder": {**{str(i): _decoder_entry(t) for i, t in enumerate(VOCAB[:5])},
                              str(len(SPECIALS_VOCAB)): _decoder_entry("[E1]"),
                              str(len(SPECIALS_VOCAB) + 1): _decoder_entry("covid19", special=False)}},
], ids=["mask-named", "additional-specials", "added-tokens-decoder"])
def test_vocab_txt_special_tokens_its_config_names_are_read_as_transformers_reads_them(config, tmp_path):
    """tokenizer_config.json may give a role to another token, or name special and added tokens beyond BERT's
    five; transformers keeps them whole in text, and so must bertjax (a split <mask> finds no mask to fill)."""
    write(tmp_path / "bert", {"tokenizer_config.json": {"do_lower_case": True, **config},
                              "config.json": {"model_type": "bert"}})
    (tmp_path / "bert" / "vocab.txt").write_text("\n".join(SPECIALS_VOCAB) + "\n")
    tokenizer = load_tokenizer(tmp_path / "bert")
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "bert"))
    assert (tokenizer.mask_id, tokenizer.vocab_size) == (reference.mask_token_id, len(reference))
    for text in ["the <mask> a [MASK] rise", "[unused0] cases [E1] covid19", "Café [UNK] é"]:
        assert tokenizer.special_template.build(tokenizer.encode(text))[0] == reference(text)["input_ids"], text


def test_a_cased_vocab_txt_without_a_config_keeps_case_and_says_transformers_would_not(tmp_path, caplog):
    """Google's cased BERT releases ship vocab.txt without tokenizer_config.json: lowercasing would make every
    capitalised piece unreachable, which transformers' BertTokenizer does unless told do_lower_case=false."""
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "vocab.txt").write_text("\n".join(VOCAB + ["The"]) + "\n")
    with caplog.at_level("WARNING", logger="bertjax.data.tokenizers"):
        tokenizer = load_tokenizer(tmp_path / "bert")
    assert tokenizer.encode("The").tolist() == [len(VOCAB)]
    assert "transformers' BertTokenizer would lowercase" in caplog.text
    caplog.clear()
    (tmp_path / "bert" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")  # uncased: both lowercase, no warning
    with caplog.at_level("WARNING", logger="bertjax.data.tokenizers"):
        assert load_tokenizer(tmp_path / "bert").encode("The").tolist() == [VOCAB.index("the")]
    assert "lowercase" not in caplog.text


def test_added_tokens_that_do_not_follow_the_vocabulary_are_refused(tmp_path):
    write(tmp_path / "bert", {"added_tokens.json": {"covid19": len(VOCAB) + 3}})
    (tmp_path / "bert" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    with pytest.raises(ValueError, match=r"added_tokens.json \(30\) must follow the vocabulary's 27 tokens"):
        load_tokenizer(tmp_path / "bert")


def test_a_tokenizer_directory_naming_its_own_code_is_refused_without_running_it(checkpoints, tmp_path,
                                                                                  monkeypatch):
    """A downloaded tokenizer/ whose tokenizer_config.json maps AutoTokenizer to a module beside it: transformers
    would ask on stdin whether to run it, and a piped "y" imports it. bertjax runs no checkpoint code."""
    directory = tmp_path / "tokenizer"
    directory.mkdir()
    (directory / "spm.model").write_bytes((checkpoints / "deberta-v3" / "spm.model").read_bytes())
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tokenization_planted.Planted", "tokenization_planted.Planted"]}}))
    ran = tmp_path / "ran"
    (directory / "tokenization_planted.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 4))
    with pytest.raises(ValueError, match="transformers cannot build"):
        load_tokenizer(directory)
    assert not ran.exists()


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased-json", "cased-json"])
def test_a_tokenizer_config_at_odds_with_its_tokenizer_json_is_named(lowercase, tmp_path, caplog):
    """transformers 5's BertTokenizer rebuilds the normalizer from tokenizer_config.json's do_lower_case; bertjax and
    the tokenizers library run tokenizer.json. Files transformers saved agree; an edited config is said to differ."""
    reference = transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(VOCAB)}, do_lower_case=lowercase)
    reference.save_pretrained(str(tmp_path / "bert"))
    with caplog.at_level("WARNING", logger="bertjax.data.tokenizers"):
        load_tokenizer(tmp_path / "bert")
    assert "disagree" not in caplog.text
    path = tmp_path / "bert" / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "do_lower_case": not lowercase}))
    with caplog.at_level("WARNING", logger="bertjax.data.tokenizers"):
        tokenizer = load_tokenizer(tmp_path / "bert")
    assert (f"do_lower_case={json.dumps(not lowercase)} against the BertNormalizer's lowercase="
            f"{json.dumps(lowercase)}") in caplog.text
    assert tokenizer.encode("Cases").tolist() != transformers.AutoTokenizer.from_pretrained(
        str(tmp_path / "bert"))("Cases", add_special_tokens=False)["input_ids"]  # the difference it warns of
