"""Checkpoint directory I/O: exact round trips, config formats, and clear errors naming the offending key."""

from __future__ import annotations

import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from flax import traverse_util

import bertjax
from bertjax.cli import main as cli_main
from bertjax.hf.registry import FAMILIES
from bertjax.hf.pretrained import expected_params

VOCAB = 100

# (preset, head, transformers architecture)
ARCHITECTURES = [
    ("bert-tiny", "encoder", "BertModel"),
    ("bert-tiny", "masked_lm", "BertForMaskedLM"),
    ("bert-tiny", "pretraining", "BertForPreTraining"),
    ("bert-tiny", "next_sentence", "BertForNextSentencePrediction"),
    ("roberta-tiny", "encoder", "RobertaModel"),
    ("roberta-tiny", "masked_lm", "RobertaForMaskedLM"),
    ("modernbert-tiny", "encoder", "ModernBertModel"),
    ("modernbert-tiny", "masked_lm", "ModernBertForMaskedLM"),
]


def random_params(model, seed: int = 0) -> dict:
    """Distinct non-trivial values in every leaf, drawn with numpy on the shapes of `model.init`'s tree."""
    rng = np.random.default_rng(seed)
    return traverse_util.unflatten_dict({path: jnp.asarray(rng.standard_normal(spec.shape), spec.dtype)
                                         for path, spec in expected_params(model).items()})


def tiny_model(preset: str, head: str, **overrides):
    return bertjax.MODEL_CLASSES[head](bertjax.get_config(preset, vocab_size=VOCAB, **overrides))


@pytest.fixture(scope="module")
def bert_mlm_dir(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("bert_mlm"))
    model = tiny_model("bert-tiny", "masked_lm")
    bertjax.save_pretrained(directory, model, random_params(model))
    return directory


@pytest.fixture
def bert_mlm_copy(bert_mlm_dir, tmp_path) -> str:
    directory = str(tmp_path / "checkpoint")
    shutil.copytree(bert_mlm_dir, directory)
    return directory


def edit_tensors(directory: str, edit) -> None:
    path = os.path.join(directory, "model.safetensors")
    tensors = safetensors.numpy.load_file(path)
    edit(tensors)
    safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})


def edit_config(directory: str, **changes) -> None:
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        values = json.load(f)
    values.update(changes)
    with open(path, "w") as f:
        json.dump(values, f)


def assert_same_params(a: dict, b: dict) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for path, x in traverse_util.flatten_dict(a).items():
        np.testing.assert_array_equal(np.asarray(x), np.asarray(traverse_util.flatten_dict(b)[path]), str(path))


# --------------------------------------------------------------------------------------------------------------
# Round trips and what is written


@pytest.mark.parametrize("preset", ["bert-tiny", "roberta-tiny", "albert-tiny", "longformer-tiny", "mosaicbert-tiny"])
def test_masked_lm_round_trip_gives_the_saved_config_pooler_flag_included(preset, tmp_path):
    """config.pooler says whether the family's base model has a pooler (BertModel always does). An MLM checkpoint
    holds no pooler, and its model never reads the flag, so it comes back as the family has it: a preset's config
    comes back equal, and the encoder read out of the MLM checkpoint is the model EncoderModel(config) builds."""
    model = tiny_model(preset, "masked_lm")
    assert model.config.pooler
    bertjax.save_pretrained(str(tmp_path / "mlm"), model, random_params(model))
    loaded_model, _ = bertjax.from_pretrained(str(tmp_path / "mlm"))
    assert loaded_model.config == model.config
    encoder, encoder_params = bertjax.from_pretrained(str(tmp_path / "mlm"), head="encoder")
    assert encoder.config == model.config and "pooler" in encoder_params  # the pooler initialised (it warns)
    unpooled = tiny_model(preset, "masked_lm", pooler=False)  # the flag the MLM model never reads
    bertjax.save_pretrained(str(tmp_path / "unpooled"), unpooled, random_params(unpooled))
    assert bertjax.from_pretrained(str(tmp_path / "unpooled"))[0].config == model.config


@pytest.mark.parametrize("preset,head,architecture", ARCHITECTURES, ids=[a for _, _, a in ARCHITECTURES])
def test_save_then_load_is_exact(preset, head, architecture, tmp_path):
    model = tiny_model(preset, head)
    params = random_params(model)
    bertjax.save_pretrained(str(tmp_path), model, params)
    values = json.loads((tmp_path / "config.json").read_text())
    assert values["architectures"] == [architecture]

    loaded_model, loaded = bertjax.from_pretrained(str(tmp_path))
    assert type(loaded_model) is type(model)
    assert loaded_model.config == model.config  # the pooler flag included, though the MLM classes have no pooler
    assert jax.tree.structure(loaded) == jax.tree.structure(
        jax.eval_shape(lambda: bertjax.init_params(model, jax.random.key(0))))
    assert_same_params(loaded, params)


@pytest.mark.parametrize("preset,decoder_weight,bias_names", [
    ("bert-tiny", "cls.predictions.decoder.weight", ("cls.predictions.bias", "cls.predictions.decoder.bias")),
    ("roberta-tiny", "lm_head.decoder.weight", ("lm_head.bias", "lm_head.decoder.bias")),
    ("modernbert-tiny", "decoder.weight", ("decoder.bias",)),
])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_decoder_weight_written_only_when_untied(preset, decoder_weight, bias_names, tied, tmp_path):
    model = tiny_model(preset, "masked_lm", tie_word_embeddings=tied)
    params = random_params(model)
    bertjax.save_pretrained(str(tmp_path), model, params)
    names = set(safetensors.numpy.load_file(str(tmp_path / "model.safetensors")))
    assert (decoder_weight in names) is not tied
    # Tied, transformers writes only the head's own bias; untied, it writes the decoder's bias as well.
    assert bias_names[0] in names
    assert all((name in names) is not tied for name in bias_names[1:])
    _, loaded = bertjax.from_pretrained(str(tmp_path))
    assert_same_params(loaded, params)


@pytest.mark.parametrize("preset,decoder_weight,embeddings", [
    ("bert-tiny", "cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
    ("albert-tiny", "predictions.decoder.weight", "albert.embeddings.word_embeddings.weight"),
    ("xlnet-tiny", "lm_loss.weight", "transformer.word_embedding.weight"),
])
def test_a_decoder_unlike_its_embeddings_loads_untied_whatever_config_json_says(preset, decoder_weight, embeddings,
                                                                                 tmp_path, caplog):
    """A model trained untied whose config.json kept `tie_word_embeddings: true`: transformers 5 keeps the file's
    decoder (tying only equal tensors), so bertjax must too, or every logit changes. An equal copy stays tied."""
    model = tiny_model(preset, "masked_lm", tie_word_embeddings=False)
    params = random_params(model)
    untied_dir, tied_copy_dir = str(tmp_path / "untied"), str(tmp_path / "tied_copy")
    bertjax.save_pretrained(untied_dir, model, params)
    edit_config(untied_dir, tie_word_embeddings=True)
    shutil.copytree(untied_dir, tied_copy_dir)
    edit_tensors(tied_copy_dir, lambda tensors: tensors.update({decoder_weight: tensors[embeddings].copy()}))
    with caplog.at_level("WARNING", logger="bertjax.hf.pretrained"):
        loaded_model, loaded = bertjax.from_pretrained(untied_dir)
    assert not loaded_model.config.tie_word_embeddings
    assert_same_params(loaded, params)
    assert f"{decoder_weight!r} differs from {embeddings!r}; loading them untied" in caplog.text
    caplog.clear()
    copy_model, _ = bertjax.from_pretrained(tied_copy_dir)
    assert copy_model.config.tie_word_embeddings and "untied" not in caplog.text
    if preset == "bert-tiny":  # and transformers reads the file the same way
        import torch
        import transformers

        ids = np.arange(2, 14, dtype=np.int32).reshape(2, 6)
        theirs = transformers.AutoModelForMaskedLM.from_pretrained(untied_dir).eval()
        with torch.no_grad():
            expected = theirs(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
        ours = loaded_model.apply({"params": loaded}, jnp.asarray(ids)).logits
        np.testing.assert_allclose(np.asarray(ours), expected, rtol=0, atol=2e-5)


def test_modernbert_config_is_written_for_transformers5_and_4(tmp_path):
    """transformers >= 5.1 reads layer_types and rope_parameters; 4.48-5.0 read only the older keys and would
    take their defaults (every 3rd layer global, theta 160000) in silence, so both are written."""
    model = tiny_model("modernbert-tiny", "masked_lm", num_layers=5, global_attention_every=2,
                       rope_theta_global=1234.0, rope_theta_local=99.0)
    bertjax.save_pretrained(str(tmp_path), model, random_params(model))
    values = json.loads((tmp_path / "config.json").read_text())
    assert values["model_type"] == "modernbert"
    assert values["layer_types"] == ["full_attention", "sliding_attention", "full_attention", "sliding_attention",
                                     "full_attention"]
    assert values["rope_parameters"] == {"full_attention": {"rope_type": "default", "rope_theta": 1234.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 99.0}}
    assert (values["global_attn_every_n_layers"], values["global_rope_theta"], values["local_rope_theta"]) == \
        (2, 1234.0, 99.0)


def modernbert_values(**changes) -> dict:
    values = {"model_type": "modernbert", "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 6,
              "num_attention_heads": 4, "intermediate_size": 48, "local_attention": 16, "pad_token_id": 0}
    values.update(changes)
    return values


def test_legacy_and_transformers5_modernbert_configs_mean_the_same():
    translate = FAMILIES["modernbert"].to_encoder_config
    legacy = translate(modernbert_values(global_attn_every_n_layers=2, global_rope_theta=5e4, local_rope_theta=7e3),
                       "masked_lm")
    current = translate(modernbert_values(
        layer_types=["full_attention", "sliding_attention"] * 3,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5e4},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 7e3}}), "masked_lm")
    assert legacy == current
    assert (legacy.global_attention_every, legacy.local_window) == (2, 16)
    assert (legacy.rope_theta_global, legacy.rope_theta_local) == (5e4, 7e3)
    # Absent keys take transformers' defaults: global every 3rd layer, theta 160k / 10k.
    default = translate(modernbert_values(), "encoder")
    assert (default.global_attention_every, default.rope_theta_global, default.rope_theta_local) == (3, 16e4, 1e4)
    # Every layer global: local_attention means nothing, and the config holds no window.
    every_layer_global = translate(modernbert_values(layer_types=["full_attention"] * 6), "encoder")
    assert (every_layer_global.global_attention_every, every_layer_global.local_window) == (1, None)


@pytest.mark.parametrize("layer_types", [
    ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    ["full_attention", "sliding_attention", "full_attention", "full_attention"],
    ["full_attention", "sliding_attention", "sliding_attention", "full_attention", "full_attention"],
])
def test_layer_types_not_global_every_n_is_an_error(layer_types):
    values = modernbert_values(num_hidden_layers=len(layer_types), layer_types=layer_types)
    with pytest.raises(ValueError, match="layer_types"):
        FAMILIES["modernbert"].to_encoder_config(values, "encoder")


def test_dtype_is_applied_to_params_and_config(bert_mlm_dir):
    model, params = bertjax.from_pretrained(bert_mlm_dir, dtype=jnp.bfloat16)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    assert (model.config.dtype, model.config.param_dtype) == ("bfloat16", "bfloat16")
    with pytest.raises(ValueError, match="dtype"):
        bertjax.from_pretrained(bert_mlm_dir, dtype=jnp.int32)


# --------------------------------------------------------------------------------------------------------------
# Load errors: each names the key


def test_missing_tensor_is_an_error(bert_mlm_copy):
    edit_tensors(bert_mlm_copy, lambda t: t.pop("bert.encoder.layer.1.output.dense.weight"))
    with pytest.raises(ValueError, match=r"missing tensor 'bert\.encoder\.layer\.1\.output\.dense\.weight'"):
        bertjax.from_pretrained(bert_mlm_copy)


def test_a_bare_model_saved_without_its_pooler_loads_with_a_fresh_one(tmp_path, caplog):
    """BertModel(add_pooling_layer=False).save_pretrained writes no pooler: transformers loads it and initialises one;
    bertjax refused it ('missing tensor pooler.dense.weight'), with no head= to get round it."""
    model = tiny_model("bert-tiny", "encoder")
    params = random_params(model)
    bertjax.save_pretrained(str(tmp_path), model, params)
    edit_tensors(str(tmp_path), lambda t: [t.pop(k) for k in ("pooler.dense.weight", "pooler.dense.bias")])
    with caplog.at_level("WARNING", logger="bertjax.hf.pretrained"):
        loaded, fresh = bertjax.from_pretrained(str(tmp_path))
    assert "holds no pooler (saved with add_pooling_layer=False)" in caplog.text
    assert fresh["pooler"]["dense"]["kernel"].shape == params["pooler"]["dense"]["kernel"].shape
    ids = jnp.arange(4, 20).reshape(2, 8)
    np.testing.assert_array_equal(loaded.apply({"params": fresh}, ids).last_hidden_state,
                                  model.apply({"params": params}, ids).last_hidden_state)


@pytest.mark.parametrize("preset, head, transformers_class", [
    ("deberta-v3-tiny", "replaced_token_detection", "DebertaV2Model"),  # a GDES run's discriminator: no RTD class
    ("electra-tiny-discriminator", "replaced_token_detection", "ElectraModel"),
    ("bert-tiny", "pretraining", "BertModel"),  # the pooler is kept
    ("bert-tiny", "sequence_classification", "BertModel"),  # its dense layer is BERT's pooler
    ("albert-tiny", "multiple_choice", "AlbertModel"),
])
def test_to_hf_head_encoder_writes_the_bare_encoder(preset, head, transformers_class, tmp_path, capsys):
    """`convert --to-hf DIR --head encoder`: the backbone without its head, which transformers loads as the family's
    *Model and runs as bertjax does. A DeBERTa-v3 discriminator had no way out: DeBERTa has no RTD class, and --head
    was refused with --to-hf."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bertjax.model_dirs import save_model_dir

    model = tiny_model(preset, head, dropout_rate=0.0)
    params = random_params(model)
    save_model_dir(tmp_path / "model", model, params)
    if preset.startswith("deberta"):  # ELECTRA has ElectraForPreTraining; DeBERTa no RTD class
        assert cli_main(["convert", "--to-hf", str(tmp_path / "model"), "--out", str(tmp_path / "refused")]) == 2
        assert "--head encoder` writes the bare encoder" in capsys.readouterr().err
    assert cli_main(["convert", "--to-hf", str(tmp_path / "model"), "--head", "encoder",
                     "--out", str(tmp_path / "hf")]) == 0
    reference = getattr(transformers, transformers_class).from_pretrained(tmp_path / "hf").eval()
    ids = np.arange(3, 19).reshape(2, 8) % VOCAB
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    bare = bertjax.MODEL_CLASSES["encoder"](model.config.replace(task=None))
    kept = {name: params[name] for name in ("embeddings", "encoder", "pooler") if name in params}
    if head in ("sequence_classification", "multiple_choice"):  # the head's dense layer is the family's pooler
        kept["pooler"] = {"dense": params["classifier"]["dense"]}
    ours = bare.apply({"params": kept}, jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    with torch.no_grad():
        theirs = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    real = mask.astype(bool)
    # Weights drawn from N(0, 1) (random_params): activations of order 1-10, float32 sums of such terms.
    np.testing.assert_allclose(np.asarray(ours.last_hidden_state)[real], theirs.last_hidden_state.numpy()[real],
                               rtol=1e-4, atol=1e-4)
    theirs_pooled = getattr(theirs, "pooler_output", None)
    assert (ours.pooler_output is not None) == (theirs_pooled is not None) == model.config.pooler
    if model.config.pooler:
        np.testing.assert_allclose(np.asarray(ours.pooler_output), theirs_pooled.numpy(), rtol=1e-4, atol=1e-4)
    capsys.readouterr()
    assert cli_main(["convert", "--to-hf", str(tmp_path / "model"), "--head", "masked_lm",
                     "--out", str(tmp_path / "x")]) == 2
    assert "--head masked_lm with --to-hf" in capsys.readouterr().err
    if head == "pretraining":  # an MLM alone has no pooler to give BertModel: its own export is the way
        mlm = tiny_model(preset, "masked_lm")
        save_model_dir(tmp_path / "mlm", mlm, random_params(mlm))
        assert cli_main(["convert", "--to-hf", str(tmp_path / "mlm"), "--head", "encoder",
                         "--out", str(tmp_path / "y")]) == 2
        assert "the masked_lm model has no trained pooler, which the bert encoder has" in capsys.readouterr().err


def test_unexpected_tensor_is_an_error(bert_mlm_copy):
    extra = {"bert.encoder.layer.2.output.dense.bias": np.zeros(32, np.float32)}
    edit_tensors(bert_mlm_copy, lambda t: t.update(extra))
    with pytest.raises(ValueError, match=r"unexpected tensor.*bert\.encoder\.layer\.2\.output\.dense\.bias"):
        bertjax.from_pretrained(bert_mlm_copy)


def test_tensor_names_decide_over_architectures_as_in_transformers(bert_mlm_dir, bert_mlm_copy, tmp_path, caplog):
    # A head model's file ("bert." names) that says BertModel, and a bare model's file that says BertForMaskedLM:
    # read by the names, as transformers reads them, with a warning; what the file lacks starts fresh.
    edit_config(bert_mlm_copy, architectures=["BertModel"])
    with caplog.at_level("WARNING", logger="bertjax.hf.pretrained"):
        model, params = bertjax.from_pretrained(bert_mlm_copy)
    assert "tensor names are a head model's ('bert.' prefix)" in caplog.text
    assert type(model) is bertjax.EncoderModel
    _, as_encoder = bertjax.from_pretrained(bert_mlm_dir, head="encoder")
    assert_same_params(params, as_encoder)

    bare = str(tmp_path / "bare")
    encoder = tiny_model("bert-tiny", "encoder")
    encoder_params = random_params(encoder, seed=3)
    bertjax.save_pretrained(bare, encoder, encoder_params)
    edit_config(bare, architectures=["BertForMaskedLM"])
    caplog.clear()
    with caplog.at_level("WARNING", logger="bertjax.hf.pretrained"):
        model, params = bertjax.from_pretrained(bare)
    assert "tensor names are a bare model's" in caplog.text and "mlm_head/dense/kernel" in caplog.text
    assert type(model) is bertjax.EncoderForMaskedLM
    for scope in ("embeddings", "encoder"):
        assert_same_params(params[scope], encoder_params[scope])


def _drop_config_key(directory: str, key: str) -> None:
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        values = json.load(f)
    del values[key]
    with open(path, "w") as f:
        json.dump(values, f)


def test_a_config_without_architectures_is_what_its_tensors_hold(bert_mlm_dir, bert_mlm_copy, tmp_path):
    # DeBERTa's own releases (microsoft/deberta-base, -v3-base) have model_type but no architectures: MLM files.
    _drop_config_key(bert_mlm_copy, "architectures")
    model, params = bertjax.from_pretrained(bert_mlm_copy)
    assert type(model) is bertjax.EncoderForMaskedLM
    assert_same_params(params, bertjax.from_pretrained(bert_mlm_dir)[1])
    model, params = bertjax.from_pretrained(bert_mlm_copy, head="encoder")  # a head asked for is that head
    assert type(model) is bertjax.EncoderModel
    assert_same_params(params, bertjax.from_pretrained(bert_mlm_dir, head="encoder")[1])
    # Without MLM head tensors: the bare model, as transformers' AutoModel builds it.
    bare = str(tmp_path / "bare")
    encoder = tiny_model("bert-tiny", "encoder")
    bertjax.save_pretrained(bare, encoder, random_params(encoder, seed=3))
    _drop_config_key(bare, "architectures")
    assert type(bertjax.from_pretrained(bare)[0]) is bertjax.EncoderModel


def test_a_config_without_model_type_takes_the_family_of_its_class(bert_mlm_dir, bert_mlm_copy):
    _drop_config_key(bert_mlm_copy, "model_type")
    model, params = bertjax.from_pretrained(bert_mlm_copy)
    assert type(model) is bertjax.EncoderForMaskedLM and model.config.family == "bert"
    assert_same_params(params, bertjax.from_pretrained(bert_mlm_dir)[1])
    edit_config(bert_mlm_copy, architectures=["FunnelForMaskedLM"])
    with pytest.raises(ValueError, match=r"checkpoint/config\.json: no 'model_type', and architectures\[0\] "
                                         r"\('FunnelForMaskedLM'\) is no class bertjax reads"):
        bertjax.from_pretrained(bert_mlm_copy)


def test_mlm_checkpoint_with_pretraining_heads_loads_without_them(bert_mlm_dir, bert_mlm_copy, caplog):
    """bert-base-uncased says BertForMaskedLM but its file still holds the pooler and NSP head."""
    extra = {"bert.pooler.dense.weight": np.ones((32, 32), np.float32),
             "bert.pooler.dense.bias": np.ones(32, np.float32),
             "cls.seq_relationship.weight": np.ones((2, 32), np.float32),
             "cls.seq_relationship.bias": np.ones(2, np.float32)}
    edit_tensors(bert_mlm_copy, lambda t: t.update(extra))
    with caplog.at_level("WARNING", logger="bertjax.hf.pretrained"):
        _, params = bertjax.from_pretrained(bert_mlm_copy)
    assert all(name in caplog.text for name in extra)
    assert_same_params(params, bertjax.from_pretrained(bert_mlm_dir)[1])


def test_tensorflow_era_layer_norm_names_are_accepted(bert_mlm_dir, bert_mlm_copy):
    def rename(tensors):
        for name in [n for n in tensors if "LayerNorm." in n]:
            tensors[name.replace(".weight", ".gamma").replace(".bias", ".beta")] = tensors.pop(name)

    edit_tensors(bert_mlm_copy, rename)
    assert_same_params(bertjax.from_pretrained(bert_mlm_copy)[1], bertjax.from_pretrained(bert_mlm_dir)[1])


def test_nsp_head_is_unexpected_for_roberta(tmp_path):
    model = tiny_model("roberta-tiny", "masked_lm")
    bertjax.save_pretrained(str(tmp_path), model, random_params(model))
    edit_tensors(str(tmp_path), lambda t: t.update({"cls.seq_relationship.bias": np.ones(2, np.float32)}))
    with pytest.raises(ValueError, match=r"unexpected tensor.*cls\.seq_relationship\.bias"):
        bertjax.from_pretrained(str(tmp_path))


def test_wrong_shape_is_an_error(bert_mlm_copy):
    edit_tensors(bert_mlm_copy, lambda t: t.update(
        {"bert.encoder.layer.0.attention.self.key.weight": np.zeros((16, 64), np.float32)}))
    key = r"'bert\.encoder\.layer\.0\.attention\.self\.key\.weight'"
    with pytest.raises(ValueError, match=key + r" has shape \(16, 64\)"):
        bertjax.from_pretrained(bert_mlm_copy)


@pytest.mark.parametrize("changes,match", [
    ({"architectures": ["BertForWordPuzzles"]}, r"unsupported architecture 'BertForWordPuzzles'; bert classes "
                                                r"bertjax reads: \['BertForMaskedLM'"),
    ({"architectures": ["BertLMHeadModel"]}, "BertLMHeadModel is a causal .left-to-right. language model"),
    ({"architectures": []}, "architectures"),
    ({"model_type": "funnel"}, r"checkpoint/config\.json: unknown model_type 'funnel'"),  # not a bertjax family
    ({"architectures": ["RobertaForMaskedLM"]}, "model_type is 'bert'"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu'"),
    ({"is_decoder": True}, "is_decoder"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
])
def test_config_errors_name_the_key(bert_mlm_copy, changes, match):
    edit_config(bert_mlm_copy, **changes)
    with pytest.raises(ValueError, match=match):
        bertjax.from_pretrained(bert_mlm_copy)


@pytest.mark.parametrize("preset,changes,match", [
    ("xlnet-tiny", {"d_head": 7}, r"d_head=7, but XLNet's heads are d_model // n_head = \d+ wide"),
    ("roberta-tiny", {"pad_token_id": None}, r"pad_token_id is null, but roberta numbers positions from pad_token_id"),
    ("longformer-tiny", {"pad_token_id": None}, r"pad_token_id is null, but longformer numbers positions"),
])
def test_config_values_transformers_cannot_run_are_refused(preset, changes, match):
    """transformers refuses XLNet's d_head != d_model // n_head and fails at RoBERTa's first forward without a
    padding id; bertjax says so on load rather than run a model transformers cannot."""
    config = bertjax.get_config(preset)
    family = FAMILIES[config.family]
    values = {**family.hf_config(config, "masked_lm"), **changes}
    with pytest.raises(ValueError, match=match):
        family.encoder_config(values, "masked_lm")
    family.encoder_config({**values, **family.hf_config(config, "masked_lm")}, "masked_lm")  # the written values load


def test_missing_files_are_errors(bert_mlm_copy, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        bertjax.from_pretrained(str(tmp_path / "nowhere"))
    os.remove(os.path.join(bert_mlm_copy, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="no weights found"):
        bertjax.from_pretrained(bert_mlm_copy)


def _as_torch_bin(directory: str) -> None:
    torch = pytest.importorskip("torch")
    tensors = safetensors.numpy.load_file(os.path.join(directory, "model.safetensors"))
    torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, os.path.join(directory, "pytorch_model.bin"))
    os.remove(os.path.join(directory, "model.safetensors"))


def test_pytorch_bin_is_read_with_torch(bert_mlm_dir, bert_mlm_copy):
    _as_torch_bin(bert_mlm_copy)
    _, from_bin = bertjax.from_pretrained(bert_mlm_copy, allow_pickle=True)
    _, from_safetensors = bertjax.from_pretrained(bert_mlm_dir)
    assert_same_params(from_bin, from_safetensors)


def test_pytorch_bin_without_torch_is_a_clear_error(bert_mlm_copy, monkeypatch):
    _as_torch_bin(bert_mlm_copy)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(ValueError, match="needs torch"):
        bertjax.from_pretrained(bert_mlm_copy, allow_pickle=True)


class _NotATensor:
    pass


def test_pytorch_bin_with_arbitrary_objects_is_refused(bert_mlm_copy):
    torch = pytest.importorskip("torch")
    os.remove(os.path.join(bert_mlm_copy, "model.safetensors"))
    torch.save({"weight": _NotATensor()}, os.path.join(bert_mlm_copy, "pytorch_model.bin"))
    with pytest.raises(ValueError, match="weights_only") as refused:
        bertjax.from_pretrained(bert_mlm_copy, allow_pickle=True)
    # torch's one line saying why, not its advice to retry with weights_only=False
    assert "\n" not in str(refused.value) and "weights_only` set to `False`" not in str(refused.value)


def _shard(directory: str, weight_map_edit=None) -> None:
    """Split model.safetensors into two shards with an index, as transformers' max_shard_size does."""
    single = os.path.join(directory, "model.safetensors")
    tensors = safetensors.numpy.load_file(single)
    os.remove(single)
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        safetensors.numpy.save_file({n: tensors[n] for n in part}, os.path.join(directory, shard),
                                    metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    if weight_map_edit:
        weight_map_edit(weight_map)
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def test_sharded_index_loads(bert_mlm_dir, bert_mlm_copy):
    _shard(bert_mlm_copy)
    assert_same_params(bertjax.from_pretrained(bert_mlm_copy)[1], bertjax.from_pretrained(bert_mlm_dir)[1])


@pytest.mark.parametrize("edit,match", [
    (lambda m: m.update({"bert.embeddings.LayerNorm.weight": "../elsewhere.safetensors"}), "inside the checkpoint"),
    (lambda m: m.update({"bert.pooler.dense.weight": "model-00001-of-00002.safetensors"}), "not found there"),
])
def test_bad_sharded_index_is_an_error(bert_mlm_copy, edit, match):
    _shard(bert_mlm_copy, edit)
    with pytest.raises(ValueError, match=match):
        bertjax.from_pretrained(bert_mlm_copy)


# --------------------------------------------------------------------------------------------------------------
# Save refusals


@pytest.mark.parametrize("preset,head,overrides,match", [
    ("bert-tiny", "masked_lm", {"mlp": "glu"}, "mlp='glu'"),
    ("bert-tiny", "masked_lm", {"num_kv_heads": 2}, "num_kv_heads=2"),
    ("bert-tiny", "encoder", {"pooler": False}, "pooler=False"),
    ("roberta-tiny", "masked_lm", {"head_activation": "relu"}, "head_activation='relu'"),
    ("modernbert-tiny", "masked_lm", {"final_norm": False}, "final_norm=False"),
    ("modernbert-tiny", "pretraining", {}, "no modernbert architecture"),
    # Another family's attention module, written under a family whose checkpoint has no place for its tensors.
    ("longformer-tiny", "masked_lm", {"family": "roberta"}, "attention_kind='longformer' \\(needs 'standard'\\)"),
    ("longformer-tiny", "encoder", {"family": "eurobert"}, "attention_kind='longformer' \\(needs 'standard'\\)"),
])
def test_save_refuses_what_the_family_cannot_express(preset, head, overrides, match, tmp_path):
    model = tiny_model(preset, head, **overrides)
    with pytest.raises(ValueError, match=match):
        bertjax.save_pretrained(str(tmp_path), model, random_params(model))
    assert not (tmp_path / "model.safetensors").exists()


def test_save_refuses_params_of_another_structure(tmp_path):
    model = tiny_model("bert-tiny", "masked_lm")
    params = random_params(model)
    params["mlm_head"].pop("decoder_bias")
    with pytest.raises(ValueError, match="mlm_head/decoder_bias"):
        bertjax.save_pretrained(str(tmp_path), model, params)
    params = random_params(model)
    params["mlm_head"]["decoder_bias"] = jnp.zeros(VOCAB + 1)
    with pytest.raises(ValueError, match=r"mlm_head/decoder_bias.*shape"):
        bertjax.save_pretrained(str(tmp_path), model, params)


# --------------------------------------------------------------------------------------------------------------
# bertjax convert


def test_convert_round_trip_through_a_bertjax_model_directory(bert_mlm_dir, tmp_path, capsys):
    native, back = str(tmp_path / "native"), str(tmp_path / "hf")
    assert cli_main(["convert", "--from-hf", bert_mlm_dir, "--out", native]) == 0
    assert cli_main(["convert", "--to-hf", native, "--out", back]) == 0
    original = safetensors.numpy.load_file(os.path.join(bert_mlm_dir, "model.safetensors"))
    converted = safetensors.numpy.load_file(os.path.join(back, "model.safetensors"))
    assert original.keys() == converted.keys()
    for name in original:
        np.testing.assert_array_equal(original[name], converted[name], name)
    assert json.loads(open(os.path.join(back, "config.json")).read()) == \
        json.loads(open(os.path.join(bert_mlm_dir, "config.json")).read())
    assert cli_main(["convert", "--from-hf", str(tmp_path / "nowhere"), "--out", native]) == 2
    assert "config.json" in capsys.readouterr().err


@pytest.mark.parametrize("preset, changes, expected", [
    # answerdotai/ModernBERT-base's MLM config.json says "classifier_pooling": "mean"
    ("modernbert-tiny", {"classifier_pooling": "mean"}, (None, "mean")),
    # distilbert-base-uncased: dropout 0.1, seq_classif_dropout 0.2
    ("distilbert-tiny", {"dropout": 0.1, "seq_classif_dropout": 0.2}, (0.2, "cls")),
    # Without the key (or null), its config class's default (it was the encoder's dropout): DistilBERT 0.2, ALBERT 0.1
    ("distilbert-tiny", {"dropout": 0.1, "seq_classif_dropout": None}, (0.2, "cls")),
    ("albert-tiny", {"classifier_dropout_prob": None}, (0.1, "cls")),
    # EuroBERT's heads pool "late" unless its config.json says otherwise (transformers' default)
    ("eurobert-tiny", {}, (None, "late")),
    ("eurobert-tiny", {"classifier_pooling": "mean"}, (None, "mean")),
])
def test_a_masked_lm_checkpoint_hands_its_classifier_settings_to_fine_tuning(preset, changes, expected, tmp_path):
    """A task head fine-tuned from an MLM checkpoint pools and drops out as transformers' head from it does."""
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import task_class
    from bertjax.finetune.tasks.base import Labels
    from bertjax.finetune.trainer import task_model

    model = tiny_model(preset, "masked_lm")
    bertjax.save_pretrained(str(tmp_path), model, random_params(model))
    edit_config(str(tmp_path), **changes)
    loaded, _ = bertjax.from_pretrained(str(tmp_path))
    assert type(loaded) is bertjax.EncoderForMaskedLM
    cls = task_class("sequence-classification")
    config = load_finetune_config(None, [], cls.defaults)
    head = task_model(loaded.config, cls(config.data, config.task), Labels(names=("a", "b"))).config.task
    assert (head.classifier_dropout, head.classifier_pooling) == expected


def test_convert_builds_the_head_asked_for(bert_mlm_dir, tmp_path, capsys):
    from bertjax.model_dirs import load_model_dir

    native = str(tmp_path / "native")
    assert cli_main(["convert", "--from-hf", bert_mlm_dir, "--head", "encoder", "--out", native]) == 0
    model, params, _ = load_model_dir(native)
    assert type(model) is bertjax.EncoderModel
    assert_same_params(params, bertjax.from_pretrained(bert_mlm_dir, head="encoder")[1])
    # With --to-hf, --head takes `encoder` only (the bare encoder of any model: here the model itself).
    assert cli_main(["convert", "--to-hf", native, "--head", "encoder", "--out", str(tmp_path / "hf")]) == 0
    assert_same_params(params, bertjax.from_pretrained(str(tmp_path / "hf"))[1])
    assert cli_main(["convert", "--to-hf", native, "--head", "masked_lm", "--out", str(tmp_path / "hf2")]) == 2
    assert "--head masked_lm with --to-hf" in capsys.readouterr().err


def test_convert_to_hf_writes_the_dtype_asked_for(bert_mlm_dir, tmp_path, capsys):
    """--dtype bfloat16 with --to-hf (float32 training weights published in bfloat16) was accepted and ignored."""
    import torch
    import transformers

    native, back = str(tmp_path / "native"), str(tmp_path / "hf")
    assert cli_main(["convert", "--from-hf", bert_mlm_dir, "--out", native]) == 0
    assert cli_main(["convert", "--to-hf", native, "--out", back, "--dtype", "bfloat16"]) == 0
    original = safetensors.numpy.load_file(os.path.join(bert_mlm_dir, "model.safetensors"))
    with safetensors.safe_open(os.path.join(back, "model.safetensors"), "pt") as exported:
        for name in original:
            tensor = exported.get_tensor(name)
            assert tensor.dtype == torch.bfloat16, name
            np.testing.assert_array_equal(tensor.float().numpy(),
                                          torch.from_numpy(original[name]).bfloat16().float().numpy(), name)
    assert json.loads(open(os.path.join(back, "config.json")).read())["dtype"] == "bfloat16"
    assert transformers.AutoModelForMaskedLM.from_pretrained(back).dtype == torch.bfloat16
    huge = tmp_path / "huge"
    model, params = bertjax.from_pretrained(bert_mlm_dir)
    params["mlm_head"]["decoder_bias"] = params["mlm_head"]["decoder_bias"].at[0].set(1e6)
    from bertjax.model_dirs import save_model_dir
    save_model_dir(str(huge), model, params)
    assert cli_main(["convert", "--to-hf", str(huge), "--out", str(tmp_path / "f16"), "--dtype", "float16"]) == 2
    assert "values beyond the range of float16" in capsys.readouterr().err
    assert not (tmp_path / "f16").exists()


@pytest.mark.parametrize("preset", ["bert-tiny", "modernbert-tiny"])
def test_convert_round_trip_keeps_special_token_ids(preset, tmp_path):
    """bos/eos/cls/sep ids of the source config.json are not EncoderConfig fields (the arithmetic never reads
    them), but pipelines and generation utilities do: the bertjax model directory keeps them and the export writes
    them back where the family's own export leaves them unset (ModernBERT's writes None for all four), never over
    what the model's config sets (pad_token_id)."""
    source = tmp_path / "source"
    model = tiny_model(preset, "masked_lm")
    bertjax.save_pretrained(str(source), model, random_params(model))
    config = json.loads((source / "config.json").read_text())
    ids = {"bos_token_id": 5, "eos_token_id": 6, "cls_token_id": 7, "sep_token_id": 8}
    (source / "config.json").write_text(json.dumps({**config, **ids}))
    native, back = tmp_path / "native", tmp_path / "hf"
    assert cli_main(["convert", "--from-hf", str(source), "--out", str(native)]) == 0
    assert json.loads((native / "model_config.json").read_text())["token_ids"] == ids
    assert cli_main(["convert", "--to-hf", str(native), "--out", str(back)]) == 0
    assert json.loads((back / "config.json").read_text()) == {**config, **ids}
    # A transformers directory exported again keeps them too.
    assert cli_main(["convert", "--to-hf", str(back), "--out", str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == {**config, **ids}


def test_a_beam_search_qa_checkpoint_gives_its_encoder_to_an_explicit_head(tmp_path):
    """XLNetForQuestionAnswering's span head is not modelled, but its encoder is an ordinary XLNet: with head=...
    it loads (the head tensors reported unused) and gives transformers' hidden states."""
    import torch
    import transformers

    config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=64, mem_len=None,
                                      start_n_top=2, end_n_top=2)
    torch.manual_seed(0)
    reference = transformers.XLNetForQuestionAnswering(config).eval()
    reference.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match=r"beam-search span head.*pass head="):
        bertjax.from_pretrained(str(tmp_path))
    model, params = bertjax.from_pretrained(str(tmp_path), head="encoder")
    ids = np.random.default_rng(0).integers(5, VOCAB, (2, 9))
    with torch.no_grad():
        expected = reference.transformer(torch.tensor(ids)).last_hidden_state.numpy()
    got = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(ids)).last_hidden_state)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_a_new_head_takes_the_backbone_from_the_file_and_the_seeds_initialisation_for_itself(tmp_path):
    mlm = bertjax.EncoderForMaskedLM(bertjax.get_config("bert-tiny"))
    saved = random_params(mlm, seed=4)
    bertjax.save_pretrained(str(tmp_path), mlm, saved)
    model, params = bertjax.from_pretrained(str(tmp_path), head="sequence_classification", num_labels=3, seed=5)
    whole_init = traverse_util.flatten_dict(bertjax.init_params(model, jax.random.key(5)))
    loaded, saved = traverse_util.flatten_dict(params), traverse_util.flatten_dict(saved)
    head = [path for path in loaded if path[0] not in ("embeddings", "encoder")]
    assert head and all(path[0] == "classifier" for path in head)
    for path in head:  # the head as the whole model's initialisation with that seed draws it (op by op here, so
        # within a float32 rounding of the compiled draw)
        np.testing.assert_allclose(np.asarray(loaded[path]), np.asarray(whole_init[path]), rtol=1e-6, atol=0,
                                   err_msg=str(path))
    for path in loaded.keys() - set(head):
        np.testing.assert_array_equal(np.asarray(loaded[path]), np.asarray(saved[path]), err_msg=str(path))
    _, other = bertjax.from_pretrained(str(tmp_path), head="sequence_classification", num_labels=3, seed=6)
    assert not np.array_equal(np.asarray(other["classifier"]["out"]["kernel"]),
                              np.asarray(params["classifier"]["out"]["kernel"]))
