"""Streaming multipart parsing (size cap, field handling), version publishing and the memory estimate."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.jobs import budget
from service.jobs.datasets import UploadError, receive_file
from service.jobs.runner import next_version, publish
from trainer.params import TrainParams

BOUNDARY = "XyZ123"


def _body(parts: list[tuple[str, str | None, bytes]]) -> bytes:
    out = b""
    for name, filename, data in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _receive(body: bytes, dest: Path, limit: int, chunk: int = 7, ctype: str | None = None):  # type: ignore[no-untyped-def]
    ctype = ctype or f"multipart/form-data; boundary={BOUNDARY}"
    return asyncio.run(receive_file(ctype, None, _chunks(body, chunk), dest, limit))


@settings(max_examples=30, deadline=None)
@given(payload=st.binary(min_size=0, max_size=3000), chunk=st.integers(1, 500))
def test_file_part_arrives_intact_whatever_the_chunking(
    tmp_path_factory: pytest.TempPathFactory, payload: bytes, chunk: int
) -> None:
    dest = tmp_path_factory.mktemp("up")
    got = _receive(
        _body([("name", None, b"my set"), ("file", "../../etc/x.txt", payload)]), dest, 10_000, chunk
    )
    assert got.path.read_bytes() == payload
    assert got.sha256 == hashlib.sha256(payload).hexdigest() and got.size == len(payload)
    assert got.filename == "x.txt"  # no directories from the client
    assert got.fields == {"name": "my set"}


def test_over_limit_is_413_and_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(UploadError) as e:
        _receive(_body([("file", "a.txt", b"z" * 5000)]), tmp_path, 4096, chunk=1000)
    assert e.value.status == 413
    assert list(tmp_path.iterdir()) == []


def test_missing_file_part_wrong_type_and_garbage(tmp_path: Path) -> None:
    with pytest.raises(UploadError) as e:
        _receive(_body([("name", None, b"x")]), tmp_path, 1000)
    assert e.value.status == 422
    with pytest.raises(UploadError) as e:
        _receive(b"{}", tmp_path, 1000, ctype="application/json")
    assert e.value.status == 415
    with pytest.raises(UploadError) as e:
        _receive(_body([("file", "a", b"1"), ("file", "b", b"2")]), tmp_path, 1000)
    assert e.value.status == 422
    assert list(tmp_path.iterdir()) == []


def test_publish_takes_the_next_free_version(tmp_path: Path) -> None:
    models = tmp_path / "models" / "m"
    assert next_version(models) == 1
    for expected in ("1", "2", "3"):
        staging = tmp_path / f"staging-{expected}"
        staging.mkdir()
        (staging / "config.json").write_text(expected)
        assert publish(staging, models) == expected
        assert (models / expected / "config.json").read_text() == expected and not staging.exists()
    (models / "10").mkdir()
    (models / "10" / "x").write_text("")
    (models / "beta").mkdir()
    assert next_version(models) == 11


@given(labels=st.integers(1, 10**7), features=st.integers(1, 10**6), dim=st.integers(1, 4096))
def test_memory_estimate_counts_head_projection_and_optimizer_state(
    labels: int, features: int, dim: int
) -> None:
    for optimizer, state in (("adam", 2), ("adagrad", 1)):
        params = TrainParams(dim=dim, optimizer=optimizer)
        est = budget.estimate(params, labels, features)
        assert est.bytes == (labels * (dim + 1) + features * dim) * 4 * (1 + state)
        assert est.bytes > budget.estimate(params, max(1, labels // 2), features).bytes or labels == 1


def test_text_datasets_use_hash_size_or_vocabulary_cap() -> None:
    assert budget.estimate(TrainParams(dim=8, hash_size=1000), 10, None).features == 1000
    assert budget.estimate(TrainParams(dim=8, max_vocab=5000), 10, None).features == 5000
    assert "MiB" in budget.human_bytes(3 << 20) and budget.human_bytes(12) == "12 bytes"


@settings(max_examples=60, deadline=None)
@given(body=st.binary(max_size=400), boundary=st.text("abcXYZ019-_'()+,./:=? ", min_size=1, max_size=80))
def test_garbage_bodies_are_client_errors(
    tmp_path_factory: pytest.TempPathFactory, body: bytes, boundary: str
) -> None:
    dest = tmp_path_factory.mktemp("garbage")
    try:
        got = asyncio.run(
            receive_file(f"multipart/form-data; boundary={boundary}", None, _chunks(body, 13), dest, 10_000)
        )
    except UploadError as e:
        assert 400 <= e.status < 500
        assert list(dest.iterdir()) == []
    else:
        assert got.path.exists()
