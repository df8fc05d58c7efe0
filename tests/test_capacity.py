"""A run whose tables cannot fit is refused before they exist, naming what to change: above all an XC
header that claims far more labels or features than its rows use (`trainer.capacity`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import trainer.capacity as capacity
from service.cli import main
from tests.test_continual import _cli
from trainer.data import Dataset
from trainer.errors import DataFormatError
from trainer.model import ModelShape, XCModel
from trainer.params import TrainParams

FAST = ["--dim", "8", "--batch-size", "16", "--negatives", "4", "--group-size", "2", "--epochs", "1",
        "--quiet"]
ROWS = "0 0:1 1:1\n1 2:1\n0,1 3:1 4:1\n"


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_run_bytes_count_the_model_tables_their_state_and_the_per_label_arrays(optimizer: str) -> None:
    params = TrainParams(dim=6, optimizer=optimizer)  # type: ignore[arg-type]
    model = XCModel(ModelShape(n_features=11, n_labels=7, dim=6))
    floats = model.head.numel() + model.input_weight.numel()
    # Adam: two moments a weight and the step of a row's last update (float64); Adagrad: a sum a row
    per_weight, per_row = {"adam": (2, 8), "adagrad": (0, 4)}[optimizer]
    host = 7 * (capacity._NAME_BYTES + capacity._LABEL_BYTES) + 11 * capacity._FEATURE_BYTES
    tables = 4 * (1 + per_weight) * floats + per_row * (7 + 11)
    assert capacity.run_bytes(7, 11, params) == capacity.RunBytes(tables, host)
    # two ranks: each holds half the label rows (rounded up), the whole projection and every label's arrays
    half = 4 * (1 + per_weight) * (4 * 7 + 11 * 6) + per_row * (4 + 11)
    assert capacity.run_bytes(7, 11, params, ranks=2) == capacity.RunBytes(half, host)
    # model selection keeps a copy of the weights
    select = TrainParams(dim=6, optimizer=optimizer, valid_fraction=0.1)  # type: ignore[arg-type]
    assert capacity.run_bytes(7, 11, select).tables == tables + 4 * floats
    # a continual run also holds its base's tables (3 labels) and draws its new head rows
    grown = capacity.run_bytes(7, 11, params, base_labels=3)
    assert grown.tables == tables + 4 * 7 * 7
    assert grown.host == host + 4 * (3 * 7 + 11 * 6)
    # an ensemble merges its members after training: the merged model with one member beside it, when
    # that is more than a member's training holds
    model_floats = 7 * 7 + 11 * 6
    for n in (2, 4):
        merge = 4 * (n + 1) * model_floats + per_row * (7 + 11)
        ens = TrainParams(dim=6, optimizer=optimizer, ensemble=n)  # type: ignore[arg-type]
        assert capacity.run_bytes(7, 11, ens).tables == max(tables, merge)


# the peak RSS of this process's memory (VmHWM: ru_maxrss would start from the forking parent's)
_PEAK = """
import re, sys
from pathlib import Path
from service.cli import main
assert main(sys.argv[1:]) == 0
print(int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024)
"""


def _peak_rss(*args: str) -> int:
    proc = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().splitlines()[-1])


def _xc_rows(labels: int) -> str:
    rows = [",".join(map(str, sorted({i % 10, labels - 1 - i % 3}))) + f" {i % 5}:1 {(i % 5 + 2) % 5}:1"
            for i in range(20)]
    return f"20 5 {labels}\n" + "\n".join(rows) + "\n"


def test_the_estimate_covers_what_a_continual_run_of_a_large_label_space_takes(tmp_path: Path) -> None:
    """At dim 8 the label names, their index and the label-sized arrays cost more than the head: a
    continual run growing to 10^6 labels takes no more memory above a 10-label run than the estimate."""
    (tmp_path / "base.txt").write_text(_xc_rows(10))
    assert main(["train", "--train", str(tmp_path / "base.txt"), "--out", str(tmp_path / "v1"), *FAST]) == 0
    peaks = {}
    for k in (10, 1_000_000):
        (tmp_path / f"new{k}.txt").write_text(_xc_rows(k))
        peaks[k] = _peak_rss("train", "--init-from", str(tmp_path / "v1"), "--train",
                             str(tmp_path / f"new{k}.txt"), "--out", str(tmp_path / f"v{k}"), "--batch-size",
                             "16", "--negatives", "4", "--epochs", "1", "--quiet")
    taken = peaks[1_000_000] - peaks[10]
    estimate = capacity.run_bytes(1_000_000, 5, TrainParams(dim=8), base_labels=10).total
    assert taken <= estimate <= 2 * taken, (taken, estimate)


@pytest.mark.parametrize(("labels", "features"), [(159, 1836), (374, 499), (100_000, 100_000),
                                                  (1_000_000, 100_000)])
def test_ordinary_runs_at_the_default_dim_fit_a_16_gib_machine(labels: int, features: int) -> None:
    """Bibtex, Corel5k and synthetic sets of 10^5 and 10^6 labels at the default settings: never refused
    where they train."""
    need = capacity.run_bytes(labels, features, TrainParams())
    assert need.total < 8 * 2**30
    ds = Dataset(Y=sp.csr_matrix((1, labels), dtype=np.float32), n_features=features, n_labels=labels,
                 X=sp.csr_matrix((1, features), dtype=np.float32), path="d.txt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(capacity, "free_bytes", lambda device: 16 * 2**30)
        capacity.check_fits(ds, TrainParams(), torch.device("cpu"))


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
    need = (4 * 3 * (2 * 65 + 65536 * 64) + 8 * (2 + 65536)
            + 2 * (capacity._NAME_BYTES + capacity._LABEL_BYTES) + 65536 * capacity._FEATURE_BYTES)
    assert err.startswith(f"error: a model of 2 labels and 65,536 input features at dim 64 needs "
                          f"{need / 2**20:.1f} MiB for its weights, their adam state, the label names and "
                          "the other per-label arrays alone, and cpu has 1.0 MiB free: "), err
    # the input projection is what is large: more ranks would not split it
    assert err.rstrip().endswith("lower --dim, use --optimizer adagrad, lower --hash-size, or train on a "
                                 "machine with more free memory"), err
    monkeypatch.setattr(capacity, "free_bytes", lambda device: None)  # cannot tell: no refusal
    assert main(args) == 0


def test_training_data_without_labels_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d.txt").write_text("3 5 0\n 0:1 1:1\n 2:1\n 3:1 4:1\n")
    assert main(["train", "--train", str(tmp_path / "d.txt"), "--out", str(tmp_path / "m"), *FAST]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'd.txt'}: no labels (L=0), nothing to learn\n"


def test_free_bytes_reads_the_machine() -> None:
    free = capacity.free_bytes(torch.device("cpu"))
    assert free is None or free > 0


def test_a_continual_run_claiming_10_8_labels_at_dim_8_is_refused_where_its_tables_alone_would_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """10^8 labels at dim 8: head and Adam state are about 10 GiB, the names, index and label-sized arrays
    as much again; on a machine with 24 GiB free the run is refused up front, not killed half-way."""
    (tmp_path / "base.txt").write_text("3 5 2\n" + ROWS)
    assert main(["train", "--train", str(tmp_path / "base.txt"), "--out", str(tmp_path / "v1"), *FAST]) == 0
    (tmp_path / "new.txt").write_text("3 5 100000000\n" + ROWS)
    monkeypatch.setattr(capacity, "free_bytes", lambda device: 24 * 2**30)
    code = main(["train", "--init-from", str(tmp_path / "v1"), "--train", str(tmp_path / "new.txt"), "--out",
                 str(tmp_path / "v2"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: {tmp_path / 'new.txt'}:1: the header declares L=100,000,000 labels"), err
    assert "at dim 8 needs " in err and "and cpu has 24.0 GiB free" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "v2").exists()


@pytest.fixture
def base_v1(tmp_path: Path) -> Path:
    (tmp_path / "base.txt").write_text("3 5 2\n" + ROWS)
    assert main(["train", "--train", str(tmp_path / "base.txt"), "--out", str(tmp_path / "v1"), *FAST]) == 0
    return tmp_path / "v1"


@pytest.mark.parametrize("flag", ["--test", "--replay-data"])
def test_a_test_or_replay_header_claiming_more_labels_than_the_model_is_refused(
    tmp_path: Path, base_v1: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The grown model has the base's and the training data's labels; a test or replay file's ids are
    those, so a header claiming 10^9 is named as what to fix, never made room for."""
    (tmp_path / "new.txt").write_text("4 5 3\n" + ROWS + "2 0:1\n")
    (tmp_path / "other.txt").write_text("3 5 1000000000\n" + ROWS)
    code = main(["train", "--init-from", str(base_v1), "--train", str(tmp_path / "new.txt"), flag,
                 str(tmp_path / "other.txt"), "--out", str(tmp_path / "v2"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    what = "a test set" if flag == "--test" else "a replay set"
    assert err == (f"error: {tmp_path / 'other.txt'}:1: the header declares L=1,000,000,000 labels but the "
                   f"model has 3 (the base's and the training data's): {what} uses the model's labels, and "
                   "its rows use label ids below 2; lower L to at most the model's\n")
    assert not (tmp_path / "v2").exists()


def test_a_warm_start_reads_the_free_memory_once_for_all_its_data_sets(
    tmp_path: Path, base_v1: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "new.txt").write_text("4 5 3\n" + ROWS + "2 0:1\n")
    calls: list[torch.device] = []

    def free(device: torch.device) -> int:
        calls.append(device)
        return 1 << 40

    monkeypatch.setattr(capacity, "free_bytes", free)
    code = main(["train", "--init-from", str(base_v1), "--train", str(tmp_path / "new.txt"), "--test",
                 str(tmp_path / "new.txt"), "--replay-data", str(tmp_path / "new.txt"), "--out",
                 str(tmp_path / "v2"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert calls == [torch.device("cpu")]


# ------------------------------------------------------------------------------------ cgroups

GIB = 2**30


def _machine(tmp_path: Path, available: int, cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake /proc (MemAvailable, this process's cgroup lines) and cgroup mount holding `files`."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {64 * GIB // 1024} kB\nMemAvailable: {available // 1024} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return proc, root


def _free(proc: Path, root: Path) -> int | None:
    return capacity.free_bytes(torch.device("cpu"), proc=proc, cgroup_root=root)


def test_a_cgroup_v2_limit_below_mem_available_is_what_is_free(tmp_path: Path) -> None:
    proc, root = _machine(tmp_path, 20 * GIB, "0::/job\n", {
        "cgroup.controllers": "memory\n", "job/memory.max": f"{4 * GIB}\n", "job/memory.current": f"{GIB}\n",
        "job/memory.stat": f"anon {GIB // 2}\ninactive_file {GIB // 2}\n"})
    # 4 GiB limit, 1 GiB used of which half is reclaimable page cache
    assert _free(proc, root) == 4 * GIB - GIB // 2


def test_a_cgroup_v2_limit_of_a_parent_counts_and_max_is_no_limit(tmp_path: Path) -> None:
    proc, root = _machine(tmp_path, 20 * GIB, "0::/pod/job\n", {
        "cgroup.controllers": "memory\n", "pod/memory.max": f"{3 * GIB}\n", "pod/memory.current": f"{GIB}\n",
        "pod/job/memory.max": "max\n", "pod/job/memory.current": f"{GIB}\n"})
    assert _free(proc, root) == 2 * GIB
    (root / "pod" / "memory.max").write_text("max\n")
    assert _free(proc, root) == 20 * GIB  # no limit anywhere: MemAvailable


def test_a_cgroup_v1_limit_below_mem_available_is_what_is_free(tmp_path: Path) -> None:
    lines = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    proc, root = _machine(tmp_path, 20 * GIB, lines, {
        "memory/docker/abc/memory.limit_in_bytes": f"{6 * GIB}\n",
        "memory/docker/abc/memory.usage_in_bytes": f"{2 * GIB}\n",
        "memory/docker/abc/memory.stat": f"cache {GIB}\ntotal_inactive_file {GIB}\n",
        "memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": f"{GIB}\n"})
    assert _free(proc, root) == 5 * GIB


def test_a_container_that_sees_its_cgroup_at_the_root_reads_the_root(tmp_path: Path) -> None:
    """Inside a container the cgroup path names the host's hierarchy, which the container's mount does not
    show: the limit is read where the mount has it, at its root."""
    proc, root = _machine(tmp_path, 20 * GIB, "0::/kubepods/pod1/c1\n", {
        "cgroup.controllers": "memory\n", "memory.max": f"{2 * GIB}\n", "memory.current": "0\n"})
    assert _free(proc, root) == 2 * GIB


def test_a_limit_above_mem_available_or_no_cgroup_leaves_mem_available(tmp_path: Path) -> None:
    proc, root = _machine(tmp_path, 3 * GIB, "0::/job\n", {
        "cgroup.controllers": "memory\n", "job/memory.max": f"{8 * GIB}\n", "job/memory.current": "0\n"})
    assert _free(proc, root) == 3 * GIB
    assert _free(proc, tmp_path / "absent") == 3 * GIB
    (proc / "meminfo").write_text("garbage\n")
    assert _free(proc, root) == 8 * GIB  # the cgroup alone tells
    assert _free(proc, tmp_path / "absent") is None


def _xc(labels: int, features: int) -> Dataset:
    return Dataset(Y=sp.csr_matrix(([1.0], ([0], [0])), shape=(1, labels), dtype=np.float32),
                   n_features=features, n_labels=labels, path="d.txt",
                   X=sp.csr_matrix(([1.0], ([0], [0])), shape=(1, features), dtype=np.float32))


@pytest.mark.parametrize(("labels", "dim", "remedy"), [
    (1_000_000, 512, "shard the labels over more ranks (--nproc-per-node)"),  # the head is what is large
    (100_000_000, 8, "train on a machine with more free memory"),  # names and label arrays: every rank's
])
def test_the_remedy_is_the_one_that_shrinks_what_is_large(
    monkeypatch: pytest.MonkeyPatch, labels: int, dim: int, remedy: str
) -> None:
    monkeypatch.setattr(capacity, "free_bytes", lambda device: 2**30)
    with pytest.raises(DataFormatError) as exc:
        capacity.check_fits(_xc(labels, 100), TrainParams(dim=dim), torch.device("cpu"))
    assert str(exc.value).endswith(f"lower --dim, use --optimizer adagrad, or {remedy}"), exc.value


def test_ranks_on_one_machine_share_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank of the machine holds its shard of the head and all the per-label arrays: together."""
    params = TrainParams(dim=64)
    one = capacity.run_bytes(1_000_000, 100, params, ranks=2).total
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(capacity, "free_bytes", lambda device: 2 * one - 1)
    with pytest.raises(DataFormatError) as exc:
        capacity.check_fits(_xc(1_000_000, 100), params, torch.device("cpu"), ranks=2)
    assert f"needs {capacity._size(2 * one)} on 2 ranks for its weights" in str(exc.value)
    monkeypatch.setattr(capacity, "free_bytes", lambda device: 2 * one)
    capacity.check_fits(_xc(1_000_000, 100), params, torch.device("cpu"), ranks=2)
