"""Document sources: formats, the held-out split, and bad inputs (clear errors or counted skips)."""

import json

import numpy as np
import pytest

from bertjax.data.default_corpus import _comment_prose, _docstrings, in_split
from bertjax.data.sources import InMemorySource, open_documents


def documents(source):
    return [source[i] for i in range(len(source))]


def test_text_lines_and_paragraphs(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("first line\nsecond line\n\nthird, after a blank\n")
    assert documents(open_documents(str(path), split="all")) == ["first line", "second line", "third, after a blank"]
    paragraphs = open_documents(str(path), split="all", text_format="paragraphs")
    assert documents(paragraphs) == ["first line\nsecond line", "third, after a blank"]


def test_bad_documents_are_skipped_and_counted(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"good one\n   \n\xff\xfe not utf-8\ngood two\n")
    (tmp_path / "empty.txt").write_bytes(b"")
    # A lone surrogate escape is valid JSON that no UTF-8 text holds (web dumps have them; json.dumps writes them).
    # 4 malformed lines among 45: a stray few are skipped (more than 10% refuse the file, below).
    fillers = [f"json filler {i}" for i in range(37)]
    (tmp_path / "b.jsonl").write_text('{"text": "json one"}\nnot json\n{"other": 1}\n{"text": 5}\n'
                                      '{"text": "  "}\n[1, 2]\n{"text": "json two"}\n{"text": "broken \\ud800 here"}\n'
                                      + "".join(json.dumps({"text": f}) + "\n" for f in fillers))
    source = open_documents(str(tmp_path), split="all")
    assert sorted(documents(source)) == sorted(["good one", "good two", "json one", "json two"] + fillers)
    skipped = source.stats.skipped
    assert skipped == {"empty_document": 2, "invalid_utf8": 2, "empty_file": 1, "not_json": 1,
                       "missing_field_text": 2, "field_text_not_text": 1}
    report = source.stats.report()
    assert "a.txt:3: invalid_utf8" in report and "b.jsonl:2: not_json" in report
    train = open_documents(str(tmp_path), split="train")  # the split hashes each text's UTF-8 bytes
    assert set(documents(train)) <= set(documents(source)) and len(documents(train)) > 30
    # Lines of another schema (the text under another key): 380 of 400 documents were skipped, exit 0.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "c.jsonl").write_text("".join(json.dumps({"content": f"doc {i}"}) + "\n" for i in range(40))
                                                + json.dumps({"text": "one with the field"}) + "\n")
    with pytest.raises(ValueError, match=r"c.jsonl': 40 of its 41 lines are not JSON objects with a text field "
                                         r"\(missing_field_text 40; .* the first at .*c.jsonl:1\); name the field"):
        open_documents(str(tmp_path / "other"), split="all")


def test_a_file_named_twice_is_read_once(tmp_path, monkeypatch):
    """A relative and an absolute spelling, a symlink, and the directory holding it name one file: its documents
    are read once (they used to be read once per spelling, doubling the corpus)."""
    (tmp_path / "corp").mkdir()
    (tmp_path / "corp" / "a.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "link.txt").symlink_to(tmp_path / "corp" / "a.txt")
    monkeypatch.chdir(tmp_path)
    inputs = f"corp/a.txt,{tmp_path / 'corp' / 'a.txt'},link.txt,corp"
    assert sorted(documents(open_documents(inputs, split="all"))) == ["one", "three", "two"]


def test_jsonl_field_and_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"body": f"doc {i}"}) for i in range(3)))
    assert documents(open_documents(str(tmp_path / "d.jsonl"), split="all", text_field="body")) == \
        ["doc 0", "doc 1", "doc 2"]
    pq.write_table(pa.table({"content": ["p one", None, "", "p two"]}), tmp_path / "d.parquet")
    parquet = open_documents(str(tmp_path / "d.parquet"), split="all", text_field="content")
    assert documents(parquet) == ["p one", "p two"]
    assert parquet.stats.skipped == {"empty_document": 2}
    with pytest.raises(ValueError, match="has no column 'text'"):
        open_documents(str(tmp_path / "d.parquet"), split="all")


def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_documents(str(tmp_path / "missing.txt"))
    with pytest.raises(FileNotFoundError, match="no file matches"):
        open_documents(str(tmp_path / "*.txt"))
    (tmp_path / "table.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown file type .*table.csv"):
        open_documents(str(tmp_path / "table.csv"))
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match="^no documents .*2 empty_document"):  # split "all": not "no all documents"
        open_documents(str(tmp_path / "blank.txt"), split="all")
    with pytest.raises(ValueError, match="split"):
        open_documents(str(tmp_path / "blank.txt"), split="test")
    (tmp_path / "sub").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no file of a known type"):
        open_documents(str(tmp_path / "sub"))
    # A directory's shards in forms this cannot read were dropped without a word (2 of 3 shards, exit 0).
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "shard0.txt").write_text("one document\n")
    (shards / "shard1.txt.gz").write_bytes(b"\x1f\x8b")
    (shards / "shard2.json").write_text('{"text": "another"}\n')
    (shards / "README.md").write_text("not data: passed over\n")
    with pytest.raises(ValueError, match=r"holds files this cannot read as documents: .*shard1.txt.gz, "
                                         r".*shard2.json\. Readable: .txt"):
        open_documents(str(shards), split="all")
    assert documents(open_documents(str(shards / "*.txt"), split="all")) == ["one document"]
    # A Hugging Face dataset snapshot: its metadata JSON (one line) and README are not data; its Parquet is read.
    import pyarrow as pa
    import pyarrow.parquet as pq

    snapshot = tmp_path / "snapshot"
    (snapshot / "data").mkdir(parents=True)
    (snapshot / "README.md").write_text("---\nlicense: cc\n---\n")
    (snapshot / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}))
    (snapshot / "notes.json").write_text(json.dumps({"about": "the corpus"}, indent=2))  # one document, not lines
    pq.write_table(pa.table({"text": ["a parquet document", "another one"]}), snapshot / "data" / "train.parquet")
    assert sorted(documents(open_documents(str(snapshot), split="all"))) == ["a parquet document", "another one"]
    (snapshot / "data" / "extra.json").write_text('{"text": "lines"}\n{"text": "of json"}\n')
    with pytest.raises(ValueError, match=r"extra.json\. Readable: .* glob such as '.*\*\*/\*\.parquet'"):
        open_documents(str(snapshot), split="all")


def test_hash_split_is_disjoint_stable_and_format_independent(tmp_path):
    texts = [f"document number {i} with some words" for i in range(2000)]
    train = InMemorySource(texts, split="train", eval_fraction=0.1)
    held = InMemorySource(texts, split="eval", eval_fraction=0.1)
    assert set(documents(train)).isdisjoint(documents(held))
    assert len(train) + len(held) == len(texts)
    assert abs(len(held) / len(texts) - 0.1) < 0.02
    assert train.stats.other_split == len(held)
    # The same text lands in the same split from a text file, whatever its position.
    (tmp_path / "c.txt").write_text("\n".join(reversed(texts)))
    from_file = open_documents(str(tmp_path / "c.txt"), split="eval", eval_fraction=0.1)
    assert sorted(documents(from_file)) == sorted(documents(held))
    assert all(in_split(t, "eval", 0.1) for t in documents(held))


def test_default_corpus_extraction_reads_source_without_importing():
    import ast

    source = '''"""Module docstring with several words."""
# A comment block long enough to count as prose about
# what this module does and why.
x = """
# not a comment: inside a string that spans lines
"""


class Thing:
    """Class docstring here, long enough."""

    def method(self):
        """Method docstring, three words."""
        # short
        return 1

    def no_doc(self):
        pass
'''
    tree = ast.parse(source)
    assert _docstrings(tree) == ["Module docstring with several words.", "Class docstring here, long enough.",
                                 "Method docstring, three words."]
    assert _comment_prose(source, tree) == "A comment block long enough to count as prose about what this " \
                                           "module does and why."


def test_source_indices_are_random_access_and_picklable(tmp_path):
    import pickle

    (tmp_path / "a.txt").write_text("\n".join(f"line {i}" for i in range(100)))
    source = open_documents(str(tmp_path / "a.txt"), split="all")
    copy = pickle.loads(pickle.dumps(source))
    order = np.random.default_rng(0).permutation(100)
    assert [copy[int(i)] for i in order] == [f"line {i}" for i in order]
