"""`bertjax prepare` and prepared ArrayRecord data; packing efficiency on the default corpus; global batches."""

import collections
import json
import re
import shutil

import numpy as np
import pytest
from pydoc_data.topics import topics

from bertjax.cli import main
from bertjax.data.pipeline import DataConfig, build_eval_iterator, build_pretraining_iterator
from bertjax.data.sources import open_documents
from bertjax.data.tokenizers import load_tokenizer

PARAGRAPHS = [p.strip() for name in sorted(topics) for p in re.split(r"\n\s*\n", topics[name]) if p.strip()][:600]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A JSONL corpus with a bad line, prepared through the CLI with a freshly trained tokenizer."""
    root = tmp_path_factory.mktemp("corpus")
    lines = [json.dumps({"text": p}) for p in PARAGRAPHS] + ["{broken"]
    (root / "docs.jsonl").write_text("\n".join(lines))
    assert main(["prepare", "--input", str(root / "docs.jsonl"), "--train-tokenizer", "--vocab-size", "600",
                 "--out", str(root / "prepared"), "--eval-fraction", "0.1", "--documents-per-file", "200"]) == 0
    return root


def test_prepare_writes_splits_metadata_and_tokenizer(corpus):
    metadata = json.loads((corpus / "prepared" / "metadata.json").read_text())
    assert metadata["dtype"] == "uint16" and metadata["tokenizer"]["vocab_size"] == 600
    train, held_out = metadata["splits"]["train"], metadata["splits"]["eval"]
    assert train["documents"] + held_out["documents"] == len(PARAGRAPHS)
    assert len(train["files"]) == -(-train["documents"] // 200)
    assert metadata["source_stats"]["skipped"] == {"not_json": 1}
    tokenizer = load_tokenizer(corpus / "prepared" / "tokenizer")
    assert tokenizer.fingerprint == metadata["tokenizer"]["fingerprint"]
    # Prepared documents hold exactly the tokens of the raw documents, split for split.
    raw = open_documents(str(corpus / "docs.jsonl"), split="eval", eval_fraction=0.1)
    prepared = open_documents(str(corpus / "prepared"), split="eval")
    assert len(raw) == len(prepared) == held_out["documents"]
    for i in range(len(raw)):
        np.testing.assert_array_equal(prepared[i], tokenizer.encode(raw[i]))


def test_prepared_and_raw_inputs_give_the_same_batches(corpus):
    tokenizer = load_tokenizer(corpus / "prepared" / "tokenizer")
    cfg = DataConfig(seq_len=64, global_batch_size=4, window_documents=128, eval_fraction=0.1, worker_threads=0)
    raw = build_pretraining_iterator(cfg.replace(input=str(corpus / "docs.jsonl")), tokenizer, seed=1)
    prepared = build_pretraining_iterator(cfg.replace(input=str(corpus / "prepared")), tokenizer, seed=1)
    for _ in range(10):
        a, b = next(raw), next(prepared)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    held_out = list(build_eval_iterator(cfg.replace(input=str(corpus / "prepared")), tokenizer))
    assert held_out and all(b["input_ids"].shape == (4, 64) for b in held_out)


def test_a_run_on_several_prepared_parts_takes_the_tokenizer_they_share(corpus, tmp_path):
    """data.input=a,b of two prepared directories and no tokenizer.path: the run trained a tokenizer on their token
    ids (a traceback). Their shared tokenizer is the run's; two different ones are an error naming the parts."""
    import shutil

    from bertjax.data.tokenizer_training import train_sentencepiece
    from bertjax.train.feed import _build_tokenizer
    from bertjax.train.run_config import load_run_config

    shutil.copytree(corpus / "prepared", tmp_path / "copy")
    both = f"{corpus / 'prepared'},{tmp_path / 'copy'},"  # a trailing comma too
    config = load_run_config("configs/pretrain/tiny.yaml", [f"data.input={both}"])
    _build_tokenizer(config, tmp_path / "run-tokenizer")
    assert load_tokenizer(tmp_path / "run-tokenizer").fingerprint == \
        load_tokenizer(corpus / "prepared" / "tokenizer").fingerprint
    other = train_sentencepiece(PARAGRAPHS[:200], tmp_path / "other", vocab_size=500)
    shutil.rmtree(tmp_path / "copy" / "tokenizer")
    other.save(tmp_path / "copy" / "tokenizer")
    with pytest.raises(ValueError, match="were tokenized with different tokenizers; .* tokenizer.path"):
        _build_tokenizer(config, tmp_path / "second")
    shutil.rmtree(tmp_path / "copy" / "tokenizer")
    alone = load_run_config("configs/pretrain/tiny.yaml", [f"data.input={tmp_path / 'copy'}"])
    with pytest.raises(ValueError, match="prepared data without its tokenizer/ directory"):
        _build_tokenizer(alone, tmp_path / "third")


def test_a_prepared_output_inside_the_input_directory_is_not_read_as_text(tmp_path, capsys):
    """prepare --input corpus/ --out corpus/prepared: the next run read the tokenizer's vocab.txt as documents, and
    --overwrite deleted it after indexing it, then failed reading it with the old data gone."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "docs.txt").write_text("\n".join(PARAGRAPHS[:300]) + "\n")
    args = ["prepare", "--input", str(corpus), "--train-tokenizer", "--vocab-size", "400", "--out"]
    assert main(args + [str(corpus / "v1")]) == 0
    assert main(args + [str(corpus / "v2")]) == 0
    first, second = (json.loads((corpus / name / "metadata.json").read_text()) for name in ("v1", "v2"))
    assert first["splits"] == second["splits"]  # the same 300 documents: v1 was not read
    assert main(args + [str(corpus / "v1"), "--overwrite"]) == 0, capsys.readouterr().err
    assert json.loads((corpus / "v1" / "metadata.json").read_text())["splits"] == first["splits"]


def test_prepare_says_where_it_skipped_lines(corpus, tmp_path, capsys):
    """The command printed the counts of skipped lines by reason, not where they are (metadata.json had it)."""
    (tmp_path / "docs.jsonl").write_text("\n".join([json.dumps({"text": p}) for p in PARAGRAPHS[:40]] + ["{broken"]))
    assert main(["prepare", "--input", str(tmp_path / "docs.jsonl"), "--tokenizer",
                 str(corpus / "prepared" / "tokenizer"), "--out", str(tmp_path / "out")]) == 0
    assert f"skipped: {{'not_json': 1}}, empty after tokenization: 0; e.g. {tmp_path / 'docs.jsonl'}:41: not_json" \
        in capsys.readouterr().out
    # A vocabulary smaller than asked for (a small corpus) is said as such.
    assert main(["prepare", "--input", str(tmp_path / "docs.jsonl"), "--train-tokenizer", "--vocab-size", "8192",
                 "--out", str(tmp_path / "small")]) == 0
    assert ": fewer than the 8192 asked for, the most this corpus yields" in capsys.readouterr().out


def test_a_run_says_its_trained_tokenizer_is_smaller_than_asked(tmp_path, caplog):
    import logging

    from bertjax.train.feed import _build_tokenizer
    from bertjax.train.run_config import load_run_config

    (tmp_path / "docs.txt").write_text("\n".join(PARAGRAPHS[:40]) + "\n")
    config = load_run_config("configs/pretrain/tiny.yaml", [f"data.input={tmp_path / 'docs.txt'}",
                                                            "tokenizer.vocab_size=8192"])
    with caplog.at_level(logging.WARNING):
        _build_tokenizer(config, tmp_path / "tokenizer")
    assert "fewer than tokenizer.vocab_size=8192: the most this corpus yields" in caplog.text


def test_prepared_data_errors(corpus, tmp_path, capsys):
    from bertjax.data.tokenizer_training import train_sentencepiece

    different = train_sentencepiece(PARAGRAPHS[:200], tmp_path / "tok", vocab_size=500)
    with pytest.raises(ValueError, match="another tokenizer"):
        build_pretraining_iterator(DataConfig(input=str(corpus / "prepared")), different, seed=0)
    # The CLI reports bad input in one line and exits with 2.
    assert main(["prepare", "--input", str(tmp_path / "missing.txt"), "--tokenizer", str(tmp_path / "tok"),
                 "--out", str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["prepare", "--input", str(corpus / "docs.jsonl"), "--tokenizer", str(tmp_path / "tok"),
                 "--out", str(corpus / "prepared")]) == 2
    assert "already holds prepared data" in capsys.readouterr().err


@pytest.fixture(scope="module")
def default_prepared(tmp_path_factory):
    """The embedded default corpus, tokenized once (the corpus itself is cached under ~/.cache/bertjax)."""
    from bertjax.data.prepare import prepare_corpus
    from bertjax.data.tokenizer_training import train_default_tokenizer

    root = tmp_path_factory.mktemp("default")
    tokenizer = train_default_tokenizer(root / "tok")
    prepare_corpus("default", tokenizer, root / "prepared")
    return root / "prepared", tokenizer


@pytest.mark.parametrize("seq_len", [128, 512])
def test_default_corpus_packs_over_99_percent_without_losing_a_token(default_prepared, seq_len):
    directory, tokenizer = default_prepared
    cfg = DataConfig(input=str(directory), seq_len=seq_len, global_batch_size=1, num_epochs=1, worker_threads=2,
                     prefetch_windows=4)
    iterator = build_pretraining_iterator(cfg, tokenizer, seed=0)
    seen = collections.Counter()
    for batch in iterator:
        ids = batch["input_ids"].copy()
        rows, slots = np.nonzero(batch["masked_weights"])
        ids[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
        seen.update(ids[(batch["segment_ids"] > 0) & ~np.isin(ids, tokenizer.special_ids)].tolist())
    assert iterator.stats.packing_efficiency >= 0.99
    source = open_documents(str(directory), split="train")
    expected = collections.Counter(np.concatenate([source[i] for i in range(len(source))]).tolist())
    assert seen == expected


def test_global_batch_over_the_local_mesh():
    import jax

    from bertjax.data.global_batch import batch_sharding, to_global_batch

    devices = np.array(jax.devices())
    mesh = jax.sharding.Mesh(devices.reshape(-1, 1), ("data", "model"))
    rows = 2 * len(devices)
    batch = {"input_ids": np.arange(rows * 8, dtype=np.int32).reshape(rows, 8),
             "masked_weights": np.ones((rows, 3), np.float32)}
    global_batch = to_global_batch(batch, mesh)
    assert global_batch["input_ids"].shape == (rows * jax.process_count(), 8)
    np.testing.assert_array_equal(np.asarray(global_batch["input_ids"]), batch["input_ids"])
    assert global_batch["input_ids"].sharding == batch_sharding(mesh, "data")
    with pytest.raises(ValueError, match="not axes of the mesh"):
        to_global_batch(batch, mesh, batch_axes="fsdp")
    with pytest.raises(ValueError, match="disagree"):
        to_global_batch({"a": np.zeros((2, 1)), "b": np.zeros((4, 1))}, mesh)


def test_prepare_names_the_file_it_cannot_use(tmp_path, capsys):
    """An --out that is a file, a corrupt Parquet input and an empty input: one-line errors naming the file, and
    nothing written (robustness audit, finding 12)."""
    from bertjax.data.tokenizer_training import train_sentencepiece

    train_sentencepiece(PARAGRAPHS[:200], tmp_path / "tok", vocab_size=500)
    (tmp_path / "t.txt").write_text("A document.\n")
    tokenizer = ["--tokenizer", str(tmp_path / "tok")]
    assert main(["prepare", "--input", str(tmp_path / "t.txt"), *tokenizer, "--out", str(tmp_path / "t.txt")]) == 2
    assert "t.txt' is a file, not a directory" in capsys.readouterr().err
    assert (tmp_path / "t.txt").read_text() == "A document.\n"
    (tmp_path / "empty.txt").write_text("")
    assert main(["prepare", "--input", str(tmp_path / "empty.txt"), *tokenizer, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"no documents in {tmp_path / 'empty.txt'}" in err and "no all" not in err
    pytest.importorskip("pyarrow")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all" * 20)
    assert main(["prepare", "--input", str(tmp_path / "junk.parquet"), *tokenizer, "--out", str(tmp_path / "o")]) == 2
    assert f"Parquet file '{tmp_path / 'junk.parquet'}' is not readable as Parquet" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_an_overwrite_replaces_the_old_data_and_a_stopped_one_reads_as_incomplete(corpus, tmp_path, monkeypatch):
    """`prepare --overwrite` with a tokenizer of another kind: the old SentencePiece .model does not stay beside the
    new vocab.txt (load_tokenizer prefers a .model, so the data would be read with the wrong tokenizer). An
    overwrite stopped halfway leaves no metadata.json describing the old data over new files."""
    from tokenizers import BertWordPieceTokenizer

    from bertjax.data.prepare import prepare_corpus
    from bertjax.data.sources import prepared_directory
    from bertjax.data.tokenizers import WordPieceTokenizer

    trained = BertWordPieceTokenizer(lowercase=True)
    trained.train_from_iterator(PARAGRAPHS, vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                                             "[MASK]"])
    wordpiece = WordPieceTokenizer("\n".join(sorted(trained.get_vocab(), key=trained.get_vocab().get)) + "\n",
                                   lowercase=True)
    out = tmp_path / "prepared"
    shutil.copytree(corpus / "prepared", out)  # prepared with a SentencePiece tokenizer
    (out / "mine.array_record").write_bytes(b"the user's own file")  # not prepare's: kept
    assert list((out / "tokenizer").glob("*.model"))
    metadata = prepare_corpus(str(corpus / "docs.jsonl"), wordpiece, out, overwrite=True)
    tokenizer = load_tokenizer(out / "tokenizer")
    assert tokenizer.kind == "wordpiece" and tokenizer.fingerprint == metadata["tokenizer"]["fingerprint"]
    assert sorted(p.name for p in out.glob("*.array_record")) == sorted(
        metadata["splits"]["train"]["files"] + metadata["splits"]["eval"]["files"] + ["mine.array_record"])

    def stopped(self, texts):
        raise KeyboardInterrupt
    monkeypatch.setattr(WordPieceTokenizer, "encode_batch", stopped)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus(str(corpus / "docs.jsonl"), wordpiece, out, overwrite=True)
    assert not (out / "metadata.json").exists() and prepared_directory(str(out)) is None
