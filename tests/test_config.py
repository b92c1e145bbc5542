import dataclasses

import pytest

from bertjax.config import PRESETS, EncoderConfig, get_config


def test_presets_match_published_sizes():
    mb = get_config("modernbert-base")
    assert (mb.num_layers, mb.hidden_size, mb.intermediate_size, mb.num_heads, mb.vocab_size) == (22, 768, 1152, 12, 50368)
    assert mb.local_window == 128 and mb.global_attention_every == 3
    assert (mb.rope_theta_global, mb.rope_theta_local) == (160_000.0, 10_000.0)
    assert [mb.layer_window(i) for i in range(4)] == [None, 128, 128, None]
    ml = get_config("modernbert-large")
    assert (ml.num_layers, ml.hidden_size, ml.intermediate_size, ml.num_heads) == (28, 1024, 2624, 16)
    bl = get_config("bert-large")
    assert (bl.num_layers, bl.hidden_size, bl.num_heads, bl.intermediate_size) == (24, 1024, 16, 4096)
    rb = get_config("roberta-base")
    assert rb.position_offset == 2 and rb.norm_eps == 1e-5 and rb.type_vocab_size == 1
    for name in ("bert-base", "bert-large", "roberta-base", "roberta-large", "modernbert-base", "modernbert-large",
                 "bert-tiny", "roberta-tiny", "modernbert-tiny"):
        assert name in PRESETS


def test_config_is_frozen_and_hashable():
    cfg = get_config("bert-tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 3  # type: ignore[misc]
    assert hash(cfg) == hash(get_config("bert-tiny"))


@pytest.mark.parametrize("changes, field", [
    ({"hidden_size": 30}, "hidden_size"),
    ({"num_kv_heads": 3}, "num_kv_heads"),
    ({"local_window": 0}, "local_window"),
    ({"local_window": -4}, "local_window"),
    ({"global_attention_every": 3, "local_window": None}, "local_window"),
    ({"num_layers": 0}, "num_layers"),
    ({"norm": "rmsnorm"}, "norm_bias"),
    ({"num_layer_groups": 5}, "num_layer_groups"),
    ({"pad_token_id": 1000}, "pad_token_id"),
    ({"dropout_rate": 1.5}, "dropout_rate"),
    ({"activation": "swish"}, "activation"),
    ({"hidden_size": "32"}, "hidden_size"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings"),
])
def test_impossible_configs_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        get_config("bert-tiny").replace(**changes)


def test_shared_layers_need_one_attention_pattern():
    with pytest.raises(ValueError, match="num_layer_groups"):
        get_config("modernbert-tiny", num_layer_groups=1)


def test_settings_that_cannot_apply_are_errors_naming_the_field():
    with pytest.raises(ValueError, match=r"local_window=4 has no effect with global_attention_every=1"):
        get_config("bert-tiny", local_window=4)  # every layer global: the window would silently do nothing
    with pytest.raises(ValueError, match=r"EncoderConfig.attention_implementation must be 'auto' or one of .*'flash'"):
        get_config("bert-tiny", attention_implementation="flash")
    # DeBERTa's and XLNet's attention build every head for keys and values, with (DeBERTa) or without biases.
    with pytest.raises(ValueError, match=r"DeBERTa attention has no grouped-query attention \(num_kv_heads=2\)"):
        get_config("deberta-v3-tiny", num_kv_heads=2)
    with pytest.raises(ValueError,
                       match=r"XLNet's attention projections have no biases \(attention_bias must be False\)"):
        get_config("xlnet-tiny", attention_bias=True)
    with pytest.raises(ValueError, match=r"DeBERTa's attention projections have biases"):
        get_config("deberta-v3-tiny", attention_bias=False)


def test_unknown_fields_and_presets_are_errors():
    with pytest.raises(ValueError, match="hiden_size"):
        get_config("bert-tiny", hiden_size=3)
    with pytest.raises(ValueError, match="no-such-model"):
        get_config("no-such-model")
    with pytest.raises(ValueError, match="colour"):
        EncoderConfig.from_dict({**get_config("bert-tiny").to_dict(), "colour": "red"})


def test_round_trip_through_dict():
    cfg = get_config("modernbert-tiny")
    assert EncoderConfig.from_dict(cfg.to_dict()) == cfg
