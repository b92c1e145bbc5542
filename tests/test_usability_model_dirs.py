"""One reader for every model directory, and a pretraining workdir exported for transformers as it is
(issue 14, points 3 and 4): AutoTokenizer and AutoModelForMaskedLM load the export, and transformers' fill-mask
pipeline ranks the same top 5 as `bertjax fill-mask` on the workdir."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bertjax.cli import main
from bertjax.inference.fill_mask import load_predictor
from bertjax.model_dirs import load_model_dir
from train_helpers import small_tokenizer, write_config

SENTENCES = ["The [MASK] statement returns a value from a function.",
             "A module can contain [MASK] statements as well as function definitions.",
             "This is [MASK] useful when the list is long."]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("usability_run")
    config = write_config(root / "run.yaml", small_tokenizer(),
                          schedule={"unit": "fraction", "warmup": 0.25, "decay": 0.5},
                          train={"steps": 8}, checkpoint={"every": 4, "keep": 3})
    # In this process (as `bertjax pretrain` runs it): a subprocess would add seconds of imports and check nothing
    # more here, where only the workdir it leaves is read.
    from bertjax.train.loop import pretrain
    from bertjax.train.run_config import load_run_config

    pretrain(load_run_config(config), root / "run")
    return root / "run"


def test_workdir_loads_latest_or_chosen_step(workdir, tmp_path):
    model, latest, tokenizer = load_model_dir(workdir)
    _, earlier, _ = load_model_dir(workdir, step=4)
    assert tokenizer is not None and model.config.vocab_size == tokenizer.vocab_size
    assert jax.tree.structure(latest) == jax.tree.structure(earlier)
    differs = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), latest,
                                           earlier))
    assert any(differs)  # step 8 is not step 4
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 5; available steps: \[4, 8\]"):
        load_model_dir(workdir, step=5)
    assert main(["convert", "--to-hf", str(workdir), "--step", "4", "--out", str(tmp_path / "hf4")]) == 0
    with pytest.raises(ValueError, match="--step applies to pretraining workdirs"):
        load_model_dir(tmp_path / "hf4", step=4)


@pytest.fixture(scope="module")
def exported(workdir, tmp_path_factory):
    out = tmp_path_factory.mktemp("usability_export") / "hf"
    assert main(["convert", "--to-hf", str(workdir), "--out", str(out)]) == 0
    return out


def test_export_holds_what_transformers_needs(exported):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        assert (exported / name).is_file(), name


def test_transformers_tokenizer_encodes_like_bertjax(workdir, exported):
    from transformers import AutoTokenizer

    _, _, tokenizer = load_model_dir(workdir)
    hf = AutoTokenizer.from_pretrained(str(exported))
    assert (hf.cls_token_id, hf.sep_token_id, hf.mask_token_id, hf.pad_token_id, hf.unk_token_id) == \
        (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, tokenizer.pad_id, tokenizer.unk_id)
    for text in ("Functions return values.", "  spaces   and\ttabs ", "Zahlen 12345 und ünïcödé ✓"):
        ids = hf(text)["input_ids"]
        assert ids == [tokenizer.cls_id, *map(int, tokenizer.encode(text)), tokenizer.sep_id]
    assert "token_type_ids" not in hf("x")  # ModernBERT takes none; the pipeline passes every encoding on


def test_transformers_fill_mask_matches_bertjax(workdir, exported):
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    model = AutoModelForMaskedLM.from_pretrained(str(exported))
    hf_tokenizer = AutoTokenizer.from_pretrained(str(exported))
    fill_mask = pipeline("fill-mask", model=model, tokenizer=hf_tokenizer, device="cpu", dtype=torch.float32)
    _, _, tokenizer = load_model_dir(workdir)
    predict = load_predictor(workdir)
    special = set(int(i) for i in tokenizer.special_ids)
    for sentence in SENTENCES:
        ours = predict(sentence, 5)[0]
        theirs = fill_mask(sentence, top_k=20)
        # bertjax never predicts special tokens nor pieces that decode to nothing; the pipeline ranks every token,
        # so its list is read with those left out (its probabilities renormalise to bertjax's).
        kept = [p for p in theirs if p["token"] not in special and tokenizer.decode([p["token"]]).strip()][:5]
        assert [p.token_id for p in ours] == [p["token"] for p in kept], sentence
        ratios = np.array([p.probability for p in ours]) / np.array([p["score"] for p in kept])
        np.testing.assert_allclose(ratios, ratios[0], rtol=1e-3)


# ---------------------------------------------------------------------------------------------------------------
# An incomplete latest checkpoint is refused, as a resume refuses it, never passed over for an older one.

def test_incomplete_latest_checkpoint_is_refused_naming_it_and_the_earlier_step(workdir, tmp_path, capsys):
    import shutil

    from bertjax.train.checkpoints import CheckpointError

    copy = tmp_path / "run"
    shutil.copytree(workdir, copy)
    shutil.rmtree(copy / "checkpoints" / "8" / "state")  # checksums.json stays: the error names the missing file
    (copy / "checkpoints" / "12.orbax-checkpoint-tmp-1700000000").mkdir()  # a save in progress is no step
    with pytest.raises(CheckpointError, match=r"checkpoints/8: file state/_METADATA is missing\. Use an earlier one "
                                              r"\(available: \[4\]\): --step 4"):
        load_model_dir(copy)
    assert main(["fill-mask", "--model", str(copy), SENTENCES[0]]) == 2
    assert "checkpoints/8: file state/_METADATA is missing" in capsys.readouterr().err
    assert main(["convert", "--to-hf", str(copy), "--out", str(tmp_path / "hf")]) == 2
    assert not (tmp_path / "hf").exists()
    assert "--step 4" in capsys.readouterr().err
    _, params, _ = load_model_dir(copy, step=4)  # the complete earlier step, asked for, still works
    _, expected, _ = load_model_dir(workdir, step=4)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), params, expected))

    (copy / "checkpoints" / "8" / "checksums.json").unlink()  # without checksums: the directory is named as incomplete
    with pytest.raises(CheckpointError, match=r"checkpoints/8 is incomplete \(no state/ directory\)\. Use an earlier"):
        load_model_dir(copy)
    with pytest.raises(CheckpointError, match="checkpoints/8 is incomplete"):
        load_model_dir(copy, step=8)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 12; available steps: \[4\]"):
        load_model_dir(copy, step=12)


# ---------------------------------------------------------------------------------------------------------------
# Weights bertjax writes are readable by others, as every other file is; convert checks the tokenizer it copies.

def test_written_safetensors_get_the_umask_mode_not_0600(workdir, tmp_path):
    import os
    import stat

    from finetune_helpers import tiny_model_dir

    previous = os.umask(0o022)
    try:
        model_dir = tiny_model_dir(tmp_path / "tiny")  # bertjax.save_pretrained
        assert main(["convert", "--to-hf", str(workdir), "--out", str(tmp_path / "hf")]) == 0
        for directory in (model_dir, tmp_path / "hf"):
            for name in ("model.safetensors", "config.json"):
                assert stat.S_IMODE((directory / name).stat().st_mode) == 0o644, (directory, name)
    finally:
        os.umask(previous)


def test_convert_from_hf_refuses_a_broken_tokenizer_before_writing(tmp_path, capsys):
    from finetune_helpers import tiny_model_dir

    source = tiny_model_dir(tmp_path / "tiny")
    assert main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "good")]) == 0
    tokenizer_json = source / "tokenizer.json"  # wins over the vocab.txt next to it
    tokenizer_json.write_text('{"version": "1.0", "model": {"type": "WordPiece", "vocab": {"[PAD]": 0, "[UN')
    assert main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "broken")]) == 2
    err = capsys.readouterr().err
    assert f"{tokenizer_json} is not a valid tokenizer" in err, err
    assert not (tmp_path / "broken").exists()
    tokenizer_json.unlink()  # an emptied vocab.txt is damage too (it was a warning, and copied empty)
    (source / "vocab.txt").write_text("")
    assert main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "emptied")]) == 2
    assert "vocab.txt is not a valid tokenizer: its WordPiece vocabulary is empty" in capsys.readouterr().err
    assert not (tmp_path / "emptied").exists()
    # A readable tokenizer with special tokens bertjax does not know is no damage: copied, with a warning.
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"<|begin|>": 0, "<|unknown|>": 1, "word": 2}, unk_token="<|unknown|>")).save(
        str(tokenizer_json))
    assert main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "foreign")]) == 0
    assert "bertjax's commands cannot use its tokenizer" in capsys.readouterr().err
    assert (tmp_path / "foreign" / "tokenizer.json").read_bytes() == tokenizer_json.read_bytes()


def test_a_flipped_byte_in_a_model_directory_is_found_by_its_checksums(tmp_path):
    """params/ carries the sha256 of its files, as a workdir's checkpoints do: one flipped bit loaded as slightly
    different weights without a word. A directory written before (no checksums.json) still loads."""
    import os

    import bertjax
    from bertjax.model_dirs import save_model_dir
    from bertjax.train.checkpoints import CheckpointError

    model = bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny", vocab_size=64))
    save_model_dir(tmp_path / "model", model, bertjax.init_params(model, jax.random.key(0)))
    assert (tmp_path / "model" / "params" / "checksums.json").is_file()
    largest = max((p for p in (tmp_path / "model" / "params").rglob("*") if p.is_file()), key=os.path.getsize)
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 1
    largest.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model directory .*: params/.* is corrupt \(sha256 differs"):
        load_model_dir(tmp_path / "model")
    (tmp_path / "model" / "params" / "checksums.json").unlink()  # as directories written before
    load_model_dir(tmp_path / "model")


def test_a_model_directory_written_on_another_device_loads_here(tmp_path):
    """Orbax records each array's device (`cpu:0` where `convert --from-hf` ran, `cuda:0` on a GPU host, process 0's
    on a pod) and placed a restored array on it: on any other machine, or process 1 of a pod, the directory was
    refused as damaged. Here it is written as a GPU host writes it and loads onto this machine's device."""
    import json

    import bertjax
    from bertjax.model_dirs import save_model_dir
    from bertjax.train.checkpoints import write_checksums

    model = bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny", vocab_size=64))
    params = bertjax.init_params(model, jax.random.key(0))
    save_model_dir(tmp_path / "model", model, params)
    shardings = tmp_path / "model" / "params" / "_sharding"
    recorded = json.loads(shardings.read_text())
    assert all(json.loads(value)["device_str"] == "cpu:0" for value in recorded.values())
    shardings.write_text(json.dumps({key: json.dumps({"sharding_type": "SingleDeviceSharding", "device_str": "cuda:0"})
                                     for key in recorded}))
    write_checksums(tmp_path / "model" / "params")  # as that host certified what it wrote
    _, loaded, _ = load_model_dir(tmp_path / "model")
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.devices() == {jax.local_devices()[0]}


def test_every_process_advances_orbax_s_save_count_as_process_0_s_save_does(tmp_path, monkeypatch):
    """save_model_dir_from_process_0: orbax numbers the signals of a save all processes make together by a count of
    saves it keeps per process; process 0 saving alone must not leave it ahead of the others (the next checkpoint
    then waited forever). Both branches, in one process: the others' is taken by patching process_index."""
    import bertjax
    from bertjax.model_dirs import save_model_dir_from_process_0
    from orbax.checkpoint._src.futures.synchronization import OperationIdGenerator

    count = lambda: int(OperationIdGenerator.get_current_operation_id())  # noqa: E731
    model = bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny", vocab_size=64))
    params = bertjax.init_params(model, jax.random.key(0))
    before = count()
    save_model_dir_from_process_0(tmp_path / "written", model, params)
    by_process_0 = count() - before
    monkeypatch.setattr(jax, "process_index", lambda *args: 1)
    before = count()
    save_model_dir_from_process_0(tmp_path / "not-written", model, params)
    assert by_process_0 >= 1 and count() - before == by_process_0
    assert (tmp_path / "written" / "params").is_dir() and not (tmp_path / "not-written").exists()
