"""The run configs ship inside the package (bertjax/configs links to configs/), and a config path that does not
exist where the command runs names a shipped one: the README's `--config configs/pretrain/tiny.yaml` works from
any directory of an installed bertjax. Also: what a wheel built from this tree holds, and YAML aliases refused."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from bertjax import shipped_configs
from bertjax.embeddings.train_config import load_embedder_config
from bertjax.finetune.config import load_finetune_config
from bertjax.train.run_config import ConfigError, load_run_config, read_config_file
from train_helpers import REPO


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory with no configs/ in it, as after `pip install bertjax`."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", ["configs/pretrain/tiny.yaml", "pretrain/tiny.yaml", "tiny", "tiny.yaml"])
def test_a_missing_path_reads_the_shipped_config_of_that_name(elsewhere, name):
    assert load_run_config(name) == load_run_config(REPO / "configs" / "pretrain" / "tiny.yaml")


def test_each_run_type_finds_its_own_kind_by_bare_name(elsewhere):
    assert load_finetune_config("question-answering") == \
        load_finetune_config(REPO / "configs" / "finetune" / "question-answering.yaml")
    assert load_embedder_config("contrastive") == load_embedder_config(REPO / "configs" / "embedder" /
                                                                       "contrastive.yaml")
    with pytest.raises(FileNotFoundError, match="contrastive does not exist .*shipped with bertjax: albert-base"):
        load_run_config("contrastive")  # an embedder config is no pretraining preset


def test_a_file_of_the_users_own_wins_over_the_shipped_one(elsewhere):
    mine = elsewhere / "configs" / "pretrain" / "tiny.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("model: {preset: bert-tiny}\ntrain: {steps: 3}\n")
    assert read_config_file("configs/pretrain/tiny.yaml") == {"model": {"preset": "bert-tiny"}, "train": {"steps": 3}}


def test_an_unknown_name_lists_the_shipped_ones(elsewhere):
    with pytest.raises(FileNotFoundError, match=r"run config tinyy does not exist \(nor is it one of the configs "
                                                r"shipped with bertjax: .*\btiny\b.*xlnet-base"):
        load_run_config("tinyy")
    with pytest.raises(FileNotFoundError):
        read_config_file("../configs/pretrain/tiny.yaml", kind="pretrain")  # no way out of the shipped directory


def test_the_package_links_every_config_of_the_repository():
    shipped = {path.relative_to(shipped_configs.ROOT) for path in shipped_configs.ROOT.rglob("*.yaml")}
    assert shipped == {path.relative_to(REPO / "configs") for path in (REPO / "configs").rglob("*.yaml")}
    assert "pretrain/tiny" in shipped_configs.names("pretrain")


def test_a_wheel_carries_the_configs_and_the_license(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(REPO, source, symlinks=True,
                    ignore=shutil.ignore_patterns(".git", "tests", "__pycache__", "*.egg-info", "build", "dist"))
    subprocess.run([sys.executable, "-c", "from setuptools import build_meta; build_meta.build_wheel('dist')"],
                   cwd=source, check=True, capture_output=True)
    (wheel,) = (source / "dist").glob("bertjax-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (REPO / "configs").rglob("*.yaml"):
        assert f"bertjax/configs/{path.relative_to(REPO / 'configs').as_posix()}" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert not any(name.startswith(("tests/", "bench/", "configs/")) for name in names)


def test_yaml_aliases_are_refused_in_a_run_config(tmp_path):
    """A few nested aliases in a 300-byte file expand to gigabytes wherever the value is walked or shown."""
    config = tmp_path / "aliases.yaml"
    config.write_text("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                      "model: {preset: [*b, *b, *b, *b, *b, *b, *b, *b, *b]}\n")
    with pytest.raises(ConfigError, match=r"aliases.yaml: not valid YAML: line 2: aliases \(\*name\) are not "
                                          "accepted"):
        load_run_config(config)


def test_a_long_wrong_value_is_shown_cut_short(tmp_path):
    config = tmp_path / "long.yaml"
    config.write_text("model: {preset: [" + ", ".join(["word"] * 10_000) + "]}\ntrain: {steps: 1}\n")
    with pytest.raises(ConfigError) as error:
        load_run_config(config)
    assert str(error.value).startswith("model.preset must be a string, got ['word'") and len(str(error.value)) < 200
