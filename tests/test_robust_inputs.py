"""Bad inputs get a clear error and lose nothing (issue 15): prepare over prepared data, pickled checkpoints,
out-of-range ids under jit, long lines for the tokenizer trainer, convert's --out, unknown TPU topologies,
binary files given as text, integer tensors where floats belong."""

from __future__ import annotations

import functools

import pytest

from bertjax.cli import main


@functools.lru_cache(maxsize=None)
def _corpus_lines() -> tuple[str, ...]:
    from bertjax.data import default_corpus_documents
    return tuple(line for doc in default_corpus_documents("train")[:400] for line in doc.splitlines() if line.strip())


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(_corpus_lines()) + "\n")
    return path


def _snapshot(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_prepare_train_tokenizer_refuses_prepared_data_before_touching_it(corpus, tmp_path, capsys):
    out = tmp_path / "prepared"
    args = ["prepare", "--input", str(corpus), "--train-tokenizer", "--out", str(out)]
    assert main([*args, "--vocab-size", "400"]) == 0
    before = _snapshot(out)
    assert main([*args, "--vocab-size", "320"]) == 2
    assert "already holds prepared data" in capsys.readouterr().err
    assert _snapshot(out) == before
