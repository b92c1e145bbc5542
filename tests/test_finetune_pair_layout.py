"""Pairs are laid out as each family's tokenizer lays them out (its tokenizer.json post-processor): RoBERTa's
`<s> a </s></s> b </s>`, BERT's `[CLS] a [SEP] b [SEP]` with token types 0/1; the rows equal what transformers'
tokenizer gives for the same texts, truncation included, and QA windows start where the context does."""

import numpy as np
import pytest

from bertjax.data.tokenizers import HuggingFaceTokenizer, WordPieceTokenizer
from bertjax.finetune.encoding import encode_texts, encode_words
from bertjax.finetune.qa import Answer, make_windows

TEXTS = ["the cat sat on the mat", "a dog", "hello world, this is a longer sentence about the mat and the cat"]
PAIRS = ["where did the cat sit", "the dog barked at the cat on the mat today", "short"]
CORPUS = [t + " " + p for t, p in zip(TEXTS, PAIRS)] * 20


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    """A byte-level BPE trained here, with RoBERTa's post-processor, as bertjax and transformers load it."""
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(CORPUS, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    trained.post_processor = processors.RobertaProcessing(("</s>", trained.token_to_id("</s>")),
                                                          ("<s>", trained.token_to_id("<s>")))
    path = tmp_path_factory.mktemp("roberta-tokenizer") / "tokenizer.json"
    trained.save(str(path))
    reference = PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token="<s>", eos_token="</s>",
                                        sep_token="</s>", cls_token="<s>", pad_token="<pad>", unk_token="<unk>",
                                        mask_token="<mask>")
    return HuggingFaceTokenizer.from_file(path), reference


@pytest.fixture(scope="module", params=["vocab.txt", "tokenizer.json"])
def bert(request, tmp_path_factory):
    """BERT's WordPiece against transformers' own BertTokenizerFast on the same vocabulary: as a bare vocab.txt
    (no post-processor: bertjax's default layout), and exported as a tokenizer.json (its TemplateProcessing)."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    from bertjax.data.tokenizer_export import save_for_transformers

    trained = BertWordPieceTokenizer(lowercase=True)
    trained.train_from_iterator(CORPUS, vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    vocab = dict(sorted(trained.get_vocab().items(), key=lambda item: item[1]))
    reference = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    ours = WordPieceTokenizer("\n".join(vocab) + "\n", lowercase=True)
    if request.param == "tokenizer.json":
        directory = tmp_path_factory.mktemp("bert-tokenizer")
        save_for_transformers(ours, directory)
        ours = HuggingFaceTokenizer.from_file(directory / "tokenizer.json")
    return ours, reference


def _compare(ours, reference, max_length, pairs, type_ids: bool):
    rows = encode_texts(ours, TEXTS, pairs, max_length, True, "test")
    expected = reference(TEXTS, pairs, truncation=True, max_length=max_length, return_token_type_ids=True)
    for i, ids in enumerate(expected["input_ids"]):
        length = int(rows["segment_ids"][i].sum())
        assert rows["input_ids"][i, :length].tolist() == ids, i
        assert (rows["input_ids"][i, length:] == ours.pad_id).all()
        if type_ids:
            assert rows["token_type_ids"][i, :length].tolist() == expected["token_type_ids"][i], i


@pytest.mark.parametrize("max_length", [64, 12])  # 12 cuts the longer text of some pairs
def test_roberta_pairs_match_transformers(roberta, max_length):
    ours, reference = roberta
    _compare(ours, reference, max_length, PAIRS, type_ids=True)
    _compare(ours, reference, max_length, None, type_ids=True)
    template = ours.special_template
    assert template.specials(pair=True) == 4 and template.specials(pair=False) == 2
    ids, types = template.build([7, 8], [9])
    bos, eos = ours.cls_id, ours.sep_id
    assert ids == [bos, 7, 8, eos, eos, 9, eos] and types == [0] * 7


@pytest.mark.parametrize("max_length", [64, 12])
def test_bert_pairs_match_transformers(bert, max_length):
    ours, reference = bert
    _compare(ours, reference, max_length, PAIRS, type_ids=True)
    _compare(ours, reference, max_length, None, type_ids=True)
    assert ours.special_template.build([7], [8, 9]) == ([ours.cls_id, 7, ours.sep_id, 8, 9, ours.sep_id],
                                                        [0, 0, 0, 1, 1, 1])


def test_qa_windows_start_where_the_roberta_context_starts(roberta):
    ours, _ = roberta
    context = "the cat sat on the mat and " * 4 + "the dog barked at the cat"
    answer = Answer("the dog", context.index("the dog"))
    windows = make_windows(ours, "where did the cat sit", context, answer, max_length=32, doc_stride=4)
    assert len(windows.input_ids) > 1
    question = ours.encode("where did the cat sit").tolist()
    first = len(question) + 3  # <s> question </s></s>
    for row, offsets, start, end in zip(windows.input_ids, windows.offsets, windows.start_positions,
                                        windows.end_positions):
        assert row[:first].tolist() == [ours.cls_id, *question, ours.sep_id, ours.sep_id]
        assert offsets[first - 1, 0] == -1 and offsets[first, 0] >= 0  # the context's first token has an offset
        if start:
            found = context[offsets[start, 0]:offsets[end, 1]]
            assert found.strip() == "the dog"
    assert windows.start_positions.max() > 0


def test_words_of_a_roberta_row_sit_after_its_bos(roberta):
    ours, _ = roberta
    row, word_of_token = encode_words(ours, ["the", "cat", "sat"], 8, True, "test")
    assert row["input_ids"][0] == ours.cls_id and word_of_token[1] == 0
    assert int(row["segment_ids"].sum()) == 2 + sum(len(ours.encode(" " + w)) for w in ["the", "cat", "sat"])
    np.testing.assert_array_equal(row["token_type_ids"], 0)


def test_a_checkpoints_tokenizer_class_and_options_survive_bertjax_saving_it(tmp_path):
    """A RoBERTa checkpoint's tokenizer_config.json (RobertaTokenizer, add_prefix_space, bos/eos) is kept through a
    bertjax workdir and the export into best/ or a converted directory, so run_ner's
    `AutoTokenizer.from_pretrained(dir, add_prefix_space=True)` on words gives the ids bertjax trained on. The
    generic class written before ignored add_prefix_space and encoded every word without its word-start form."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer, processors

    from bertjax.data import load_tokenizer
    from bertjax.data.tokenizer_export import save_for_transformers

    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(CORPUS, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    trained.post_processor = processors.RobertaProcessing(("</s>", trained.token_to_id("</s>")),
                                                          ("<s>", trained.token_to_id("<s>")))
    trained.save(str(tmp_path / "trained.json"))
    source = tmp_path / "checkpoint"
    transformers.RobertaTokenizerFast(tokenizer_file=str(tmp_path / "trained.json")).save_pretrained(source)

    words = "the cat sat on the mat".split()
    ours = load_tokenizer(source)
    row, _ = encode_words(ours, words, 32, True, "x")
    trained_on = [int(i) for i in row["input_ids"][:int(row["segment_ids"].sum())]]
    original = transformers.AutoTokenizer.from_pretrained(source, add_prefix_space=True)
    assert original(words, is_split_into_words=True)["input_ids"] == trained_on

    workdir_copy = load_tokenizer(ours.save(tmp_path / "workdir-tokenizer"))  # as a pretraining workdir keeps it
    assert workdir_copy.fingerprint == ours.fingerprint  # settings for transformers do not change bertjax's ids
    save_for_transformers(workdir_copy, tmp_path / "best")
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "best", add_prefix_space=True)
    assert type(exported) is type(original)
    assert exported(words, is_split_into_words=True)["input_ids"] == trained_on
    assert exported(TEXTS[2])["input_ids"] == original(TEXTS[2])["input_ids"]  # running text: no prefix space
