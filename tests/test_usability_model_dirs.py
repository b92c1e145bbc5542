"""One reader for every model directory, and a pretraining workdir exported for transformers as it is
(issue 14, points 3 and 4): AutoTokenizer and AutoModelForMaskedLM load the export, and transformers' fill-mask
pipeline ranks the same top 5 as `bertjax fill-mask` on the workdir."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bertjax.cli import main
from bertjax.commands.fill_mask import load_predictor
from bertjax.model_dirs import load_model_dir
from train_helpers import run_pretrain, small_tokenizer, write_config

SENTENCES = ["The [MASK] statement returns a value from a function.",
             "A module can contain [MASK] statements as well as function definitions.",
             "This is [MASK] useful when the list is long."]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("usability_run")
    config = write_config(root / "run.yaml", small_tokenizer(),
                          schedule={"unit": "fraction", "warmup": 0.25, "decay": 0.5},
                          train={"steps": 8}, checkpoint={"every": 4, "keep": 3})
    run_pretrain(config, root / "run")
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
