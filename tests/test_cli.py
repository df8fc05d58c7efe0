"""End to end through the `ovex` command line: synth → train → evaluate → predict, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from service.cli import main
from trainer.artifact import load_artifact
from trainer.data import read_xc


def test_synth_train_evaluate_predict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train, test, model, preds = (tmp_path / n for n in ("train.txt", "test.txt", "model", "preds.jsonl"))
    assert main(["synth", "--labels", "40", "--features", "300", "--rows", "1200", "--out", str(train),
                 "--seed", "1", "--test-out", str(test), "--test-rows", "250"]) == 0
    assert read_xc(test).n_rows == 250
    names = [f"topic-{i:02d}" for i in range(40)]
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n")
    code = main(["train", "--train", str(train), "--test", str(test), "--out", str(model), "--dim", "32",
                 "--epochs", "4", "--batch-size", "100", "--negatives", "24", "--seed", "3",
                 "--label-names", str(tmp_path / "names.txt"), "--quiet"])
    assert code == 0
    capsys.readouterr()

    assert main(["evaluate", str(model), str(test)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1  # exactly one JSON object
    metrics = json.loads(out[0])
    assert {"p@1", "p@3", "p@5", "ndcg@1", "ndcg@3", "ndcg@5", "psp@1", "psp@3", "psp@5"} <= set(metrics)
    ds = read_xc(train)
    chance = (ds.Y.nnz / ds.n_rows) / 40
    assert metrics["p@1"] > max(0.3, 6 * chance), metrics

    assert main(["predict", str(model), str(test), "--top-k", "4", "--out", str(preds)]) == 0
    lines = [json.loads(line) for line in preds.read_text().splitlines()]
    assert len(lines) == 250
    loaded = load_artifact(model)
    test_ds = read_xc(test)
    ids, scores = loaded.topk(loaded.featurizer.transform(test_ds), 4)
    assert loaded.label_names == names  # --label-names: the model answers names, not ids
    for row, (line, row_ids) in enumerate(zip(lines, ids.tolist(), strict=True)):
        assert set(line) == {"labels", "scores", "names"}
        assert line["labels"] == row_ids, row  # rows in input order
        assert line["names"] == [names[i] for i in row_ids]
        assert len(line["scores"]) == 4 and all(a >= b for a, b in pairwise(line["scores"]))
    np.testing.assert_allclose([line["scores"] for line in lines], scores, rtol=1e-5)

    # without --out the same lines go to stdout
    capsys.readouterr()
    assert main(["predict", str(model), str(test), "--top-k", "4"]) == 0
    assert capsys.readouterr().out == preds.read_text()


def test_label_names_file_must_match_the_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "d.txt"
    data.write_text("2 3 3\n0,2 1:1\n1 0:1\n")
    out = ["train", "--train", str(data), "--out", str(tmp_path / "m"), "--epochs", "1", "--quiet"]
    for text, message in (("a\nb\n", ":2: 2 names for 3 labels"), ("a\n\nc\n", ":2: blank label name"),
                          ("a\nb\na\n", ":3: label name 'a' repeats line 1"),
                          ("a\n \t\nc\n", ":2: blank label name ' \\t'"),
                          ("a\nb\n" + "c" * 1001 + "\n", ":3: label name 'cccc"),
                          ("a\nb\n" + "c" * 1001 + "\n", "is 1001 characters long; at most 1000 are")):
        (tmp_path / "names.txt").write_text(text)
        assert main([*out, "--label-names", str(tmp_path / "names.txt")]) == 2
        assert message in capsys.readouterr().err
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"text": "a b", "labels": ["x"]}\n')
    assert main(["train", "--train", str(jsonl), "--out", str(tmp_path / "m"), "--label-names", "n.txt"]) == 2
    assert "JSONL rows already name their labels" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_version_and_loss_choices(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"ovex {version('ovex')}"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    helptext = capsys.readouterr().out
    assert "--loss {dropmax,evsoftmax,ove," in helptext.replace("\n", "")
    assert "(default: 7)" in helptext and "passes over the training rows" in helptext


def test_train_help_lists_each_parameter_under_its_group(capsys: pytest.CaptureFixture[str]) -> None:
    """`ovex train --help` in sections, one a TrainParams group, each holding that group's flags."""
    import re

    from trainer.params import GROUPS, TrainParams, fields_in

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    helptext = capsys.readouterr().out
    headers = {f"{g.replace('_', ' ')}: {what}:": g for g, what in GROUPS.items()}
    seen: dict[str, set[str]] = {}
    current = None
    for line in helptext.splitlines():
        if not line.startswith(" "):
            current = headers.get(line.strip())
        elif current is not None and (flag := re.match(r"\s+--([a-z0-9-]+)", line)):
            seen.setdefault(current, set()).add(flag.group(1).replace("-", "_"))
    for group in GROUPS:
        assert seen.get(group) == set(fields_in(group)), group
    assert set().union(*seen.values()) == set(TrainParams.model_fields)


def test_bad_data_prints_file_and_line_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("2 10 3\n0 1:0.5\n1 12:1.0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "train", "--train", str(bad), "--out", str(tmp_path / "m")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {bad}:3: "), proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_artifact_and_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "d.txt"
    data.write_text("1 3 2\n0 1:1\n")
    assert main(["evaluate", str(tmp_path / "missing"), str(data)]) == 2
    assert "not a model directory" in capsys.readouterr().err
    assert main(["train", "--train", str(data), "--out", str(tmp_path / "m"), "--dim", "0"]) == 2
    assert "dim" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse lists the losses
        main(["train", "--train", str(data), "--out", str(tmp_path / "m"), "--loss", "nope"])
    assert refused.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
    unigram = ["train", "--train", str(data), "--out", str(tmp_path / "m"), "--sampler", "unigram"]
    assert main(unigram) == 2
    err = capsys.readouterr().err
    assert "group_size 2048 needs sampler 'uniform'" in err and "set group_size 1" in err
    assert not (tmp_path / "m").exists()


def test_test_labels_the_model_lacks_count_as_misses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A JSONL test (or evaluate) label that no training row has is never predicted: train, evaluate and
    predict go on, the first two with a warning naming how many such labels and rows, and score those rows
    as misses (P@1 = the share of rows whose best label is right, over every row)."""
    rows = [{"text": f"{w} doc{i}", "labels": [w]} for i in range(12) for w in ("alpha", "beta")]
    (tmp_path / "tr.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    test = tmp_path / "te.jsonl"
    test.write_text('{"text": "alpha", "labels": ["alpha"]}\n{"text": "beta", "labels": ["beta"]}\n'
                    '{"text": "beta", "labels": ["gamma"]}\n'
                    '{"text": "alpha", "labels": ["gamma", "delta"]}\n')
    note = (f"warning: the test set {test} holds 2 label(s) the model has not trained on, on 2 of its 4 "
            "rows: the model never predicts them, so they count as misses")
    model = tmp_path / "m"
    assert main(["train", "--train", str(tmp_path / "tr.jsonl"), "--test", str(test), "--out", str(model),
                 "--dim", "16", "--epochs", "6", "--batch-size", "8", "--dropout", "0", "--lr", "0.05"]) == 0
    out, err = capsys.readouterr()
    assert note in err.splitlines()
    assert json.loads(out.strip().splitlines()[-1])["p@1"] == 0.5  # rows 1-2 right, rows 3-4 cannot be
    assert load_artifact(model).label_names == ["alpha", "beta"]

    assert main(["evaluate", str(model), str(test)]) == 0
    out, err = capsys.readouterr()
    assert err == note.replace("the test set", "the data") + "\n"
    metrics = json.loads(out)
    assert metrics["p@1"] == 0.5 and metrics["ndcg@1"] == 0.5 and 0 < metrics["psp@1"] < 1

    assert main(["predict", str(model), str(test), "--top-k", "1"]) == 0  # labels are not looked at
    out, err = capsys.readouterr()
    assert err == "" and [json.loads(line)["names"] for line in out.splitlines()] == [
        ["alpha"], ["beta"], ["beta"], ["alpha"]]


def test_a_test_set_that_cannot_be_scored_stops_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An XC test file declaring more labels than the training file is refused before the first step,
    also when a refit would only evaluate it after a whole selection run."""
    (tmp_path / "tr.txt").write_text("4 5 2\n0 0:1 1:1\n1 2:1\n0,1 3:1 4:1\n1 1:1\n")
    (tmp_path / "te.txt").write_text("2 5 4\n3 0:1\n1 2:1\n")
    code = main(["train", "--train", str(tmp_path / "tr.txt"), "--test", str(tmp_path / "te.txt"), "--out",
                 str(tmp_path / "m"), "--dim", "8", "--epochs", "2", "--valid-fraction", "0.25", "--refit"])
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines()[-1] == (
        f"error: {tmp_path / 'te.txt'}:1: test set declares L=4 labels but the training set has 2"), err
    assert "epoch" not in err and not (tmp_path / "m").exists()
