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
