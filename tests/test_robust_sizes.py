"""Sizes a model directory claims are compared with what its files hold before anything is built at those sizes
(audit 6, security findings 2, 4 and 10): a config.json / model_config.json claiming a million layers is refused
before the model is traced layer by layer, a workdir checkpoint whose metadata claims other shapes than its
model_config.json before any array is read, and a tokenizer.json naming id 2000000000 before a list of that length
is built. Each error is one line naming the file."""

from __future__ import annotations

import json

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import bertjax.hf.pretrained as pretrained
import bertjax.models
from bertjax.cli import main
from bertjax.config import get_config
from bertjax.data import load_tokenizer
from bertjax.data.tokenizers import InvalidTokenizerFile
from bertjax.hf import from_pretrained, save_pretrained
from bertjax.model_dirs import load_model_dir, save_model_dir
from bertjax.models import MODEL_CLASSES, init_params
from bertjax.train.checkpoints import ModelMismatch

TINY = get_config("bert-tiny")  # 2 layers


def _tiny(config=TINY, head="masked_lm"):
    model = MODEL_CLASSES[head](config)
    return model, init_params(model, jax.random.key(0))


def _edit_json(path, edit) -> None:
    values = json.loads(path.read_text())
    edit(values)
    path.write_text(json.dumps(values))


@pytest.fixture
def never_traced(monkeypatch):
    """Tracing the model (its abstract parameters) is what a claimed layer count makes slow: a bad count must be
    refused before it, so any tracing here fails the test (the old code traced first, for hours at 1e6 layers)."""
    def traced(*args, **kwargs):
        raise AssertionError("the model was traced before its sizes were compared with the files")

    monkeypatch.setattr(pretrained, "expected_params", traced)
    monkeypatch.setattr(bertjax.models, "abstract_params", traced)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("sizes") / "hf"
    save_pretrained(str(path), *_tiny())
    return path


@pytest.mark.parametrize("layers", [3, 1000])
def test_transformers_config_claiming_more_layers_than_the_file_is_refused_before_tracing(
        hf_dir, tmp_path, layers, never_traced, capsys):
    bomb = tmp_path / "bomb"
    bomb.mkdir()
    (bomb / "model.safetensors").symlink_to(hf_dir / "model.safetensors")
    (bomb / "config.json").write_text((hf_dir / "config.json").read_text())
    _edit_json(bomb / "config.json", lambda values: values.update(num_hidden_layers=layers))
    expected = f"config.json: num_hidden_layers {layers}, but model.safetensors holds layers 0..1"
    with pytest.raises(ValueError, match=expected):
        from_pretrained(str(bomb))
    assert main(["fill-mask", "--model", str(bomb), "a [MASK] day"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expected in err, err


def test_a_million_layers_is_refused_by_the_config_whatever_the_file(hf_dir, tmp_path, never_traced, capsys):
    # Beyond what any encoder has, and beyond what a file can contradict where layers are shared (ALBERT).
    bomb = tmp_path / "bomb"
    bomb.mkdir()
    (bomb / "model.safetensors").symlink_to(hf_dir / "model.safetensors")
    (bomb / "config.json").write_text((hf_dir / "config.json").read_text())
    _edit_json(bomb / "config.json", lambda values: values.update(num_hidden_layers=1_000_000))
    assert main(["fill-mask", "--model", str(bomb), "a [MASK] day"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "num_layers must be at most 1024, got 1000000" in err, err


def test_a_safetensors_header_claiming_a_huge_tensor_is_refused_before_reading_it(hf_dir, tmp_path):
    """A header consistent with the file's size, the file sparse on disk (2.6 GB apparent, a few KB stored): it was
    read whole (5 GB of memory) before the shape check refused it. Now the headers are compared first."""
    import os
    import shutil
    import struct

    import safetensors.numpy

    target = tmp_path / "sparse"
    shutil.copytree(hf_dir, target)
    path = target / "model.safetensors"
    tensors = safetensors.numpy.load_file(str(path))
    table = next(name for name in tensors if name.endswith("word_embeddings.weight"))
    rows, width = 20_000_000, tensors.pop(table).shape[1]
    header, offset, chunks = {"__metadata__": {"format": "pt"}}, 0, []
    for name, value in tensors.items():
        data = value.astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(value.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header[table] = {"dtype": "F32", "shape": [rows, width], "data_offsets": [offset, offset + rows * width * 4]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw + b"".join(chunks))
        file.truncate(8 + len(raw) + offset + rows * width * 4)
    assert os.path.getsize(path) > 2 * 10**9
    with pytest.raises(ValueError, match=rf"tensor '{table}' has shape \({rows}, {width}\), more values than any "
                                         "tensor"):
        from_pretrained(str(target))


def test_transformers_directory_whose_layers_match_still_loads(hf_dir):
    model, params = from_pretrained(str(hf_dir))
    assert model.config.num_layers == 2 and set(params["encoder"]) == {"layers_0", "layers_1"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("sizes") / "bj"
    save_model_dir(path, *_tiny())
    return path


def test_bertjax_model_config_claiming_more_layers_is_refused_before_tracing(model_dir, tmp_path, never_traced):
    import shutil

    bomb = tmp_path / "bomb"
    shutil.copytree(model_dir, bomb)
    _edit_json(bomb / "model_config.json", lambda described: described["config"].update(num_layers=500))
    with pytest.raises(ModelMismatch, match=r"params/ holds another model than its model_config.json describes "
                                            r"\(num_layers 500, but it stores layers 0..1\)"):
        load_model_dir(bomb)
    _edit_json(bomb / "model_config.json", lambda described: described["config"].update(num_layers=1_000_000))
    with pytest.raises(ValueError, match=r"bomb/model_config.json: EncoderConfig.num_layers must be at most 1024, "
                                         r"got 1000000"):
        load_model_dir(bomb)


# ---------------------------------------------------------------------------------------------------------------
# A pretraining workdir: model_config.json + config.yaml + checkpoints/<step>/state (as `bertjax pretrain` writes).

def _workdir(path, model, params, described_model=None, params_key=None):
    """A workdir whose checkpoint holds `params` (under `params_key`, as ELECTRA's holds several models) and whose
    model_config.json describes `described_model` (default: `model`)."""
    from bertjax.model_dirs import write_model_config

    path.mkdir()
    write_model_config(path, described_model or model)
    if params_key:
        _edit_json(path / "model_config.json", lambda described: described.update(params_key=params_key))
        params = {params_key: params, "generator": {"other": np.zeros((3, 5), np.float32)}}
    (path / "config.yaml").write_text("{}\n")
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
        checkpointer.save((path / "checkpoints" / "1" / "state").absolute(),
                          args=ocp.args.PyTreeSave({"params": params, "step": np.int32(1)}))
    return path


def test_workdir_checkpoint_of_other_shapes_is_refused_before_reading(tmp_path, monkeypatch, capsys):
    small = MODEL_CLASSES["masked_lm"](TINY)
    wide = _tiny(TINY.replace(vocab_size=4096))
    workdir = _workdir(tmp_path / "wd", *wide, described_model=small)

    def read(*args, **kwargs):
        raise AssertionError("the checkpoint was read at the shapes its own metadata claims")

    monkeypatch.setattr(ocp.PyTreeCheckpointer, "restore", read)
    expected = ("holds another model than " + str(workdir / "model_config.json") + " describes "
                "(embeddings/word_embeddings/embedding stored (4096, 32), ")
    with pytest.raises(ModelMismatch) as error:
        load_model_dir(workdir)
    assert expected in str(error.value) and "model_config.json (128, 32)" in str(error.value), error.value
    assert main(["fill-mask", "--model", str(workdir), "a [MASK] day"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expected in err, err


def test_workdir_model_config_claiming_more_layers_is_refused_before_tracing(tmp_path, never_traced):
    model, params = _tiny()
    workdir = _workdir(tmp_path / "wd", model, params, described_model=MODEL_CLASSES["masked_lm"](
        TINY.replace(num_layers=500)))
    with pytest.raises(ModelMismatch, match=r"\(num_layers 500, but it stores layers 0..1\)"):
        load_model_dir(workdir)


def test_workdir_of_matching_shapes_loads_only_its_params_key_model(tmp_path):
    model, params = _tiny()
    workdir = _workdir(tmp_path / "wd", model, params, params_key="discriminator")
    loaded, restored, _ = load_model_dir(workdir)
    assert loaded == model
    assert jax.tree.structure(restored) == jax.tree.structure(params)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(params)))


# ---------------------------------------------------------------------------------------------------------------
# tokenizer.json ids.

def _word_level(path, vocab: dict[str, int]):
    path.mkdir()
    (path / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}))
    return path


SPECIALS = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[MASK]": 3, "[PAD]": 4, "the": 5}


def test_tokenizer_whose_largest_id_is_far_beyond_its_tokens_is_refused(tmp_path):
    # 5e6 keeps the old code's list at 40 MB (it built 2e9 entries, 16 GB, for the audit's file).
    path = _word_level(tmp_path / "tok", {**SPECIALS, "cat": 5_000_000})
    with pytest.raises(InvalidTokenizerFile, match=r"tok/tokenizer.json is not a valid tokenizer: its largest "
                                                   r"token id is 5000000, but it has 7 tokens"):
        load_tokenizer(path)


def test_tokenizer_with_a_few_unused_ids_still_loads(tmp_path):
    tokenizer = load_tokenizer(_word_level(tmp_path / "tok", {**SPECIALS, "cat": 900}))
    assert tokenizer.vocab_size == 901 and tokenizer.encode("the cat").tolist() == [5, 900]
