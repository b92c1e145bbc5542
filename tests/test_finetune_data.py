"""Fine-tuning data: file readers and their errors, row layout and truncation, token-label alignment, QA windows
with answers across window boundaries and unanswerable questions, and span postprocessing."""

import json

import numpy as np
import pytest

from bertjax.data.tokenizers import WordPieceTokenizer
from bertjax.finetune import encoding, qa, readers
from bertjax.finetune.tasks import Labels

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "away", "who", "what", "where", "did", "paris",
         "is", "in", "france", "big", "red", "house", ",", ".", "?"]


@pytest.fixture(scope="module")
def tok():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + ["##s", "##ing"]
    return WordPieceTokenizer("\n".join(vocab))


# ---------------------------------------------------------------------------------------------------------------
# Readers.

def test_each_format_reads_the_same_rows(tmp_path):
    rows = [{"text": "a, b", "label": "x"}, {"text": "c", "label": "y"}]
    (tmp_path / "d.csv").write_text('text,label\n"a, b",x\nc,y\n')
    (tmp_path / "d.tsv").write_text("text\tlabel\na, b\tx\nc\ty\n")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (tmp_path / "d.json").write_text(json.dumps(rows, indent=1))  # one document: a list of objects
    for suffix in ("csv", "tsv", "jsonl", "parquet", "json"):
        assert readers.read_rows(tmp_path / f"d.{suffix}") == rows, suffix
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in rows))  # JSON Lines as `datasets`
    assert readers.read_rows(tmp_path / "lines.json") == rows


def test_squad_json_is_read_as_one_row_per_question(tmp_path):
    """train-v2.0.json as published: articles > paragraphs > qas. It was read as one JSON line with columns data
    and version, and the error advised renaming a column. Rows take Hugging Face's `squad_v2` layout; an impossible
    question has no answers (its plausible_answers are not answers)."""
    context = "The cat sat on the mat in Paris."
    squad = {"version": "v2.0", "data": [{"title": "Cats", "paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": "Where did the cat sit?", "is_impossible": False,
         "answers": [{"text": "on the mat", "answer_start": 8}, {"text": "the mat", "answer_start": 11}]},
        {"id": "q2", "question": "Who ran away?", "is_impossible": True, "answers": [],
         "plausible_answers": [{"text": "The cat", "answer_start": 0}]}]}]}]}
    (tmp_path / "train-v2.0.json").write_text(json.dumps(squad))
    rows = readers.read_rows(tmp_path / "train-v2.0.json")
    assert rows == [{"id": "q1", "title": "Cats", "context": context, "question": "Where did the cat sit?",
                     "answers": {"text": ["on the mat", "the mat"], "answer_start": [8, 11]}},
                    {"id": "q2", "title": "Cats", "context": context, "question": "Who ran away?",
                     "answers": {"text": [], "answer_start": []}}]
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import task_class

    task_cls = task_class("question-answering")
    config = load_finetune_config(None, [], task_cls.defaults)
    labels = task_cls(config.data, config.task).fit_labels(rows, "train-v2.0.json", None)
    assert labels.unanswerable  # v2.0: prediction may answer ""
    broken = {"data": [{"title": "x", "paragraphs": [{"context": "c", "qas": [{"id": "1", "answers": []}]}]}]}
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match=r"broken.json, article 1, paragraph 1, question 1: no \"question\" text"):
        readers.read_rows(tmp_path / "broken.json")
    (tmp_path / "list.json").write_text('[{"text": "a"}, 3]')
    with pytest.raises(ValueError, match="item 2 of its list is int, not an object"):
        readers.read_rows(tmp_path / "list.json")
    # One object, indented: one example (it was "line 1: not valid JSON"); a {"data": [rows]} layout is named.
    (tmp_path / "one.json").write_text(json.dumps({"text": "a", "label": "x"}, indent=2))
    assert readers.read_rows(tmp_path / "one.json") == [{"text": "a", "label": "x"}]
    (tmp_path / "wrapped.json").write_text(json.dumps({"version": "1", "data": [{"text": "a"}]}, indent=1))
    with pytest.raises(ValueError, match="one JSON object whose examples are the list under 'data'"):
        readers.read_rows(tmp_path / "wrapped.json")


def test_reader_errors(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="empty"):
        readers.read_rows(tmp_path / "empty.csv")
    (tmp_path / "header.csv").write_text("text,label\n")
    with pytest.raises(ValueError, match="no examples"):
        readers.read_rows(tmp_path / "header.csv")
    (tmp_path / "latin.csv").write_bytes("text,label\ncaf\xe9,x\n".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8"):
        readers.read_rows(tmp_path / "latin.csv")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(ValueError, match="line 2"):
        readers.read_rows(tmp_path / "bad.jsonl")
    (tmp_path / "d.xlsx").write_text("x")
    with pytest.raises(ValueError, match="unknown data format"):
        readers.read_rows(tmp_path / "d.xlsx")
    with pytest.raises(ValueError, match=r"no column 'sentence'.*data.text_column=NAME"):
        readers.require_columns([{"text": "a"}], "f.csv", {"data.text_column": "sentence"})


def test_tsv_quote_marks_are_text():
    """A TSV quotes nothing (GLUE's files hold quote marks as text): a text opening with `"` must not swallow the
    rows after it, as CSV quoting would, silently."""
    text = 'text\tlabel\n"Hi there\t1\nsecond line\t0\n"Yes," she said.\t1\n5" screen\t0\n'
    rows = readers.parse_delimited(text, "d.tsv", "\t")
    assert rows == [{"text": '"Hi there', "label": "1"}, {"text": "second line", "label": "0"},
                    {"text": '"Yes," she said.', "label": "1"}, {"text": '5" screen', "label": "0"}]


def test_list_and_mapping_cells():
    assert readers.as_list('["New York", "is"]', "tokens") == ["New York", "is"]
    assert readers.as_list("B-LOC O", "tags") == ["B-LOC", "O"]
    assert readers.as_mapping('{"text": ["a"], "answer_start": [0]}', "answers") == {"text": ["a"],
                                                                                     "answer_start": [0]}
    with pytest.raises(ValueError, match="expected an object"):
        readers.as_mapping(3, "answers")


# ---------------------------------------------------------------------------------------------------------------
# Layout and truncation.

def test_pair_layout_and_truncation(tok):
    rows = encoding.encode_texts(tok, ["the cat sat"], ["the dog ran far away"], 10, True, "train.csv")
    ids = rows["input_ids"][0]
    # room 7: the longer second text loses tokens first: 3 + 4
    expected = [tok.cls_id, *tok.encode("the cat sat"), tok.sep_id, *tok.encode("the dog ran far"), tok.sep_id]
    assert list(ids[rows["segment_ids"][0] == 1]) == expected
    assert ids[0] == tok.cls_id and list(rows["token_type_ids"][0]) == [0] * 5 + [1] * 5
    with pytest.raises(ValueError, match=r"train.csv, example 1 is 11 tokens.*data.truncation=true"):
        encoding.encode_texts(tok, ["the cat sat"], ["the dog ran far away"], 10, False, "train.csv")


def test_pair_truncation_keeps_what_the_fast_tokenizers_keep():
    """Every split of a pair cut to fit equals the `tokenizers` library's longest_first (what AutoTokenizer's fast
    tokenizers do, and so what transformers sees on best/): on ties and odd rooms too, where cutting one token at
    a time from the longer text used to keep one more of the first text ((50, 50) in 61 gave (31, 30), not
    (30, 31))."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(40)]
    reference = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)} | {"[UNK]": 40}, unk_token="[UNK]"))
    reference.pre_tokenizer = pre_tokenizers.Whitespace()
    for room in range(1, 24):
        reference.enable_truncation(room, strategy="longest_first")
        for n1 in range(0, 30):
            for n2 in range(0, 30):
                if n1 + n2 == 0:
                    continue
                kept = reference.encode(" ".join(words[:n1]), " ".join(words[:n2])).sequence_ids
                first, second = encoding.fit_pair(list(range(n1)), list(range(100, 100 + n2)), room, True, "x", 0)
                assert (first, second) == (list(range(kept.count(0))), list(range(100, 100 + kept.count(1)))), \
                    (room, n1, n2)


def test_token_label_alignment_first_subtoken(tok):
    words = ["cats", "sat", "on", "mats"]  # cats -> cat ##s, mats -> mat ##s
    row, word_of_token = encoding.encode_words(tok, words, 12, True, "sentence 1")
    labels = encoding.word_labels_to_tokens(word_of_token, [1, 0, 0, 2])
    ids = row["input_ids"]
    assert list(labels[:8]) == [-100, 1, -100, 0, 0, 2, -100, -100]
    assert tok.decode(ids[1:3]) == "cats"
    words_back = encoding.token_predictions_to_words(word_of_token, labels, 4, default=0)
    assert list(words_back) == [1, 0, 0, 2]
    # Truncation: the words past the cut get the default ...
    row, word_of_token = encoding.encode_words(tok, words, 6, True, "sentence 1")
    assert list(encoding.token_predictions_to_words(word_of_token, np.arange(6), 4, default=-1)) == [1, 3, 4, -1]
    # ... and a word the cut falls inside keeps its first piece, and so its tag, as transformers' truncation does
    # (words kept whole or not at all: "mats" lost its tag).
    row, word_of_token = encoding.encode_words(tok, words, 7, True, "sentence 1")
    assert list(encoding.token_predictions_to_words(word_of_token, np.arange(7), 4, default=-1)) == [1, 3, 4, 5]
    assert tok.decode(row["input_ids"][5:6]) == "mat" and row["input_ids"][6] == tok.sep_id
    with pytest.raises(ValueError, match="data.max_length=6"):
        encoding.encode_words(tok, words, 6, False, "sentence 1")


# ---------------------------------------------------------------------------------------------------------------
# Question answering.

CONTEXT = "the cat sat on the mat , the dog ran far away , paris is in france ."


def test_offsets_cover_the_words(tok):
    ids, offsets = tok.encode_with_offsets("The cats sat.")
    assert ["The cats sat."[a:b] for a, b in offsets] == ["The", "cat", "s", "sat", "."]


def test_windows_answer_across_boundary(tok):
    answer = qa.Answer("paris is in france", CONTEXT.index("paris"))
    # question "where is paris ?" = 4 tokens; max_length 16 -> room 9 context tokens, stride 4 -> step 5
    windows = qa.make_windows(tok, "where is paris ?", CONTEXT, answer, max_length=16, doc_stride=4)
    n_context = len(tok.encode(CONTEXT))
    assert n_context == 18
    assert len(windows.input_ids) == len(qa.window_starts(18, 9, 4)) == 3  # starts 0, 5, 10
    # answer tokens 13..16: not in window 0 (0-8), cut by window 1's edge (5-13), whole in window 2 (10-17)
    assert list(windows.start_positions[:2]) == [0, 0] and list(windows.end_positions[:2]) == [0, 0]
    start, end = windows.start_positions[2], windows.end_positions[2]
    span = windows.offsets[2, start, 0], windows.offsets[2, end, 1]
    assert CONTEXT[span[0]:span[1]] == "paris is in france"
    assert tok.decode(windows.input_ids[2, start:end + 1]) == "paris is in france"
    # every window starts with the question
    assert all(list(row[1:5]) == list(tok.encode("where is paris ?")) for row in windows.input_ids)


def run_qa_labels(offsets, start_char, end_char):
    """transformers' run_qa `prepare_train_features` labels of one window, from its offsets alone: the answer's
    first and last tokens when the window's context covers [start_char, end_char), else the [CLS] index 0."""
    context = np.nonzero(offsets[:, 0] != qa.NO_OFFSET)[0]
    first, last = context[0], context[-1]
    if not (offsets[first, 0] <= start_char and offsets[last, 1] >= end_char):
        return 0, 0
    while first <= last and offsets[first, 0] <= start_char:
        first += 1
    while offsets[last, 1] >= end_char:
        last -= 1
    return first - 1, last + 1


@pytest.mark.parametrize("text, labelled", [
    ("the dog", [True, True, False]),  # tokens 7-8: ends on window 0's last token (0-8)
    ("dog ran", [False, True, False]),  # tokens 8-9: ends one token past window 0
    (", paris", [False, True, True]),  # tokens 12-13: ends on window 1's last token (5-13)
    ("paris is", [False, False, True]),  # tokens 13-14: ends one token past window 1
])
def test_windows_label_an_answer_only_when_whole_inside(tok, text, labelled):
    """An answer whose last token is a window's last context token is in that window; one that ends a token past
    it is cut, and the window is labelled [CLS] (0, 0), as transformers' run_qa labels it. Were it labelled, its
    end would fall on the row's closing [SEP] and a cut answer would become a training target."""
    answer = qa.Answer(text, CONTEXT.index(text))
    # as in test_windows_answer_across_boundary: room 9 context tokens, windows at 0, 5 and 10
    windows = qa.make_windows(tok, "where is paris ?", CONTEXT, answer, max_length=16, doc_stride=4)
    assert len(windows.input_ids) == 3
    end_char = answer.start + len(text)
    for w in range(3):
        reference = run_qa_labels(windows.offsets[w], answer.start, end_char)
        got = (int(windows.start_positions[w]), int(windows.end_positions[w]))
        assert got == reference, (w, got, reference)
        assert (got != (0, 0)) == labelled[w], (w, got)
        if labelled[w]:
            assert windows.input_ids[w, got[1]] not in tok.special_ids
            assert tok.decode(windows.input_ids[w, got[0]:got[1] + 1]).replace(" ,", ",") == text


def test_unanswerable_and_answer_not_in_context(tok):
    windows = qa.make_windows(tok, "who ran ?", CONTEXT, None, max_length=32, doc_stride=8)
    assert list(windows.start_positions) == [0] and list(windows.end_positions) == [0]
    assert qa.answer_in_context(CONTEXT, qa.Answer("dog", CONTEXT.index("dog")))
    assert not qa.answer_in_context(CONTEXT, qa.Answer("dog", 0))


def test_best_span_over_windows_and_empty_answer(tok):
    answer = qa.Answer("the dog", CONTEXT.index("the dog"))
    windows = qa.make_windows(tok, "who ran ?", CONTEXT, answer, max_length=16, doc_stride=4)
    shape = windows.input_ids.shape
    starts, ends = np.zeros(shape), np.zeros(shape)
    w = int(np.argmax(windows.start_positions > 0))
    starts[w, windows.start_positions[w]] = 5.0
    ends[w, windows.end_positions[w]] = 5.0
    ends[w, windows.start_positions[w] - 1] = 9.0  # an end before the start is never chosen
    ends[w, 1] = 20.0  # a question token is never part of an answer
    found = qa.best_span(starts, ends, windows.offsets, CONTEXT, n_best=20, max_answer_length=30, allow_empty=False)
    assert found.text == "the dog"
    short = qa.best_span(starts, ends, windows.offsets, CONTEXT, n_best=20, max_answer_length=1, allow_empty=False)
    assert short.text == ","  # one token: the end logit 9 on "," (start 0) beats "the" (5 + 0) and "dog" (0 + 5)
    starts[:, 0] = ends[:, 0] = 6.0  # [CLS] score 12 > 10: no answer, when allowed
    assert qa.best_span(starts, ends, windows.offsets, CONTEXT, n_best=20, max_answer_length=30,
                        allow_empty=True).text == ""
    assert qa.best_span(starts, ends, windows.offsets, CONTEXT, n_best=20, max_answer_length=30,
                        allow_empty=False).text == "the dog"


def test_null_score_is_the_lowest_cls_score_over_windows(tok):
    """With unanswerable questions allowed, the empty answer needs a [CLS] score above the best span's. The score
    to use is the window that most believes in an answer, i.e. the lowest [CLS] score, as transformers'
    `postprocess_qa_predictions` keeps `min_null_prediction`. Here the windows' [CLS] scores differ (12 and 2) and
    the best span scores 10: the null score is 2 and the span wins. Only when every window's [CLS] beats the span
    is the answer empty."""
    answer = qa.Answer("the dog", CONTEXT.index("the dog"))
    windows = qa.make_windows(tok, "who ran ?", CONTEXT, answer, max_length=16, doc_stride=4)
    assert len(windows.input_ids) >= 2
    starts, ends = np.zeros(windows.input_ids.shape), np.zeros(windows.input_ids.shape)
    w = int(np.argmax(windows.start_positions > 0))
    starts[w, windows.start_positions[w]] = ends[w, windows.end_positions[w]] = 5.0  # span score 10
    other = (w + 1) % len(windows.input_ids)
    starts[:, 0] = ends[:, 0] = 6.0  # [CLS] score 12 ...
    starts[other, 0] = ends[other, 0] = 1.0  # ... but 2 in another window
    found = qa.best_span(starts, ends, windows.offsets, CONTEXT, n_best=20, max_answer_length=30, allow_empty=True)
    assert (found.text, found.score) == ("the dog", 10.0)
    starts[other, 0] = ends[other, 0] = 5.5  # every window's [CLS] now beats the span: min null 11 > 10
    found = qa.best_span(starts, ends, windows.offsets, CONTEXT, n_best=20, max_answer_length=30, allow_empty=True)
    assert (found.text, found.score) == ("", 11.0)
    assert (found.null_score_diff, found.best_span_text) == (1.0, "the dog")  # the span kept for threshold search
    # transformers' null_score_diff_threshold: "" only when the null score beats the span's by more than it.
    found = qa.best_span(starts, ends, windows.offsets, CONTEXT, n_best=20, max_answer_length=30, allow_empty=True,
                         null_score_diff_threshold=1.0)
    assert (found.text, found.score, found.null_score_diff) == ("the dog", 10.0, 1.0)
    found = qa.best_span(starts, ends, windows.offsets, CONTEXT, n_best=20, max_answer_length=30, allow_empty=True,
                         null_score_diff_threshold=0.5)
    assert found.text == ""


def test_squad_v2_evaluation_reports_the_best_threshold(tok):
    """Through the task: with unanswerable questions the scores add best_f1 / best_f1_thresh (the official v2
    script's), and the threshold found gives best_f1 when set as data.null_score_diff_threshold."""
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import task_class

    answer = {"text": ["the dog"], "answer_start": [CONTEXT.index("the dog")]}
    rows = [{"id": "a", "question": "who ran ?", "context": CONTEXT, "answers": answer},
            {"id": "b", "question": "who flew ?", "context": CONTEXT, "answers": {"text": [], "answer_start": []}}]
    config = load_finetune_config(None, [], task_class("question-answering").defaults)
    task = task_class("question-answering")(config.data, config.task)
    labels = task.fit_labels(rows, "f", None)
    encoded = task.encode(tok, rows, labels, "f", with_targets=True)
    starts = np.zeros(encoded.arrays["input_ids"].shape, np.float32)
    ends = np.zeros_like(starts)
    for row, question in enumerate(encoded.arrays["window_example"]):
        offsets = encoded.arrays["offsets"][row]
        dog = int(np.argmax(offsets[:, 0] == CONTEXT.index("dog")))
        starts[row, dog] = ends[row, dog] = 2.0  # span "dog": 4
        starts[row, 0] = ends[row, 0] = 2.25 if question == 0 else 2.5  # [CLS]: 4.5 for "a", 5 for "b"
    outputs = {"start_logits": starts, "end_logits": ends}
    scores = task.metrics(outputs, encoded, labels)
    # Threshold 0: both answer "" ("a" wrong, "b" right). At 0.5 (the diff of "a") "a" answers "dog", right (the
    # article is not counted), and "b" still "": both right. Above 1 "b" answers "dog" too, wrongly.
    assert (scores["exact_match"], scores["f1"]) == (50.0, 50.0)
    assert (scores["best_f1"], scores["best_f1_thresh"], scores["best_exact"]) == (100.0, 0.5, 100.0)
    qa_task = task_class("question-answering")
    tuned = load_finetune_config(None, ["data.null_score_diff_threshold=0.5"], qa_task.defaults)
    tuned_task = qa_task(tuned.data, tuned.task)
    assert tuned_task.metrics(outputs, encoded, labels)["f1"] == 100.0


def test_best_span_ranks_context_tokens_only(tok):
    """Higher logits on the question and on padding than on any context token (training never pushes padding down)
    do not crowd the context out of the n_best: the best context span is still found, as `bertjax predict` (which
    gives padding -1e9) finds it. It used to answer "" when the n_best were all question or padding tokens."""
    answer = qa.Answer("the dog", CONTEXT.index("the dog"))
    windows = qa.make_windows(tok, "who ran ?", CONTEXT, answer, max_length=64, doc_stride=16)
    assert len(windows.input_ids) == 1 and (windows.offsets[0, :, 0] == qa.NO_OFFSET).sum() > 4
    starts, ends = np.full(windows.input_ids.shape, -0.4), np.full(windows.input_ids.shape, -0.4)
    outside = windows.offsets[:, :, 0] == qa.NO_OFFSET
    starts[outside] = ends[outside] = 0.2  # [CLS], the question, [SEP]s and padding above every context token
    starts[0, windows.start_positions[0]] = ends[0, windows.end_positions[0]] = -0.3
    found = qa.best_span(starts, ends, windows.offsets, CONTEXT, n_best=4, max_answer_length=30, allow_empty=False)
    assert found.text == "the dog"


def test_packing_places_whole_examples_in_segments(tok):
    from bertjax.finetune.packing import pack_rows

    rows = encoding.encode_texts(tok, ["the cat sat on the mat", "dog", "the red house", "far away"], None, 12,
                                 True, "f")
    rows["labels"] = np.array([0, 1, 0, 1], np.int32)
    packed = pack_rows(rows, tok.pad_id)
    # lengths 8, 3, 5, 4 with specials; rows of 12: [8 + 3], [5 + 4]
    assert packed["slot_example"].tolist() == [[0, 1], [2, 3]]
    assert packed["labels"].tolist() == [[0, 1], [0, 1]]
    assert packed["segment_ids"][0].tolist() == [1] * 8 + [2] * 3 + [0]
    assert packed["segment_ids"][1].tolist() == [1] * 5 + [2] * 4 + [0] * 3
    second = packed["input_ids"][0, 8:11]
    assert second.tolist() == rows["input_ids"][1, :3].tolist()  # [CLS] dog [SEP], unchanged
    # In another order (training files are packed shuffled): best fit over 5, 4, 8, 3 -> [5 + 4 + 3], [8]
    reordered = pack_rows(rows, tok.pad_id, np.array([2, 3, 0, 1]))
    assert reordered["slot_example"].tolist() == [[2, 3, 1], [0, -1, -1]]
    assert reordered["labels"].tolist() == [[0, 1, 1], [0, 0, 0]]


# ---------------------------------------------------------------------------------------------------------------
# Run config.

def test_presets_spell_out_the_task_defaults():
    from pathlib import Path

    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import TASKS

    presets = Path(__file__).parent.parent / "configs" / "finetune"
    for name, task in TASKS.items():
        assert load_finetune_config(presets / f"{name}.yaml") == load_finetune_config(None, [], task.defaults), name


def test_config_errors_name_the_key():
    from bertjax.finetune.config import ConfigError, load_finetune_config

    for override, message in [("train.epoch=3", "unknown key train.epoch"),
                              ("train.learning_rate=fast", "train.learning_rate must be a number"),
                              ("train.warmup_ratio=2", r"train.warmup_ratio must be in \[0, 1\]"),
                              ("data.max_length=0", "data.max_length must be positive"),
                              ("task.problem_type=ranking", "task.problem_type must be one of")]:
        with pytest.raises(ConfigError, match=message):
            load_finetune_config(None, [override])
    config = load_finetune_config(None, ["data.text_column=sentence", "train.learning_rate=1e-4"])
    assert config.data.text_column == "sentence" and config.train.learning_rate == 1e-4


def test_demo_dataset_is_labelled_split_and_stable(tmp_path):
    from bertjax.finetune import demo_data
    from bertjax.finetune.readers import read_rows

    counts = demo_data.write_dataset(tmp_path / "a")
    assert counts["train"] > 300 and counts["validation"] > 50
    train, validation = read_rows(tmp_path / "a" / "train.jsonl"), read_rows(tmp_path / "a" / "validation.jsonl")
    assert {r["label"] for r in train} == {r["label"] for r in validation} == set(demo_data.PACKAGES)
    assert not {r["text"] for r in train} & {r["text"] for r in validation}
    demo_data.write_dataset(tmp_path / "b")
    assert (tmp_path / "a" / "train.jsonl").read_bytes() == (tmp_path / "b" / "train.jsonl").read_bytes()


def test_demo_dataset_leaves_out_a_package_the_interpreter_lacks(tmp_path, monkeypatch, caplog):
    """Some Linux distributions package tkinter apart: the dataset is written without that label, with a warning; with
    fewer than two packages there is nothing to classify, an error naming what is there."""
    from bertjax.finetune import demo_data
    from bertjax.finetune.readers import read_rows

    monkeypatch.setattr(demo_data, "PACKAGES", ("logging", "xml", "no_such_package"))
    with caplog.at_level("WARNING", logger=demo_data.__name__):
        demo_data.write_dataset(tmp_path)
    assert "lacks ['no_such_package']: the dataset has 2 labels" in caplog.text
    assert {r["label"] for r in read_rows(tmp_path / "train.jsonl")} == {"logging", "xml"}
    monkeypatch.setattr(demo_data, "PACKAGES", ("logging", "no_such_package"))
    with pytest.raises(RuntimeError, match=r"sources of \['logging'\] only: fewer than two"):
        demo_data.write_dataset(tmp_path / "b")
    assert not (tmp_path / "b").exists()


# ---------------------------------------------------------------------------------------------------------------
# Label spaces and losses of the tasks (no model needed).

def _classification(**task):
    from bertjax.finetune.config import FinetuneDataConfig, FinetuneTaskConfig
    from bertjax.finetune.tasks import task_class

    return task_class("sequence-classification")(FinetuneDataConfig(), FinetuneTaskConfig(**task))


def test_labels_integers_strings_and_regression():
    rows = lambda labels: [{"text": "a", "label": v} for v in labels]
    assert _classification().fit_labels(rows(["10", "2", "2.0"]), "f", None).names == ("2", "10")
    assert _classification().fit_labels(rows(["pos", "neg"]), "f", None).names == ("neg", "pos")
    assert _classification().fit_labels(rows(["0.5", "3.2"]), "f", None).regression
    assert _classification(num_labels=1).fit_labels(rows(["0", "1"]), "f", None).regression
    with pytest.raises(ValueError, match="needs at least two classes"):
        _classification().fit_labels(rows(["x", "x"]), "f", None)
    with pytest.raises(ValueError, match="regression needs numeric labels"):
        _classification(problem_type="regression").fit_labels(rows(["x", "1"]), "f", None)
    with pytest.raises(ValueError, match=r"row 2: the label \(column 'label'\) is empty"):  # a CSV's empty cell
        _classification().fit_labels(rows(["3.8", "", "1.25"]), "f", None)


def test_labels_written_as_decimals_are_classes_with_a_note_and_problem_type_decides():
    rows = lambda labels: [{"text": "a", "label": v} for v in labels]  # noqa: E731
    ratings = _classification().fit_labels(rows([1.0, 5.0, 3.0]), "f", None)  # JSONL floats
    assert ratings.names == ("1", "3", "5") and not ratings.regression
    assert len(ratings.notes) == 1 and "task.problem_type=regression" in ratings.notes[0]
    assert _classification().fit_labels(rows(["1", "0"]), "f", None).notes == ()  # integers: nothing to say
    assert _classification(problem_type="regression").fit_labels(rows(["1.0", "5.0"]), "f", None).regression
    # Asked for classes, numbers with fractions are classes too (they were regressed whatever problem_type said).
    halves = _classification(problem_type="single_label_classification").fit_labels(rows(["0.5", "1.5"]), "f", None)
    assert halves.names == ("0.5", "1.5") and not halves.regression and halves.notes == ()
    three = _classification(num_labels=3).fit_labels(rows(["0.5", "1.5", "2.5"]), "f", None)  # num_labels says so
    assert three.names == ("0.5", "1.5", "2.5") and not three.regression
    for bad in ("nan", "inf"):  # a CSV cell pandas would not read as a number to learn
        with pytest.raises(ValueError, match=f"row 2: regression needs a finite label, got '{bad}'"):
            _classification().fit_labels(rows(["0.5", bad]), "f", None)


def test_labels_keep_a_checkpoints_order_up_to_case_and_placeholder_names():
    """roberta-large-mnli's CONTRADICTION, NEUTRAL, ENTAILMENT against GLUE's lowercase gold labels: sorted, the
    file's labels put "entailment" on the row that means NEUTRAL, and the head was kept (its shape fits)."""
    from bertjax.finetune.tasks.base import same_labels

    rows = lambda labels: [{"text": "a", "label": v} for v in labels]  # noqa: E731
    mnli = ("CONTRADICTION", "NEUTRAL", "ENTAILMENT")
    names = _classification().fit_labels(rows(["entailment", "neutral", "contradiction"]), "f", mnli).names
    assert names == ("contradiction", "neutral", "entailment") and same_labels(names, mnli)
    partial = _classification().fit_labels(rows(["neutral", "contradiction"]), "f", mnli).names
    assert partial == ("contradiction", "neutral", "ENTAILMENT")  # a file without one class keeps its row
    placeholders = _classification().fit_labels(rows(["1", "0", "1"]), "f", ("LABEL_0", "LABEL_1")).names
    assert placeholders == ("0", "1") and same_labels(placeholders, ("LABEL_0", "LABEL_1"))
    other = _classification().fit_labels(rows(["pos", "neg"]), "f", ("positive", "negative")).names
    assert other == ("neg", "pos") and not same_labels(other, ("positive", "negative"))
    clash = _classification().fit_labels(rows(["Yes", "yes", "no"]), "f", ("yes", "no")).names  # two spellings
    assert clash == ("Yes", "no", "yes")
    exact = _classification().fit_labels(rows(["pos", "POS", "neg"]), "f", ("pos", "POS", "neg")).names
    assert exact == ("pos", "POS", "neg") and same_labels(exact, ("pos", "POS", "neg"))  # its own names: kept


def test_losses_match_their_definitions(tok):
    import types

    import jax.numpy as jnp

    task = _classification()
    logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    batch = {"labels": jnp.array([0, 0, 1]), "weight": jnp.array([1.0, 1.0, 0.0])}  # third row is padding
    total, count = task.loss_sums(types.SimpleNamespace(logits=logits), batch)
    expected = np.log1p(np.exp(-2.0)) + np.log1p(np.exp(1.0))
    assert float(count) == 2 and float(total) == pytest.approx(expected, rel=1e-6)
    regression = {"labels": jnp.array([1.0, 3.0]), "weight": jnp.array([1.0, 1.0])}
    total, count = task.loss_sums(types.SimpleNamespace(logits=jnp.array([[2.0], [0.0]])), regression)
    assert float(total) / float(count) == pytest.approx((1 + 9) / 2)


def test_token_classification_loss_is_the_mean_over_labelled_tokens():
    """The loss is the mean over the tokens that carry a tag (each word's first sub-token), as transformers'
    cross entropy with ignore_index=-100 takes it. Later sub-tokens, specials and padding positions (IGNORE)
    and padding rows (weight 0) are in neither the sum nor the count. Counting them would dilute the reported
    loss and any loss-based early stopping by the share of unlabelled positions."""
    import types

    import jax.numpy as jnp

    from bertjax.finetune.config import FinetuneDataConfig, FinetuneTaskConfig
    from bertjax.finetune.encoding import IGNORE
    from bertjax.finetune.tasks import task_class

    task = task_class("token-classification")(FinetuneDataConfig(), FinetuneTaskConfig())
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 6, 4)).astype(np.float32)
    labels = np.array([[IGNORE, 2, IGNORE, 0, IGNORE, IGNORE],  # [CLS] w ##sub w [SEP] pad
                       [IGNORE, 1, 3, 3, IGNORE, IGNORE],
                       [IGNORE, 1, 2, IGNORE, IGNORE, IGNORE]], np.int32)  # a padding row: weight 0
    batch = {"labels": jnp.asarray(labels), "weight": jnp.array([1.0, 1.0, 0.0])}
    total, count = task.loss_sums(types.SimpleNamespace(logits=jnp.asarray(logits)), batch)
    kept = labels[:2] >= 0
    log_probs = logits[:2].astype(np.float64) - np.log(np.exp(logits[:2].astype(np.float64)).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, np.maximum(labels[:2], 0)[..., None], -1)[..., 0]
    assert float(count) == kept.sum() == 5
    assert float(total) / float(count) == pytest.approx(-picked[kept].mean(), rel=1e-5)
    try:
        import torch
    except ImportError:
        return
    reference = torch.nn.functional.cross_entropy(torch.from_numpy(logits[:2]).reshape(-1, 4),
                                                  torch.from_numpy(labels[:2]).long().reshape(-1), ignore_index=IGNORE)
    assert float(total) / float(count) == pytest.approx(float(reference), rel=1e-5)


def test_question_answering_loss_is_over_present_tokens_only():
    import types

    import jax.numpy as jnp

    from bertjax.finetune.config import FinetuneDataConfig, FinetuneTaskConfig
    from bertjax.finetune.tasks import task_class

    task = task_class("question-answering")(FinetuneDataConfig(max_length=32, doc_stride=8), FinetuneTaskConfig())
    rng = np.random.default_rng(0)
    start, end = rng.normal(size=(2, 5)).astype(np.float32), rng.normal(size=(2, 5)).astype(np.float32)
    batch = {"segment_ids": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), "start_positions": np.array([1, 0]),
             "end_positions": np.array([3, 2]), "weight": np.array([1.0, 1.0], np.float32)}

    def reference(logits, labels, length):  # numpy: softmax over the row's first `length` (present) tokens
        row = logits[:length].astype(np.float64)
        return np.log(np.exp(row).sum()) - row[labels]

    expected = sum((reference(start[r], batch["start_positions"][r], n)
                    + reference(end[r], batch["end_positions"][r], n)) / 2 for r, n in enumerate((5, 3)))
    total, count = task.loss_sums(types.SimpleNamespace(start_logits=jnp.asarray(start),
                                                        end_logits=jnp.asarray(end)), batch)
    assert float(count) == 2 and float(total) == pytest.approx(expected, rel=1e-6)
    # Whatever the padding's logits are, the loss is the same: it depends on the tokens, not on the padding.
    start[1, 3:], end[1, 3:] = 50.0, -50.0
    total, _ = task.loss_sums(types.SimpleNamespace(start_logits=jnp.asarray(start), end_logits=jnp.asarray(end)),
                              batch)
    assert float(total) == pytest.approx(expected, rel=1e-6)
    # Labels that point at no present token (-1, past the window, or at padding) leave the sum and the count, start
    # and end each on its own, as transformers' ignored positions do: row 1's start and row 0's end drop out.
    for start_label, end_label in ((-1, 7), (4, 5), (3, 9)):
        odd = dict(batch, start_positions=np.array([1, start_label]), end_positions=np.array([end_label, 2]))
        total, count = task.loss_sums(types.SimpleNamespace(start_logits=jnp.asarray(start),
                                                            end_logits=jnp.asarray(end)), odd)
        kept = reference(start[0], 1, 5) + reference(end[1], 2, 3)
        assert float(count) == 1 and float(total) == pytest.approx(kept / 2, rel=1e-6)


def test_task_input_errors_and_counted_skips(tok):
    from bertjax.finetune.config import FinetuneDataConfig, FinetuneTaskConfig
    from bertjax.finetune.tasks import Labels, task_class

    data = FinetuneDataConfig(max_length=32, doc_stride=8)
    qa_task = task_class("question-answering")(data, FinetuneTaskConfig())
    good = {"question": "who ran ?", "context": CONTEXT, "answers": {"text": ["dog"], "answer_start": [
        CONTEXT.index("dog")]}}
    wrong = {"question": "who ran ?", "context": CONTEXT, "answers": {"text": ["cat"], "answer_start": [0]}}
    unanswerable = {"question": "who ?", "context": CONTEXT, "answers": {"text": [], "answer_start": []}}
    labels = qa_task.fit_labels([good, wrong, unanswerable], "train.jsonl", None)
    assert labels.unanswerable
    train = qa_task.encode(tok, [good, wrong, unanswerable], labels, "train.jsonl", with_targets=True, training=True)
    assert len(train.examples) == 2 and "1 of 3 questions have no answer text at their answer_start" in train.notes[0]
    assert "skipped for training" in train.notes[0]
    validation = qa_task.encode(tok, [good, wrong], labels, "dev.jsonl", with_targets=True)
    assert len(validation.examples) == 2 and "kept, scored against their gold texts" in validation.notes[0]

    tagger = task_class("token-classification")(data, FinetuneTaskConfig())
    tags = tagger.fit_labels([{"tokens": ["the", "cat"], "tags": ["O", "B-ANIMAL"]}], "train.jsonl", None)
    assert tags.names == ("O", "B-ANIMAL")
    with pytest.raises(ValueError, match=r"dev.jsonl, row 1, word 1: label 'B-PLACE' in column 'tags' does not occur"):
        tagger.encode(tok, [{"tokens": ["paris"], "tags": ["B-PLACE"]}], tags, "dev.jsonl", with_targets=True)
    with pytest.raises(ValueError, match="2 words but 1 tags"):
        tagger.fit_labels([{"tokens": ["the", "cat"], "tags": ["O"]}], "train.jsonl", None)

    classifier = task_class("sequence-classification")(FinetuneDataConfig(max_length=6, truncation=False),
                                                       FinetuneTaskConfig())
    with pytest.raises(ValueError, match=r"train.jsonl, example 1 is 8 tokens, longer than data.max_length=6"):
        classifier.encode(tok, [{"text": "the cat sat on the mat", "label": "a"}], Labels(names=("a", "b")),
                          "train.jsonl", with_targets=True)
    with pytest.raises(ValueError, match=r"no column 'text'.*data.text_column=NAME"):
        classifier.fit_labels([{"sentence": "x", "label": "a"}], "train.jsonl", None)
    chooser = task_class("multiple-choice")(FinetuneDataConfig(max_length=8, truncation=False), FinetuneTaskConfig())
    rows = [{"question": "what", "choices": ["paris", "france", "rome"], "label": 0},
            {"question": "who ran", "choices": ["the dog", "a cat", "the big red cat sat on the mat"], "label": 0}]
    with pytest.raises(ValueError, match=r"dev.jsonl, row 2, choice 3 is 13 tokens, longer than data.max_length=8"):
        chooser.encode(tok, rows, Labels(names=()), "dev.jsonl", with_targets=True)

    # Values of the wrong kind name the file and row: a validation label of a regression, an answer offset.
    with pytest.raises(ValueError, match=r"dev.jsonl, row 2: regression needs a numeric label, got 'abc'"):
        classifier.encode(tok, [{"text": "a", "label": 0.5}, {"text": "b", "label": "abc"}], Labels(regression=True),
                          "dev.jsonl", with_targets=True)
    offset = {**good, "answers": {"text": ["dog"], "answer_start": ["x"]}}
    with pytest.raises(ValueError, match=r"answers.answer_start holds 'x', not a character offset"):
        qa_task.fit_labels([good, offset], "train.jsonl", None)
    as_written = {**good, "answers": {"text": ["dog"], "answer_start": [f"{CONTEXT.index('dog')}"]}}
    assert len(qa_task.encode(tok, [as_written], labels, "t.jsonl", with_targets=True).examples) == 1


def test_jsonl_lines_end_at_line_feeds_only(tmp_path):
    """U+2028, U+2029 and U+0085 are allowed unescaped inside JSON strings: they are text, not line ends (as
    str.splitlines would have them); Windows line ends are read too."""
    rows = [{"text": "one\u2028two", "label": "a"}, {"text": "three\u2029four\u0085five", "label": "b"}]
    path = tmp_path / "d.jsonl"
    path.write_bytes("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode() + b"\r\n")
    assert readers.read_rows(path) == rows
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n\n{"text": \n')
    with pytest.raises(ValueError, match="bad.jsonl, line 3: not valid JSON"):
        readers.read_rows(tmp_path / "bad.jsonl")


def test_text_pair_is_decided_per_row(tok):
    """Rows with and without text_pair in one file (either first): each row is laid out as the tokenizer lays out
    that example alone, one text or two; a null pair is no pair. Training and predict share this encoding."""
    task = _classification()
    rows = [{"text": "the cat sat"}, {"text": "the dog", "text_pair": "ran far away"}, {"text": "paris",
            "text_pair": None}, {"text": "", "text_pair": "the mat"}]
    for order in (rows, rows[1:] + rows[:1]):
        got = task.encode(tok, order, Labels(names=("a", "b")), "dev.jsonl", with_targets=False).arrays
        for i, row in enumerate(order):
            pair = row.get("text_pair")
            alone = encoding.encode_texts(tok, [row["text"]], None if pair is None else [pair], 128, True, "x")
            for key in ("input_ids", "token_type_ids", "segment_ids"):
                np.testing.assert_array_equal(got[key][i], alone[key][0], err_msg=f"{key} {row}")


def test_a_pair_model_refuses_rows_without_their_second_text(tok):
    """Trained on (premise, hypothesis) in every row, a model given a file whose text_pair column is missing (named
    otherwise: GLUE's sentence2) predicted from the first texts alone, exit 0. The training file's layout is in
    the labels (finetune.json records it); files of single texts, or of some pairs, stay free."""
    task = _classification()
    pairs = [{"text": "the cat", "text_pair": "sat", "label": "a"}, {"text": "the dog", "text_pair": "ran",
                                                                       "label": "b"}]
    singles = [{"text": "the cat", "label": "a"}, {"text": "the dog", "label": "b"}]
    labels = task.fit_labels(pairs, "train.jsonl", None)
    assert labels.text_pairs == "all"
    assert task.fit_labels(singles, "f", None).text_pairs == "none"
    assert task.fit_labels([pairs[0], singles[1]], "f", None).text_pairs == "some"
    assert task.fit_labels([{**r, "label": 0.5} for r in pairs], "f", None).text_pairs == "all"  # regression too
    with pytest.raises(ValueError, match=r"dev.tsv: no row has a second text in column 'text_pair' "
                                         r"\(data.text_pair_column\), but the model was trained on a text pair"):
        task.encode(tok, [{"text": "the cat", "sentence2": "sat"}], labels, "dev.tsv", with_targets=False)
    task.encode(tok, [pairs[0], {"text": "the dog"}], labels, "dev.tsv", with_targets=False)  # some: as written
    single = Labels(names=("a", "b"), text_pairs="none")  # a single-text model given pairs: read, and said
    assert task.encode(tok, pairs, single, "dev.tsv", with_targets=False).notes == [
        "dev.tsv: 2 of 2 rows have a second text (column 'text_pair'), but the model was trained on single texts: "
        "they are read as pairs"]
    assert task.encode(tok, singles, single, "dev.tsv", with_targets=False).notes == []


def test_null_cells_are_errors_naming_file_row_and_column(tok):
    """A null or missing text is an error naming the file, row and column (and the key that renames it), never the
    text "None"; in every task, for training labels too."""
    from bertjax.finetune.config import FinetuneDataConfig, FinetuneTaskConfig
    from bertjax.finetune.tasks import task_class

    labels = Labels(names=("a", "b"))
    classifier = _classification()
    with pytest.raises(ValueError, match=r"^in.jsonl, row 2: column 'text' is null; .*data.text_column=NAME"):
        classifier.encode(tok, [{"text": "the cat"}, {"text": None}], labels, "in.jsonl", with_targets=False)
    with pytest.raises(ValueError, match=r"^in.parquet, row 1: column 'text' is null"):  # pandas' NaN null
        classifier.encode(tok, [{"text": float("nan")}], labels, "in.parquet", with_targets=False)
    with pytest.raises(ValueError, match=r"^train.jsonl, row 2: the label \(column 'label'\) is null"):
        classifier.fit_labels([{"text": "a", "label": "x"}, {"text": "b", "label": None}, {"text": "c", "label": "y"}],
                              "train.jsonl", None)
    data = FinetuneDataConfig(max_length=32, doc_stride=8)
    qa_task = task_class("question-answering")(data, FinetuneTaskConfig())
    with pytest.raises(ValueError, match=r"^q.jsonl, row 1: column 'question' is null; .*data.question_column"):
        qa_task.encode(tok, [{"question": None, "context": CONTEXT}], Labels(), "q.jsonl", with_targets=False)
    predicted = qa_task.encode(tok, [{"question": "who", "context": CONTEXT, "id": None}], Labels(), "q.jsonl",
                               with_targets=False)
    assert predicted.examples[0].id == "0"  # an optional id: the row index, not "None"
    tagger = task_class("token-classification")(data, FinetuneTaskConfig())
    with pytest.raises(ValueError, match=r"^t.jsonl, row 1, tokens: item 2 is null, not a text"):
        tagger.encode(tok, [{"tokens": ["the", None]}], Labels(names=("O",)), "t.jsonl", with_targets=False)
    chooser = task_class("multiple-choice")(data, FinetuneTaskConfig())
    with pytest.raises(ValueError, match=r"^m.jsonl, row 1, choices: item 1 is null"):
        chooser.encode(tok, [{"question": "who", "choices": [None, "cat"]}], Labels(), "m.jsonl", with_targets=False)
    with pytest.raises(ValueError, match=r"^m.jsonl, row 1: column 'question' is null"):
        chooser.encode(tok, [{"question": None, "choices": ["a", "cat"]}], Labels(), "m.jsonl", with_targets=False)


def test_sentencepiece_offsets_are_character_offsets(tmp_path):
    """SentencePiece reports byte offsets; multi-byte characters (byte-fallback pieces) map to one character."""
    from pydoc_data.topics import topics

    from bertjax.data import load_tokenizer
    from bertjax.data.tokenizer_training import train_sentencepiece

    train_sentencepiece([topics[name] for name in sorted(topics)][:20], tmp_path, vocab_size=600, model_type="bpe")
    sp = load_tokenizer(tmp_path)
    text = "Héllo  wörld, the café"
    ids, offsets = sp.encode_with_offsets(text)
    assert ids.tolist() == sp.encode(text).tolist()
    pieces = "".join(text[a:b] for a, b in offsets)
    assert pieces == text.replace(" ", "")  # every visible character exactly once, spaces trimmed
    assert all(a <= b for a, b in offsets) and offsets.max() <= len(text)


def test_words_of_byte_level_bpe_start_with_word_initial_pieces(tmp_path):
    from tokenizers import ByteLevelBPETokenizer

    from bertjax.data import load_tokenizer

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator([CONTEXT] * 20, vocab_size=300, show_progress=False,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    trainer.save(str(tmp_path / "tokenizer.json"))
    bpe = load_tokenizer(tmp_path)
    words = ["the", "dog", "ran", "far"]
    row, word_of_token = encoding.encode_words(bpe, words, 16, True, "sentence")
    firsts = row["input_ids"][word_of_token >= 0]
    assert bool(np.all(bpe.word_start[firsts]))  # each word's first piece is a word-initial ("Ġ") piece
    # the same ids as the sentence in running text, after its first word
    assert row["input_ids"][2:1 + len(words)].tolist() == bpe.encode("the dog ran far")[1:].tolist()
    # As transformers' add_prefix_space (is_split_into_words): an empty word has no token and a word that starts
    # with a space gets none added; they were " " (a token, a position, a tag) and "  " (two tokens).
    words = ["the", "", " ", "dog"]
    row, word_of_token = encoding.encode_words(bpe, words, 16, True, "sentence")
    expected = [int(t) for piece in bpe.encode_batch([" the", " ", " dog"]) for t in piece]
    assert row["input_ids"][1:1 + len(expected)].tolist() == expected
    assert int(row["segment_ids"].sum()) == 2 + len(expected)
    assert word_of_token[word_of_token >= 0].tolist() == [0, 2, 3]


def test_encoders_count_the_examples_they_cut(tok):
    """What `bertjax predict` warns about: an example counts when any of its tokens were cut to data.max_length
    (an exact fit does not); a multiple-choice question counts once, whichever of its choices was cut."""
    from bertjax.finetune.config import FinetuneDataConfig, FinetuneTaskConfig
    from bertjax.finetune.tasks import task_class

    _, cut = encoding.encode_texts_and_cuts(tok, ["the cat sat on the mat", "dog", "the red house"], None, 8, True,
                                            "x")
    assert cut.tolist() == [False, False, False]  # 6 + [CLS] [SEP] = 8 fits exactly
    _, cut = encoding.encode_texts_and_cuts(tok, ["the cat sat on the mat .", "dog"], ["far away", None], 8, True,
                                            "x")
    assert cut.tolist() == [True, False]
    choice = task_class("multiple-choice")(FinetuneDataConfig(max_length=8), FinetuneTaskConfig())
    rows = [{"question": "who ran", "choices": ["the dog", "the big red cat sat on the mat"], "label": 0},
            {"question": "what", "choices": ["paris", "france"], "label": 1}]
    assert choice.encode(tok, rows, Labels(names=()), "x", with_targets=True).truncated == 1


def test_head_settings_take_the_run_config_over_the_checkpoint():
    """task.classifier_pooling / task.classifier_dropout set the new head (a ModernBERT classifier pooled by the
    mean); unset, the checkpoint's values stay; a token-level head refuses a pooling it would ignore."""
    from bertjax.config import TaskConfig
    from bertjax.finetune.config import FinetuneDataConfig, FinetuneTaskConfig, load_finetune_config
    from bertjax.finetune.tasks import Labels, task_class
    from bertjax.train.run_config import ConfigError

    checkpoint = TaskConfig(classifier_dropout=0.2, classifier_pooling="cls")
    labels = Labels(names=("neg", "pos"))
    config = load_finetune_config(None, ["task.classifier_pooling=mean", "task.classifier_dropout=0.0"])
    settings = task_class("sequence-classification")(config.data, config.task).head_settings(labels, checkpoint)
    assert (settings.classifier_pooling, settings.classifier_dropout, settings.labels) == ("mean", 0.0, labels.names)
    kept = _classification().head_settings(labels, checkpoint)
    assert (kept.classifier_pooling, kept.classifier_dropout, kept.problem_type) == (
        "cls", 0.2, "single_label_classification")
    tags = task_class("token-classification")(FinetuneDataConfig(), FinetuneTaskConfig()).head_settings(
        Labels(names=("O", "B-X")), checkpoint)
    assert (tags.num_labels, tags.labels, tags.classifier_dropout) == (2, ("O", "B-X"), 0.2)
    with pytest.raises(ConfigError, match="task.classifier_pooling: the token-classification head predicts per token"):
        task_class("token-classification")(FinetuneDataConfig(), FinetuneTaskConfig(classifier_pooling="mean"))
    with pytest.raises(ConfigError, match=r"task.classifier_dropout must be in \[0, 1\)"):
        load_finetune_config(None, ["task.classifier_dropout=1.5"])


def test_a_question_cut_to_half_a_row_is_counted_and_said(tok):
    """Contexts are read whole in windows, but a question longer than half of data.max_length loses its end:
    counted as truncated, so `bertjax predict` warns, with the question as the cause."""
    from bertjax.finetune.config import FinetuneDataConfig, FinetuneTaskConfig
    from bertjax.finetune.prediction import truncation_warning
    from bertjax.finetune.tasks import task_class

    task = task_class("question-answering")(FinetuneDataConfig(max_length=16, doc_stride=4), FinetuneTaskConfig())
    rows = [{"id": "short", "question": "who ran ?", "context": CONTEXT},
            {"id": "long", "question": "who ran " * 8 + "?", "context": CONTEXT}]
    encoded = task.encode(tok, rows, Labels(), "q.jsonl", with_targets=False)
    assert encoded.truncated == 1
    from bertjax.config import get_config

    warning = truncation_warning(task, encoded, "q.jsonl", get_config("bert-tiny"))
    assert warning.startswith("q.jsonl: 1 of 2 examples have a question longer than half of data.max_length=16")
