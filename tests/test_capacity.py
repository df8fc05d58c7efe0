"""A run whose tables cannot fit is refused before they exist, naming what to change: above all an XC
header that claims far more labels or features than its rows use (`trainer.capacity`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import trainer.capacity as capacity
from service.cli import main
from trainer.model import ModelShape, XCModel
from trainer.params import TrainParams

FAST = ["--dim", "8", "--batch-size", "16", "--negatives", "4", "--group-size", "2", "--epochs", "1",
        "--quiet"]
ROWS = "0 0:1 1:1\n1 2:1\n0,1 3:1 4:1\n"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_table_bytes_count_the_model_tables_their_state_and_the_names(optimizer: str) -> None:
    params = TrainParams(dim=6, optimizer=optimizer)  # type: ignore[arg-type]
    model = XCModel(ModelShape(n_features=11, n_labels=7, dim=6))
    floats = model.head.numel() + model.input_weight.numel()
    state = {"adam": 2, "adagrad": 1}[optimizer]
    assert capacity.table_bytes(7, 11, params) == 4 * (1 + state) * floats + 7 * capacity._NAME_BYTES
    # two ranks: each holds half the label rows (rounded up), the whole projection and every name
    half = 4 * (1 + state) * (4 * 7 + 11 * 6) + 7 * capacity._NAME_BYTES
    assert capacity.table_bytes(7, 11, params, ranks=2) == half


def test_a_header_claiming_a_label_space_that_cannot_fit_is_refused_at_once(tmp_path: Path) -> None:
    """10^9 labels at the default dim need terabytes: the header is named, with what the rows use, in a
    second, not after an allocation the machine kills."""
    data = tmp_path / "d.txt"
    data.write_text("3 5 1000000000\n" + ROWS)
    start = time.perf_counter()
    proc = _cli("train", "--train", str(data), "--out", str(tmp_path / "m"), "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {data}:1: the header declares L=1,000,000,000 labels and D=5 "
                                  "features, and its rows use label ids below 2 and feature ids below 5: a "
                                  "model of 1,000,000,000 labels"), proc.stderr
    assert "If the header claims more than the file holds, lower L or D to what the rows use" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "m").exists()
    assert time.perf_counter() - start < 60


def test_a_continual_run_checks_the_label_space_the_data_claims_before_naming_it(tmp_path: Path) -> None:
    """With a base the grown label space is the data's L: checked before a name is made for each label."""
    (tmp_path / "base.txt").write_text("3 5 2\n" + ROWS)
    assert main(["train", "--train", str(tmp_path / "base.txt"), "--out", str(tmp_path / "v1"), *FAST]) == 0
    (tmp_path / "new.txt").write_text("3 5 2000000000\n" + ROWS)
    proc = _cli("train", "--init-from", str(tmp_path / "v1"), "--train", str(tmp_path / "new.txt"), "--out",
                str(tmp_path / "v2"), "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {tmp_path / 'new.txt'}:1: the header declares L=2,000,000,000 "
                                  "labels"), proc.stderr
    assert "at dim 8" in proc.stderr and not (tmp_path / "v2").exists()
    assert proc.stderr.rstrip().endswith("use --optimizer adagrad, or train on a machine with more free "
                                         "memory (a continual run keeps its base's dim)"), proc.stderr


def test_a_run_over_the_free_memory_names_the_flags_to_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"text": f"alpha beta doc{i}", "labels": ["a" if i % 2 else "b"]} for i in range(10)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(capacity, "free_bytes", lambda device: 1 << 20)
    args = ["train", "--train", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m"), "--quiet",
            "--hash-size", "65536", "--dim", "64"]
    assert main(args) == 2
    err = capsys.readouterr().err
    need = 4 * 3 * (2 * 65 + 65536 * 64) + 2 * capacity._NAME_BYTES
    assert err.startswith(f"error: a model of 2 labels and 65,536 input features at dim 64 needs "
                          f"{need / 2**20:.1f} MiB for its weights, their adam state and the label names "
                          "alone, and cpu has 1.0 MiB free: "), err
    assert err.rstrip().endswith("lower --dim, use --optimizer adagrad, or shard the labels over more ranks "
                                 "(--nproc-per-node)"), err
    monkeypatch.setattr(capacity, "free_bytes", lambda device: None)  # cannot tell: no refusal
    assert main(args) == 0


def test_training_data_without_labels_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d.txt").write_text("3 5 0\n 0:1 1:1\n 2:1\n 3:1 4:1\n")
    assert main(["train", "--train", str(tmp_path / "d.txt"), "--out", str(tmp_path / "m"), *FAST]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'd.txt'}: no labels (L=0), nothing to learn\n"


def test_free_bytes_reads_the_machine() -> None:
    free = capacity.free_bytes(torch.device("cpu"))
    assert free is None or free > 0
