"""A model save that fails (a full disk above all) is one line on stderr and exit 2, leaves nothing that looks
like a model, and keeps the model that was at --out. The failure is injected in-process (no root to mount a
tiny file system): the ovex command runs in a subprocess whose writes fail with ENOSPC at a chosen point."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service.cli import main
from tests.test_continual_inputs import _tree_hash

FAST = ["--dim", "8", "--batch-size", "16", "--negatives", "4", "--group-size", "2", "--epochs", "1",
        "--quiet"]

DATA = "6 5 3\n0 0:1 1:1\n1 2:1\n0,2 3:1 4:1\n2 4:1\n1 1:1 2:1\n0 0:1\n"  # 6 rows, 5 features, 3 labels

# run `ovex ARGS...` with one write path failing as a full disk does
_FULL_DISK = textwrap.dedent("""
    import errno, os, sys
    import trainer.durable as durable

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    where = sys.argv.pop(1)
    if where == "weights":  # the weights file, written block by block
        durable._write_all = full
    elif where == "fsync":  # a delayed allocation fails when the data is flushed
        durable.os.fsync = full
    elif where == "json":  # the small files beside the weights
        import pathlib
        pathlib.Path.write_text = full
    from service.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "d.txt"
    path.write_text(DATA)
    return path


@pytest.mark.parametrize(("where", "existing"),
                         [("weights", True), ("weights", False), ("fsync", True), ("json", True)])
def test_a_full_disk_at_the_final_save_is_one_line_and_keeps_what_was_there(
    tmp_path: Path, data: Path, where: str, existing: bool
) -> None:
    out = tmp_path / "models" / "m"
    if existing:
        assert main(["train", "--train", str(data), "--out", str(out), *FAST]) == 0
    before = _tree_hash(tmp_path / "models") if existing else {}
    script = tmp_path / "full_disk.py"
    script.write_text(_FULL_DISK)
    args = ["train", "--train", str(data), "--out", str(out), *FAST]
    proc = subprocess.run([sys.executable, str(script), where, *args], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: {out}: no space left on device while writing the model here; free space "
                           "and rerun\n")
    # no temp directory left beside it, and what was at --out (a model, or nothing) is as it was
    left = sorted(p.name for p in (tmp_path / "models").iterdir()) if (tmp_path / "models").exists() else []
    assert left == (["m"] if existing else [])
    assert (_tree_hash(tmp_path / "models") if existing else {}) == before


def test_a_failed_rename_puts_the_previous_model_back(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The new model is renamed into place after the old one is moved aside: if that rename fails, the
    old one goes back rather than staying hidden in a temp directory."""
    out = tmp_path / "models" / "m"
    assert main(["train", "--train", str(data), "--out", str(out), *FAST]) == 0
    before = _tree_hash(tmp_path / "models")
    real = os.replace

    def failing(src: str | Path, dst: str | Path) -> None:
        if ".tmp-" in Path(src).name:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    assert main(["train", "--train", str(data), "--out", str(out), *FAST]) == 2
    assert capsys.readouterr().err == f"error: {out}: cannot write the model here: {os.strerror(errno.EIO)}\n"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["m"]
    assert _tree_hash(tmp_path / "models") == before


def test_a_full_disk_at_a_checkpoint_is_one_line_and_leaves_no_partial_checkpoint(
    tmp_path: Path, data: Path
) -> None:
    """Mid-training, the checkpoint that cannot be written is named and its half-written directory removed
    (it holds space the user is short of); rerun with the same --checkpoint-dir resumes from the last one."""
    ckpt = tmp_path / "ckpt"
    script = tmp_path / "full_disk.py"
    script.write_text(_FULL_DISK)
    args = ["train", "--train", str(data), "--out", str(tmp_path / "m"), "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "1", *FAST]
    proc = subprocess.run([sys.executable, str(script), "weights", *args], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: {ckpt}: no space left on device while writing the checkpoint of step 1 "
                           "here; free space and rerun\n")
    assert list(ckpt.iterdir()) == [] and not (tmp_path / "m").exists()


# the same on the ranks of a launched run: each rank is a spawned process that imports this script (not as
# __main__) before its environment names its rank, so the writer fails at write time on FAIL_RANKS' ranks
_FULL_DISK_ON_RANKS = textwrap.dedent("""
    import errno, os, sys
    import trainer.durable as durable

    _write_all = durable._write_all

    def full(*args, **kwargs):
        if os.environ.get("RANK") in os.environ["FAIL_RANKS"].split(","):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _write_all(*args, **kwargs)

    durable._write_all = full

    if __name__ == "__main__":
        from service.cli import main
        sys.exit(main(sys.argv[1:]))
""")


def _run_on_ranks(root: Path, data: Path, ckpt: Path, out: str, epochs: str,
                  fail: str) -> subprocess.CompletedProcess[str]:
    """`ovex train` on two gloo ranks, the disk full for the ranks in `fail` ("" for none)."""
    script = root / "full_disk_ranks.py"
    if not script.exists():
        script.write_text(_FULL_DISK_ON_RANKS)
    args = ["train", "--train", str(data), "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1",
            "--nproc-per-node", "2", *FAST, "--batch-size", "2", "--out", str(root / out), "--epochs", epochs]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAIL_RANKS": fail}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300,
                          check=False, env=env)


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A first run on two ranks (an epoch of 3 steps) with room on the disk: (its data, its checkpoints).
    Each case below resumes a copy of them; a launch of two ranks is seconds of imports, made once here."""
    root = tmp_path_factory.mktemp("ranks-first")
    data = root / "d.txt"
    data.write_text(DATA)
    ok = _run_on_ranks(root, data, root / "ckpt", "m1", "1", "")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert sorted({name.split("/")[0] for name in _tree_hash(root / "ckpt")}) == ["latest.json",
                                                                                  "step-000000003"]
    return data, root / "ckpt"


@pytest.mark.timeout(600)  # a launch of two real ranks (and the first run's, once)
@pytest.mark.parametrize("fail_ranks", ["1", "0,1"])
def test_a_full_disk_at_a_checkpoint_of_two_ranks_leaves_no_partial_checkpoint(
    tmp_path: Path, two_rank_run: tuple[Path, Path], fail_ranks: str
) -> None:
    """Two ranks on gloo, the disk full for one of them (the other waits for it and is stopped) or for
    both: one line naming the rank and the checkpoint, and nothing half-written left, as with one rank;
    the checkpoint the run made before is kept to resume from."""
    # the first run's checkpoints (an epoch of 3 steps); the disk is full for this run, which resumes from
    # them for a second epoch
    data, first = two_rank_run
    ckpt = tmp_path / "ckpt"
    shutil.copytree(first, ckpt)
    kept = _tree_hash(ckpt)
    assert sorted({name.split("/")[0] for name in kept}) == ["latest.json", "step-000000003"]
    proc = _run_on_ranks(tmp_path, data, ckpt, "m2", "2", fail_ranks)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _tree_hash(ckpt) == kept  # no .step-*.partial beside it, the last complete checkpoint unchanged
    last = proc.stderr.rstrip().splitlines()[-1]
    ranks = "1" if fail_ranks == "1" else "[01]"
    assert re.fullmatch(f"error: rank {ranks} of 2 failed: {re.escape(str(ckpt))}: no space left on device "
                        "while writing the checkpoint of step 4 here; free space and rerun", last), last
    assert not (tmp_path / "m2").exists()


def test_a_checkpoint_removes_what_a_killed_run_half_wrote(tmp_path: Path, data: Path) -> None:
    """A run killed while writing a checkpoint leaves its partial directory (nothing ran to remove it): the
    next run's first complete checkpoint removes it, as it does the checkpoints before its own."""
    ckpt = tmp_path / "ckpt"
    (ckpt / ".step-000000007.partial").mkdir(parents=True)
    (ckpt / ".step-000000007.partial" / "rank-00000.safetensors").write_bytes(b"half")
    assert main(["train", "--train", str(data), "--out", str(tmp_path / "m"), "--checkpoint-dir", str(ckpt),
                 "--checkpoint-every", "1", *FAST]) == 0
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest.json", "step-000000001"]
