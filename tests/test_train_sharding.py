"""The sharded train step gives the losses of a single device on every mesh shape (8 fake CPU devices): MLM on every
mesh shape, and the objectives with more than one model or on-device sampling (ELECTRA, XLNet's permutation LM,
DeBERTa-v3's GDES) on a (2, 2, 2) mesh. All four objectives run in one subprocess: each start of one costs seconds of
imports on the suite's two cores."""

import json
import subprocess
import sys

import numpy as np
import pytest

from train_helpers import REPO, cpu_env, small_tokenizer


def run_script(*objectives: str) -> dict:
    """{objective: {(mesh, microbatches): result}} from one interpreter (each start costs seconds of imports)."""
    tokenizer = small_tokenizer()
    # XLA_FLAGS take effect only before JAX starts, hence a fresh interpreter.
    run = subprocess.run([sys.executable, str(REPO / "tests" / "train_sharding_script.py"), str(tokenizer),
                          *objectives], env=cpu_env(devices=8), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    out = {}
    for line in run.stdout.splitlines():
        if line.startswith("RESULTS "):
            objective, found = line.removeprefix("RESULTS ").split(" ", 1)
            out[objective] = {(tuple(r["mesh"]), r["microbatches"]): r for r in json.loads(found)}
    assert sorted(out) == sorted(objectives), run.stdout
    return out


@pytest.fixture(scope="module")
def all_runs():
    """The MLM meshes and the ELECTRA, permutation-LM and DeBERTa GDES steps, from one subprocess."""
    return run_script("mlm", "electra", "permutation_lm", "deberta_gdes")


@pytest.fixture(scope="module")
def results(all_runs):
    return all_runs["mlm"]


@pytest.mark.parametrize("mesh, microbatches", [((8, 1, 1), 1), ((2, 4, 1), 1), ((2, 2, 2), 1), ((1, 8, 1), 1),
                                                ((2, 2, 2), 2)])
def test_losses_match_one_device(results, mesh, microbatches):
    reference = results[((1, 1, 1), 1)]
    got = results[(mesh, microbatches)]
    assert len(got["losses"]) == 4 and got["losses"][0] > 3.0
    np.testing.assert_allclose(got["losses"], reference["losses"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(got["param_sum"], reference["param_sum"], rtol=1e-5)


def test_parameters_and_optimizer_state_are_sharded_by_the_rules(results):
    # embed -> fsdp, heads -> tensor; the Adam moments live where their parameters do.
    assert results[((1, 8, 1), 1)]["query_spec"] == ["fsdp", None, None]
    assert results[((1, 8, 1), 1)]["word_embedding_spec"] == [None, "fsdp"]
    assert results[((2, 2, 2), 1)]["query_spec"] == ["fsdp", "tensor", None]
    assert results[((2, 2, 2), 1)]["mu_query_spec"] == ["fsdp", "tensor", None]
    assert results[((2, 2, 2), 1)]["query_shards"] == 4
    assert results[((8, 1, 1), 1)]["query_spec"] == [None, None, None]  # pure data parallel: replicated


def test_electra_step_matches_one_device(all_runs):
    """Generator and discriminator trained jointly (sampling included) give the single-device losses."""
    results = all_runs["electra"]
    for mesh, microbatches in (((2, 2, 2), 1),):
        reference = results[((1, 1, 1), microbatches)]
        assert reference["losses"][0] > 1.0
        got = results[(mesh, microbatches)]
        # Each loss term within 1e-5; the total (about 40: 50 x the RTD loss) to float32 rounding of its size.
        for step, (ours, theirs) in enumerate(zip(got["parts"], reference["parts"])):
            for name in ("generator_mlm_loss", "rtd_loss"):
                assert abs(ours[name] - theirs[name]) <= 1e-5, (mesh, microbatches, step, name, ours, theirs)
        np.testing.assert_allclose(got["losses"], reference["losses"], rtol=1e-6)
        np.testing.assert_allclose(got["param_sum"], reference["param_sum"], rtol=1e-5)
    assert results[((2, 2, 2), 1)]["query_spec"] == ["fsdp", "tensor", None]


def test_permutation_lm_step_matches_one_device(all_runs):
    """XLNet's permutation LM (tests/test_xlnet_objective.py's objective): orders drawn on the device per row give the
    single-device losses on a (2, 2, 2) mesh of 8 fake devices."""
    results = all_runs["permutation_lm"]
    reference, got = results[((1, 1, 1), 1)], results[((2, 2, 2), 1)]
    assert reference["losses"][0] > 3.0
    np.testing.assert_allclose(got["losses"], reference["losses"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(got["param_sum"], reference["param_sum"], rtol=1e-5)
    assert got["query_spec"] == ["fsdp", "tensor", None]


def test_deberta_gdes_step_matches_one_device(all_runs):
    """DeBERTa-v3 pretraining (tests/test_deberta_training.py's objective): generator + discriminator with GDES on a
    (data 2, fsdp 2, tensor 2) mesh of 8 fake CPU devices: the losses and parameters of one device."""
    results = all_runs["deberta_gdes"]
    reference, got = results[((1, 1, 1), 1)], results[((2, 2, 2), 1)]
    assert reference["losses"][0] > 1.0
    for step, (ours, theirs) in enumerate(zip(got["parts"], reference["parts"])):
        for name in ("generator_mlm_loss", "rtd_loss"):
            assert abs(ours[name] - theirs[name]) <= 1e-5, (step, name, ours, theirs)
    np.testing.assert_allclose(got["losses"], reference["losses"], rtol=1e-6)
    np.testing.assert_allclose(got["param_sum"], reference["param_sum"], rtol=1e-5)
    assert got["query_spec"] == ["fsdp", "tensor", None]
