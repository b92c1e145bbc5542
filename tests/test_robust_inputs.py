"""Bad inputs get a clear error and lose nothing (issue 15): prepare over prepared data, pickled checkpoints,
out-of-range ids under jit, long lines for the tokenizer trainer, convert's --out, unknown TPU topologies,
binary files given as text, integer tensors where floats belong."""

from __future__ import annotations

import functools
from pathlib import Path

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


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random-weight BERT MLM checkpoint as transformers writes it (safetensors)."""
    import bertjax
    from test_hf_io import random_params, tiny_model

    directory = tmp_path_factory.mktemp("hf")
    model = tiny_model("bert-tiny", "masked_lm")
    bertjax.save_pretrained(str(directory), model, random_params(model))
    return directory


def test_pickled_checkpoint_needs_an_explicit_opt_in(hf_dir, tmp_path, capsys, caplog):
    import shutil

    import safetensors.numpy
    torch = pytest.importorskip("torch")
    import bertjax

    pickled = tmp_path / "pickled"
    shutil.copytree(hf_dir, pickled)
    tensors = safetensors.numpy.load_file(pickled / "model.safetensors")
    torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()

    with pytest.raises(ValueError, match="PyTorch pickle.*--allow-pickle"):
        bertjax.from_pretrained(str(pickled))
    assert main(["convert", "--from-hf", str(pickled), "--out", str(tmp_path / "refused")]) == 2
    assert f"bertjax convert --from-hf {pickled}" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()

    assert main(["convert", "--from-hf", str(pickled), "--out", str(tmp_path / "opted-in"), "--allow-pickle"]) == 0
    assert "unpickling a PyTorch checkpoint" in caplog.text
    assert (tmp_path / "opted-in" / "params").is_dir()


@pytest.fixture(scope="module")
def tiny_mlm():
    import jax

    import bertjax
    model = bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny", vocab_size=100))
    return model, bertjax.init_params(model, jax.random.key(0))


@pytest.mark.parametrize("bad_id", [100, 5000, -1])
def test_checked_apply_rejects_out_of_range_ids_that_plain_jit_lets_through(tiny_mlm, bad_id):
    import jax
    import numpy as np

    import bertjax
    model, params = tiny_mlm
    logits = lambda p, ids: model.apply({"params": p}, ids).logits  # noqa: E731
    ids = np.array([[2, 7, bad_id, 3]], np.int32)
    jax.jit(logits)(params, ids)  # the unchecked path the README documents: no error, whatever comes out
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 100\); got min -?\d+ and max \d+$"):
        bertjax.checked(logits)(params, ids)  # the message alone, without checkify's "(`check` failed)"
    good = np.array([[2, 7, 99, 3]], np.int32)
    np.testing.assert_allclose(bertjax.checked(logits)(params, good), jax.jit(logits)(params, good), rtol=1e-6)


def test_fill_mask_checks_ids_against_the_model_vocabulary(tiny_mlm):
    from bertjax.inference.fill_mask import make_predictor
    from train_helpers import small_tokenizer
    from bertjax.data import load_tokenizer

    model, params = tiny_mlm
    tokenizer = load_tokenizer(small_tokenizer())  # 512 pieces: more than the model's 100 rows
    predict = make_predictor(model, params, tokenizer)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 100\)"):
        predict("The [MASK] statement returns a value from a function.", 3)


def test_tokenizer_trainer_learns_from_lines_longer_than_sentencepiece_accepts(tmp_path):
    from bertjax.data.tokenizer_training import _MAX_LINE_BYTES, _line_pieces, train_sentencepiece

    words = " ".join(_corpus_lines()[:2000]).split()
    long_line = " ".join(words)  # one document, one line, far over the limit
    assert len(long_line.encode()) > 10 * _MAX_LINE_BYTES
    text = long_line + " " + "é" * 5000  # and a 10000-byte run without spaces
    pieces = _line_pieces(text)
    assert all(0 < len(p.encode()) <= _MAX_LINE_BYTES for p in pieces)
    assert "".join("".join(p.split()) for p in pieces) == "".join(text.split())  # nothing dropped
    tokenizer = train_sentencepiece([long_line], tmp_path / "tok", vocab_size=800)
    assert tokenizer.vocab_size > 600  # merges learned from the text, beyond characters and byte pieces


def test_convert_refuses_a_non_empty_out_and_the_input_itself(hf_dir, tmp_path, capsys):
    before = _snapshot(hf_dir)
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(hf_dir)]) == 2
    assert "is the directory being read" in capsys.readouterr().err
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(occupied)]) == 2
    assert "is not empty; pass --overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in occupied.iterdir()) == ["notes.txt"]
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(occupied), "--overwrite"]) == 0
    assert (occupied / "notes.txt").read_text() == "mine" and (occupied / "params").is_dir()
    assert _snapshot(hf_dir) == before


def test_compile_check_names_an_unknown_topology_in_one_line(capsys):
    from bertjax import tpu_aot
    if not tpu_aot.libtpu_available():
        pytest.skip(tpu_aot.INSTALL_HINT)
    config = Path(__file__).resolve().parents[1] / "configs" / "pretrain" / "tiny.yaml"
    assert main(["compile-check", "--config", str(config), "--topology", "v9z:1x1"]) == 2
    err = capsys.readouterr().err
    assert "TPU topology 'v9z:1x1' cannot be compiled for: Invalid TPU external name" in err
    assert "v5e:2x2" in err and "NVIDIA GPUs: h100, h200" in err and "Traceback" not in err


@pytest.mark.parametrize("kind", ["random bytes", "utf-16", "nul-padded"])
def test_binary_file_given_as_text_is_refused(corpus, tmp_path, kind):
    import numpy as np

    from bertjax.data import open_documents

    text = corpus.read_text()
    content = {"random bytes": np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8).tobytes(),
               "utf-16": text.encode("utf-16"),
               "nul-padded": "\n".join("\x00".join(line) for line in text.splitlines()).encode()}[kind]
    path = tmp_path / "data.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="does not look like text"):
        open_documents(str(path))


def test_text_with_a_few_bad_lines_is_still_read(corpus):
    from bertjax.data import open_documents

    lines = corpus.read_bytes().splitlines()
    lines[5] = b"\xff\xfe not utf-8"
    lines[9] = b"nul \x00 inside"
    corpus.write_bytes(b"\n".join(lines))
    source = open_documents(str(corpus), split="all")
    assert source.stats.skipped["invalid_utf8"] == 1 and source.stats.skipped["binary"] == 1
    assert len(source) == len(lines) - 2


def test_integer_tensor_where_a_float_parameter_belongs_is_an_error(hf_dir, tmp_path):
    import shutil

    import numpy as np
    import safetensors.numpy

    import bertjax
    broken = tmp_path / "ints"
    shutil.copytree(hf_dir, broken)
    tensors = safetensors.numpy.load_file(broken / "model.safetensors")
    name = next(n for n in sorted(tensors) if n.endswith("word_embeddings.weight"))
    tensors[name] = np.round(tensors[name] * 100).astype(np.int32)
    safetensors.numpy.save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    for task in ({}, {"head": "sequence_classification", "num_labels": 2}):  # as it is, and into a new head
        with pytest.raises(ValueError, match=f"tensor '{name}' is int32; model parameters are floating point"):
            bertjax.from_pretrained(str(broken), **task)


def test_every_command_that_reads_a_model_takes_allow_pickle(hf_dir, tmp_path, caplog):
    """One door, on every command that reads a model directory (it was on convert, fill-mask, embed and search
    only: finetune of a .bin-only checkpoint could not be asked for at all)."""
    import argparse
    import importlib
    import shutil

    import safetensors.numpy
    torch = pytest.importorskip("torch")
    from bertjax.cli import COMMANDS

    reading = {"convert", "fill-mask", "finetune", "predict", "glue", "embed", "search", "train-embedder",
               "init-from"}
    for name in reading:
        parser = argparse.ArgumentParser()
        importlib.import_module(COMMANDS[name]).add_arguments(parser)
        assert any("--allow-pickle" in action.option_strings for action in parser._actions), name

    from finetune_helpers import finetune_files
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import task_class
    from bertjax.finetune.trainer import finetune

    files = finetune_files(tmp_path / "data", 16, 8)
    pickled = tmp_path / "pickled"
    shutil.copytree(files["model"], pickled)
    tensors = safetensors.numpy.load_file(pickled / "model.safetensors")
    torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    task = task_class("sequence-classification")
    config = load_finetune_config(None, ["train.batch_size=8", "train.epochs=1", "data.max_length=16",
                                         "train.progress_bar=false", "eval.batch_size=8"], task.defaults)
    with pytest.raises(ValueError, match="--allow-pickle"):
        finetune(pickled, task, files["train"], files["validation"], tmp_path / "refused", config, say=lambda _: None)
    result = finetune(pickled, task, files["train"], files["validation"], tmp_path / "run", config,
                      say=lambda _: None, allow_pickle=True)
    assert result.results["finished"] and "unpickling a PyTorch checkpoint" in caplog.text


def test_a_mask_without_a_readable_candidate_is_shown_as_such():
    """An untrained model may rank only pieces that decode to nothing first; fill-mask printed an IndexError."""
    from bertjax.inference.fill_mask import Prediction, format_predictions

    shown = format_predictions("the [MASK] sat on the [MASK]", [[], [Prediction("mat", 7, 0.5)]])
    assert shown.splitlines() == ["the [MASK] sat on the [mat]",
                                  "  mask 1: no candidate among the top ones decodes to text", "  mask 2: 'mat' 0.500"]
