"""Durable writes: safetensors streamed to disk (direct I/O where the file system takes it) read back the
same, and every commit point (a model's rename, a checkpoint's, a version's) comes after the fsyncs."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from trainer import durable
from trainer.artifact import map_safetensors, save_artifact
from trainer.data import Dataset
from trainer.errors import TrainingCancelled
from trainer.featurize import Featurizer
from trainer.hooks import QuietHooks
from trainer.model import ModelShape, XCModel
from trainer.params import TrainParams
from trainer.train import train

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.uint8, torch.bool]
MAPPED = {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool}


def _tensor(dtype: torch.dtype, shape: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 200, shape, generator=g).to(dtype)


tensor_dicts = st.dictionaries(
    st.text("abcdefgh.", min_size=1, max_size=6),
    st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 70), max_size=3), st.integers(0, 99)),
    max_size=6,
)


def _check_round_trip(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    back = load_file(str(path))  # the reference reader
    assert set(back) == set(tensors)
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
    mapped = {k: t for k, t in tensors.items() if t.dtype in MAPPED}
    if len(mapped) == len(tensors):  # ovex's own loader maps every dtype numpy has
        got = map_safetensors(path)
        for k, t in tensors.items():
            assert torch.equal(got[k], t), k
    header = int.from_bytes(path.read_bytes()[:8], "little")
    data = sum(t.numel() * t.element_size() for t in tensors.values())
    assert path.stat().st_size == 8 + header + data  # the last block's padding is cut off


@settings(max_examples=60, deadline=None)
@given(specs=tensor_dicts)
def test_written_safetensors_read_back_the_same(specs: dict[str, Any], tmp_path_factory: Any) -> None:
    tensors = {k: _tensor(d, s, seed) for k, (d, s, seed) in specs.items()}
    path = tmp_path_factory.mktemp("w") / "w.safetensors"
    old = durable.CHUNK
    durable.CHUNK = 2 * 4096  # several buffer loads and a padded tail even for small tensors
    try:
        shapes = durable.write_safetensors(path, tensors)
    finally:
        durable.CHUNK = old
    assert shapes == {k: list(t.shape) for k, t in tensors.items()}
    _check_round_trip(path, tensors)


def test_every_tensor_is_aligned_to_its_element_size(tmp_path: Path) -> None:
    """Mixed widths (label counts, fingerprints, flags): none needs a copy to be mapped."""
    tensors = {"a": torch.ones(3, dtype=torch.uint8), "b": torch.arange(5, dtype=torch.int64),
               "c": torch.ones(7, dtype=torch.float16), "d": torch.ones(3, dtype=torch.float32)}
    durable.write_safetensors(tmp_path / "w", tensors)
    header, where = durable.safetensors_layout({k: (t.dtype, list(t.shape)) for k, t in tensors.items()})
    assert all(where[k] % t.element_size() == 0 for k, t in tensors.items())
    assert (tmp_path / "w").read_bytes()[: len(header)] == header


def _supports_direct(folder: Path) -> bool:
    try:
        fd = os.open(folder / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    return True


class _Io:
    """Records the flags of every open, the path of every fsync and every rename, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.opened: list[tuple[str, int]] = []
        real_open, real_fsync, real_replace, real_rename = os.open, os.fsync, os.replace, os.rename

        def fake_open(path: Any, flags: int, *a: Any, **kw: Any) -> int:
            self.opened.append((str(path), flags))
            return real_open(path, flags, *a, **kw)

        def fake_fsync(fd: int) -> None:
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), ""))
            real_fsync(fd)

        def fake_replace(src: Any, dst: Any) -> None:
            self.events.append(("rename", os.path.realpath(src), os.path.realpath(dst)))
            real_replace(src, dst)

        def fake_rename(src: Any, dst: Any) -> None:
            self.events.append(("rename", os.path.realpath(src), os.path.realpath(dst)))
            real_rename(src, dst)

        monkeypatch.setattr(os, "open", fake_open)
        monkeypatch.setattr(os, "fsync", fake_fsync)
        monkeypatch.setattr(os, "replace", fake_replace)
        monkeypatch.setattr(os, "rename", fake_rename)

    def index(self, kind: str, a: str, b: str = "") -> int:
        for i, e in enumerate(self.events):
            if e == (kind, a, b):
                return i
        raise AssertionError(f"no {(kind, a, b)} in {self.events}")

    def synced(self, path: str) -> list[int]:
        return [i for i, e in enumerate(self.events) if e[:2] == ("fsync", path)]


def test_a_file_smaller_than_one_buffer_goes_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    io = _Io(monkeypatch)
    t = {"head": torch.randn(30, 17)}
    durable.write_safetensors(tmp_path / "w", t)
    assert [f & os.O_DIRECT for p, f in io.opened if p.endswith("/w")] == [0]
    assert io.synced(str(tmp_path / "w"))
    _check_round_trip(tmp_path / "w", t)


def test_direct_io_where_the_file_system_takes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not _supports_direct(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT: only the buffered path can run here")
    io = _Io(monkeypatch)
    t = {"head": torch.randn(300, 17)}
    monkeypatch.setattr(durable, "CHUNK", 4096)  # the file spans several buffers
    durable.write_safetensors(tmp_path / "w", t)
    assert [f & os.O_DIRECT for p, f in io.opened if p.endswith("/w")] == [os.O_DIRECT]
    assert io.synced(str(tmp_path / "w"))
    _check_round_trip(tmp_path / "w", t)


@pytest.mark.parametrize("refused_at", ["open", "first write"])
def test_a_refused_direct_write_falls_back_to_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_at: str
) -> None:
    """tmpfs and some overlay file systems refuse O_DIRECT, at open or only at the first write."""
    real_open, real_write = os.open, os.write
    direct_fds: set[int] = set()

    def fake_open(path: Any, flags: int, *a: Any, **kw: Any) -> int:
        if flags & os.O_DIRECT and refused_at == "open":
            raise OSError(errno.EINVAL, "Invalid argument")
        fd = real_open(path, flags & ~os.O_DIRECT, *a, **kw)
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        else:
            direct_fds.discard(fd)
        return fd

    def fake_write(fd: int, data: Any) -> int:
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "write", fake_write)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    t = {"head": torch.randn(300, 17), "n": torch.arange(9)}
    monkeypatch.setattr(durable, "CHUNK", 4096)
    durable.write_safetensors(tmp_path / "w", t)
    assert synced
    monkeypatch.undo()
    _check_round_trip(tmp_path / "w", t)


def _small_model() -> tuple[XCModel, Featurizer, Dataset]:
    rng = np.random.default_rng(0)
    x = sp.random(20, 30, density=0.3, format="csr", dtype=np.float32, random_state=0)
    y = sp.csr_matrix((np.ones(20, dtype=np.float32), rng.integers(0, 6, 20), np.arange(21)), shape=(20, 6))
    ds = Dataset(Y=y, n_features=30, n_labels=6, X=x)
    return XCModel(ModelShape(30, 6, 4), seed=1), Featurizer.fit(ds), ds


def _files(root: Path) -> Iterator[Path]:
    return (p for p in root.rglob("*") if p.is_file())


def test_a_saved_model_is_on_disk_before_its_rename_publishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, feat, _ = _small_model()
    out = tmp_path / "models" / "m"
    io = _Io(monkeypatch)
    save_artifact(out, model, feat, [str(i) for i in range(6)], TrainParams(), {"p@1": 0.5},
                  label_counts=np.ones(6))
    publish = next(i for i, e in enumerate(io.events) if e[0] == "rename" and e[2] == str(out.resolve()))
    tmp = io.events[publish][1]
    files = sorted(str(p.resolve().relative_to(out.resolve())) for p in _files(out))
    assert "weights.safetensors" in files and "config.json" in files
    for rel in files:  # every file, by its name before the rename, flushed before it
        assert any(i < publish for i in io.synced(os.path.join(tmp, rel))), rel
    assert any(i < publish for i in io.synced(tmp))
    assert any(i > publish for i in io.synced(str(out.parent.resolve())))  # and the rename itself


def test_a_checkpoint_is_on_disk_before_latest_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class StopAt(QuietHooks):
        def __init__(self) -> None:
            self.calls = 0

        def should_stop(self) -> bool:
            self.calls += 1
            return self.calls > 6

    _, _, ds = _small_model()
    ckpt = (tmp_path / "ckpt").resolve()
    io = _Io(monkeypatch)
    params = TrainParams(dim=4, epochs=3, batch_size=4, negatives=4, seed=0)
    with pytest.raises(TrainingCancelled):
        train(params, ds, None, out_dir=None, hooks=StopAt(), checkpoint_dir=ckpt, checkpoint_every=5)
    step = ckpt / "step-000000005"
    latest = io.index("rename", str(ckpt / ".latest.json.tmp"), str(ckpt / "latest.json"))
    moved = io.index("rename", str(ckpt / ".step-000000005.partial"), str(step))
    assert moved < latest
    partial = ckpt / ".step-000000005.partial"
    for f in _files(step):  # a rank's file is flushed under its temporary name, then renamed
        synced = io.synced(str(partial / f.name)) + io.synced(str(partial / (f.name + ".tmp")))
        assert any(i < moved for i in synced), f.name
    assert any(i < moved for i in io.synced(str(partial)))
    assert any(i < latest for i in io.synced(str(ckpt / ".latest.json.tmp")))
    assert any(i > latest for i in io.synced(str(ckpt)))


def test_a_published_version_is_named_on_disk_before_the_store_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.serving.catalog import publish

    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "config.json").write_text("{}")
    models = (tmp_path / "models" / "m").resolve()
    io = _Io(monkeypatch)
    assert publish(staging, models, "job_1") == "1"
    moved = io.index("rename", str(staging.resolve()), str(models / "1"))
    assert any(i > moved for i in io.synced(str(models)))
