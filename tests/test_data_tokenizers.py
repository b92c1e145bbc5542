"""Every tokenizer kind behind the one interface: round trips, special ids, word starts, save/load, pickling."""

import pickle

import numpy as np
import pytest
from pydoc_data.topics import topics

from bertjax.data.tokenizer_training import train_sentencepiece
from bertjax.data.tokenizers import (HuggingFaceTokenizer, SentencePieceTokenizer, WordPieceTokenizer,
                                     load_tokenizer)

TEXTS = [topics[name] for name in sorted(topics)][:40]  # ~200 KB of real English, no corpus build needed
SAMPLE = "The with statement is used to wrap the execution of a block with methods defined by a context manager."


@pytest.fixture(scope="module")
def sentencepiece_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sp")
    train_sentencepiece(TEXTS, out, vocab_size=600, model_type="bpe")
    return out


def test_trained_sentencepiece_has_bert_specials_and_round_trips(sentencepiece_dir):
    tok = load_tokenizer(sentencepiece_dir)
    assert isinstance(tok, SentencePieceTokenizer)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.vocab_size == 600
    ids = tok.encode(SAMPLE)
    assert ids.dtype == np.int32 and len(ids) > 10
    assert tok.decode(ids) == SAMPLE
    assert not np.isin(ids, tok.special_ids).any(), "encode must not add special tokens"
    # Control symbols: the text "[MASK]" is spelled out, never turned into the mask token.
    assert tok.mask_id not in tok.encode("a [MASK] b")
    batch = tok.encode_batch([SAMPLE, "", "x"])
    np.testing.assert_array_equal(batch[0], ids)
    assert len(batch[1]) == 0
    # "▁the" starts a word; pieces without the marker continue one.
    pieces = [tok._sp.id_to_piece(int(i)) for i in ids]
    np.testing.assert_array_equal(tok.word_start[ids], [p.startswith("\u2581") for p in pieces])
    assert tok.word_start[tok.special_ids].all()


def test_unigram_training_and_determinism(tmp_path):
    a = train_sentencepiece(TEXTS[:10], tmp_path / "a", vocab_size=500, model_type="unigram", seed=1)
    b = train_sentencepiece(TEXTS[:10], tmp_path / "b", vocab_size=500, model_type="unigram", seed=1)
    assert a.fingerprint == b.fingerprint
    assert a.decode(a.encode(SAMPLE)) == SAMPLE
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_sentencepiece(TEXTS[:10], tmp_path / "c", vocab_size=100)


def test_converted_sentencepiece_with_albert_names(tmp_path):
    """An ALBERT-style .model: <pad> and <unk> instead of [PAD] and [UNK]."""
    import io

    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(line for t in TEXTS[:10] for line in t.splitlines() if line.strip()),
        model_writer=model, vocab_size=300, model_type="unigram", pad_id=0, pad_piece="<pad>", unk_id=1,
        unk_piece="<unk>", bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2)
    path = tmp_path / "spiece.model"
    path.write_bytes(model.getvalue())
    tok = load_tokenizer(path)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE


def wordpiece_vocab(tmp_path):
    from tokenizers import BertWordPieceTokenizer

    tmp_path.mkdir(parents=True, exist_ok=True)
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(TEXTS, vocab_size=800, show_progress=False)
    trainer.save_model(str(tmp_path))
    return tmp_path / "vocab.txt"


def test_wordpiece_vocab_txt(tmp_path):
    vocab = wordpiece_vocab(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, WordPieceTokenizer)
    assert load_tokenizer(vocab).fingerprint == tok.fingerprint
    tokens = vocab.read_text().splitlines()
    assert tok.cls_id == tokens.index("[CLS]") and tok.mask_id == tokens.index("[MASK]")
    assert tok.pad_id == tokens.index("[PAD]") and tok.unk_id == tokens.index("[UNK]")
    ids = tok.encode(SAMPLE)
    # Uncased vocabulary (detected: no capitals): the round trip gives the lowercased text.
    assert tok.decode(ids) == SAMPLE.lower()
    # Independent reference: HF's own BERT tokenizer over the same vocab.
    from tokenizers import BertWordPieceTokenizer

    reference = BertWordPieceTokenizer(str(vocab), lowercase=True)
    np.testing.assert_array_equal(ids, reference.encode(SAMPLE, add_special_tokens=False).ids)
    pieces = [tokens[i] for i in ids]
    np.testing.assert_array_equal(tok.word_start[ids], [not p.startswith("##") for p in pieces])
    assert any(p.startswith("##") for p in pieces)


def byte_level_tokenizer_json(tmp_path):
    from tokenizers import ByteLevelBPETokenizer

    tmp_path.mkdir(parents=True, exist_ok=True)
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(TEXTS, vocab_size=700, show_progress=False,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    path = tmp_path / "tokenizer.json"
    trainer.save(str(path))
    return path


def test_tokenizer_json_byte_level_bpe(tmp_path):
    path = byte_level_tokenizer_json(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n")  # tokenizer.json wins over a vocab.txt next to it
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, HuggingFaceTokenizer)
    assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
    ids = tok.encode(SAMPLE)
    assert tok.decode(ids) == SAMPLE
    from tokenizers import Tokenizer

    np.testing.assert_array_equal(ids, Tokenizer.from_file(str(path)).encode(SAMPLE, add_special_tokens=False).ids)
    vocab = {i: p for p, i in Tokenizer.from_file(str(path)).get_vocab().items()}
    # Byte-level BPE marks word starts with "Ġ" (a leading space).
    np.testing.assert_array_equal(tok.word_start[ids[1:]], [vocab[int(i)].startswith("\u0120") for i in ids[1:]])


def test_tokenizers_pickle_and_save(tmp_path, sentencepiece_dir):
    kinds = [load_tokenizer(sentencepiece_dir), load_tokenizer(wordpiece_vocab(tmp_path / "wp")),
             load_tokenizer(byte_level_tokenizer_json(tmp_path / "bl"))]
    for tok in kinds:
        copy = pickle.loads(pickle.dumps(tok))
        np.testing.assert_array_equal(copy.encode(SAMPLE), tok.encode(SAMPLE))
        saved = load_tokenizer(tok.save(tmp_path / f"saved-{tok.kind}"))
        assert type(saved) is type(tok) and saved.fingerprint == tok.fingerprint
        np.testing.assert_array_equal(saved.encode(SAMPLE), tok.encode(SAMPLE))
        assert len(tok.word_start) >= tok.vocab_size - 1


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no tokenizer in directory"):
        load_tokenizer(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="unknown tokenizer file type"):
        load_tokenizer(tmp_path / "weights.bin")
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"no \[UNK\]"):
        load_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "vocab.txt").write_text("[UNK]\n[PAD]\na\n")
    with pytest.raises(ValueError, match="has no cls token"):
        load_tokenizer(tmp_path / "vocab.txt")


def test_broken_tokenizer_files_are_errors_naming_the_file(tmp_path, sentencepiece_dir):
    """Truncated, empty or foreign files: a ValueError naming the file, not the parser's bare exception."""
    good_json = byte_level_tokenizer_json(tmp_path / "good").read_text()
    cases = {
        "truncated/tokenizer.json": good_json[:len(good_json) // 2],
        "empty/tokenizer.json": "",
        "foreign/tokenizer.json": '{"architectures": ["BertForMaskedLM"], "hidden_size": 128}',  # a config.json
        "not_utf8/tokenizer.json": b"\xff\xfe{}",
        "truncated_sp/tokenizer.model": (sentencepiece_dir / "tokenizer.model").read_bytes()[:1000],
        "empty_sp/tokenizer.model": b"",
        "not_utf8_vocab/vocab.txt": b"[PAD]\n\xff\n",
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.parent.mkdir()
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        for target in (path, path.parent):  # the file itself, and the directory holding it
            with pytest.raises(ValueError, match=f"{path} is not a valid tokenizer"):
                load_tokenizer(target)
    (tmp_path / "bad_config").mkdir()
    (tmp_path / "bad_config" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    (tmp_path / "bad_config" / "tokenizer_config.json").write_text('{"do_lower_case": tr')
    with pytest.raises(ValueError, match=f"{tmp_path / 'bad_config' / 'tokenizer_config.json'} is not a valid"):
        load_tokenizer(tmp_path / "bad_config")


def test_a_template_without_a_pair_layout_serves_single_texts_and_names_its_file_for_a_pair():
    """A TemplateProcessing given only `single` drops the second text of a pair (sentence-transformers embeds with
    such tokenizers): single texts are laid out as it says, a pair is refused with the file and the cause named."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"])}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                                ("[SEP]", 3)])
    tokenizer = HuggingFaceTokenizer(hf.to_str(), source="ckpt/tokenizer.json")
    assert tokenizer.special_template.build([5, 6]) == ([2, 5, 6, 3], [0, 0, 0, 0])
    with pytest.raises(ValueError, match=r"ckpt/tokenizer.json: .*loses the second: a TemplateProcessing without a "
                                         r"`pair` template"):
        tokenizer.special_template.build([5], [6])
