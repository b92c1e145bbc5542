"""ALiBi and global tokens in every implementation that claims them, against the dense XLA reference (itself tested
against numpy in test_attention_reference.py), forward and dq/dk/dv; and the capability registry behind "auto"."""

import jax
import numpy as np
import pytest

from bertjax import ops
from bertjax.ops.attention import AUTO_PREFERENCE, FEATURES, IMPLEMENTATIONS, required_features


def test_every_implementation_declares_known_features_and_xla_serves_all():
    assert set(IMPLEMENTATIONS["xla"].features) == set(FEATURES)
    for name, impl in IMPLEMENTATIONS.items():
        assert impl.features <= set(FEATURES), name


def test_auto_picks_the_first_preference_that_supports_the_call():
    everything = required_features(heads=4, kv_heads=2, local_window=8, alibi=True, global_tokens=True)
    assert everything == set(FEATURES)
    for platform, preference in AUTO_PREFERENCE.items():
        plain = ops.resolve_implementation("auto", frozenset(), platform=platform)
        assert plain == preference[0]
        chosen = ops.resolve_implementation("auto", everything, platform=platform)
        assert everything <= IMPLEMENTATIONS[chosen].features


def test_explicit_implementation_without_a_feature_is_an_error_naming_it():
    lacking = [(name, feature) for name, impl in IMPLEMENTATIONS.items() for feature in FEATURES
               if feature not in impl.features]
    for name, feature in lacking:
        with pytest.raises(ValueError, match=f"{name!r} does not support {feature}"):
            ops.resolve_implementation(name, frozenset({feature}))
    # Through the entry point too, before anything is traced.
    x = np.zeros((1, 4, 2, 8), np.float32)
    for name, feature in lacking:
        if feature == "alibi":
            with pytest.raises(ValueError, match="does not support alibi"):
                ops.attention(x, x, x, implementation=name, alibi_slopes=np.ones(2, np.float32))


def test_global_tokens_on_a_global_layer_change_nothing():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 6, 2, 8)).astype(np.float32) for _ in range(3))
    glob = np.array([[True, False, False, True, False, False]])
    got = ops.attention(q, k, v, global_tokens=glob, implementation="xla")
    np.testing.assert_allclose(np.asarray(got), np.asarray(ops.attention(q, k, v, implementation="xla")))
