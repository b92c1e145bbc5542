"""Bad command lines get one line on stderr and status 2, and leave nothing behind (the CLI audit): an output path
under a file, a glue run whose model or task files are missing, options that would change nothing."""

from __future__ import annotations

import pytest

from bertjax.cli import main


def _one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bertjax {command}: error: ") and "Traceback" not in err, err
    return err.splitlines()[-1]


def test_a_workdir_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("mine\n")
    assert main(["finetune", "--model", str(tmp_path / "model"), "--task", "sequence-classification", "--train",
                 str(tmp_path / "t.jsonl"), "--validation", str(tmp_path / "v.jsonl"), "--workdir",
                 str(tmp_path / "afile" / "sub")]) == 2
    assert "Not a directory" in _one_line_error(capsys, "finetune")
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_glue_refuses_a_missing_model_or_task_before_writing_anything(tmp_path, capsys):
    data = tmp_path / "glue"
    (data / "RTE").mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (data / "RTE" / name).write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
    workdir = tmp_path / "work"
    assert main(["glue", "--model", str(tmp_path / "nowhere"), "--data-dir", str(data), "--workdir",
                 str(workdir)]) == 2
    assert "nowhere: no such directory" in _one_line_error(capsys, "glue")
    model = tmp_path / "model.txt"
    model.write_text("not a model\n")
    assert main(["glue", "--model", str(model), "--data-dir", str(data), "--workdir", str(workdir)]) == 2
    assert "model.txt: a file, not a model directory" in _one_line_error(capsys, "glue")
    assert not workdir.exists() or not any(path.is_file() for path in workdir.rglob("*"))


def test_a_glue_task_without_its_files_writes_nothing(tmp_path):
    from bertjax.finetune.glue import GLUE_TASKS, prepare_task

    said = []
    with pytest.raises(FileNotFoundError, match="GLUE task MNLI: no train.tsv or dev_matched.tsv"):
        prepare_task(tmp_path / "glue", GLUE_TASKS["MNLI"], tmp_path / "work" / "data" / "MNLI", said.append)
    assert not (tmp_path / "work").exists() and not said  # nor a note about its mismatched file


def test_embed_refuses_a_stride_without_chunks(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("one text\n")
    assert main(["embed", "--model", str(tmp_path / "model"), "--input", str(texts), "--output",
                 str(tmp_path / "out.npy"), "--stride", "5"]) == 2
    assert "--stride 5 applies to --overflow chunk" in _one_line_error(capsys, "embed")


def test_predict_refuses_settings_it_would_ignore(tmp_path):
    from bertjax.finetune.prediction import load_task

    with pytest.raises(ValueError, match="train.epochs: predict takes data.\\* and task.\\* settings only"):
        load_task(tmp_path, None, ["train.epochs=3", "data.max_length=16"])
