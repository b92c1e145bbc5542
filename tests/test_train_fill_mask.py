"""`bertjax fill-mask` on a directory converted from Hugging Face (and its `bertjax convert` output)."""

import jax
import numpy as np
import pytest

import bertjax
from bertjax.cli import main
from bertjax.inference.fill_mask import encode_with_masks
from bertjax.data import load_tokenizer
from bertjax.model_dirs import load_model_dir
from train_helpers import small_tokenizer


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fill_mask")
    tokenizer = load_tokenizer(small_tokenizer())
    config = bertjax.get_config("modernbert-tiny", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    model = bertjax.EncoderForMaskedLM(config)
    directory = root / "hf"
    bertjax.save_pretrained(str(directory), model, bertjax.init_params(model, jax.random.key(0)))
    tokenizer.save(directory)  # a checkpoint directory carries its tokenizer files
    return directory, tokenizer


def test_masks_become_the_mask_id_between_cls_and_sep(hf_dir):
    _, tokenizer = hf_dir
    ids, masks = encode_with_masks(tokenizer, "A [MASK] returns [MASK] value.")
    assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id
    assert list(np.flatnonzero(ids == tokenizer.mask_id)) == list(masks) and len(masks) == 2
    with pytest.raises(ValueError, match="no \\[MASK\\]"):
        encode_with_masks(tokenizer, "nothing hidden")


def test_fill_mask_on_a_hugging_face_directory(hf_dir, capsys):
    directory, _ = hf_dir
    assert main(["fill-mask", "--model", str(directory), "--top-k", "3", "The [MASK] statement ends a loop."]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("The [") and lines[1].startswith("  mask 1: ") and lines[1].count(",") >= 2


def test_outputs_that_are_not_finite_are_an_error_not_no_candidate(hf_dir):
    """A float16 directory whose activations overflow gave NaN logits everywhere, which fill-mask reported as "no
    candidate among the top ones decodes to text", exit 0."""
    from bertjax.inference.fill_mask import make_predictor

    directory, tokenizer = hf_dir
    model, params = bertjax.from_pretrained(str(directory))
    blown = jax.tree_util.tree_map_with_path(
        lambda path, x: x * np.inf if "final_norm" in jax.tree_util.keystr(path) else x, params)
    with pytest.raises(ValueError, match="outputs are not finite .* computes in float32"):
        make_predictor(model, blown, tokenizer)("The [MASK] statement ends a loop.")


def test_fill_mask_on_converted_model_directory(hf_dir, tmp_path, capsys):
    directory, tokenizer = hf_dir
    converted = tmp_path / "converted"
    assert main(["convert", "--from-hf", str(directory), "--out", str(converted)]) == 0
    assert (converted / tokenizer.FILE_NAME).is_file()  # convert carries the tokenizer along
    model, params, loaded = load_model_dir(converted)
    assert loaded.fingerprint == tokenizer.fingerprint
    capsys.readouterr()
    assert main(["fill-mask", "--model", str(converted), "A [MASK] returns a value."]) == 0
    assert "mask 1:" in capsys.readouterr().out


def test_unknown_directory_is_a_clear_error(tmp_path, capsys):
    assert main(["fill-mask", "--model", str(tmp_path), "x [MASK]"]) == 2
    assert "not a pretraining workdir" in capsys.readouterr().err


@pytest.mark.parametrize("head, class_name", [("encoder", "EncoderModel"),
                                              ("sequence_classification", "EncoderForSequenceClassification")])
def test_a_model_without_an_mlm_head_is_a_clear_error(hf_dir, tmp_path, capsys, head, class_name):
    """A bare encoder (`train-embedder`'s model/) or a fine-tuned classifier (`finetune`'s best/) has no MLM logits:
    fill-mask says so before compiling anything, through the CLI's error path."""
    from bertjax.model_dirs import save_model_dir

    _, tokenizer = hf_dir
    config = bertjax.get_config("modernbert-tiny", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    model = bertjax.MODEL_CLASSES[head](config)
    save_model_dir(tmp_path / head, model, bertjax.init_params(model, jax.random.key(0)), tokenizer)
    assert main(["fill-mask", "--model", str(tmp_path / head), "A [MASK] returns a value."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertjax fill-mask: error: ") and "Traceback" not in err
    article = "an" if head == "encoder" else "a"
    assert f"holds {article} {head} model ({class_name}), not a masked language model" in err


def test_a_tokenizer_of_special_tokens_only_is_named_not_blamed_on_the_dtype():
    """Every candidate banned made the softmax NaN, and the error said float16 overflowed on a float32 model."""
    from bertjax.data.tokenizers import WordPieceTokenizer
    from bertjax.inference.fill_mask import make_predictor

    tokenizer = WordPieceTokenizer("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    config = bertjax.get_config("modernbert-tiny", vocab_size=64, pad_token_id=0)
    model = bertjax.EncoderForMaskedLM(config)
    with pytest.raises(ValueError, match="tokenizer's 5 tokens are all special tokens"):
        make_predictor(model, None, tokenizer)
