"""A model save that fails (a full disk above all) is one line on stderr and exit 2, leaves nothing that looks
like a model, and keeps the model that was at --out. The failure is injected in-process (no root to mount a
tiny file system): the ovex command runs in a subprocess whose writes fail with ENOSPC at a chosen point."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service.cli import main

FAST = ["--dim", "8", "--batch-size", "16", "--negatives", "4", "--group-size", "2", "--epochs", "1",
        "--quiet"]

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


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "d.txt"
    path.write_text("6 5 3\n0 0:1 1:1\n1 2:1\n0,2 3:1 4:1\n2 4:1\n1 1:1 2:1\n0 0:1\n")
    return path


@pytest.mark.parametrize(("where", "existing"),
                         [("weights", True), ("weights", False), ("fsync", True), ("json", True)])
def test_a_full_disk_at_the_final_save_is_one_line_and_keeps_what_was_there(
    tmp_path: Path, data: Path, where: str, existing: bool
) -> None:
    out = tmp_path / "models" / "m"
    if existing:
        assert main(["train", "--train", str(data), "--out", str(out), *FAST]) == 0
    before = _tree(tmp_path / "models") if existing else {}
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
    assert (_tree(tmp_path / "models") if existing else {}) == before


def test_a_failed_rename_puts_the_previous_model_back(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The new model is renamed into place after the old one is moved aside: if that rename fails, the
    old one goes back rather than staying hidden in a temp directory."""
    out = tmp_path / "models" / "m"
    assert main(["train", "--train", str(data), "--out", str(out), *FAST]) == 0
    before = _tree(tmp_path / "models")
    real = os.replace

    def failing(src: str | Path, dst: str | Path) -> None:
        if ".tmp-" in Path(src).name:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    assert main(["train", "--train", str(data), "--out", str(out), *FAST]) == 2
    assert capsys.readouterr().err == f"error: {out}: cannot write the model here: {os.strerror(errno.EIO)}\n"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["m"]
    assert _tree(tmp_path / "models") == before


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
