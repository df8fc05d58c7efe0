"""Streaming multipart parsing (size cap, field handling, a missing closing boundary), version publishing and
the memory estimate (hand-worked cases and properties)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.api.errors import status_for
from service.api.uploads import receive_file
from service.errors import DomainError
from service.serving.catalog import next_version, publish, published_version, retire
from service.training import budget
from trainer.capacity import run_bytes
from trainer.params import MAX_BATCH, MAX_NEGATIVES, TrainParams

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
    with pytest.raises(DomainError) as e:
        _receive(_body([("file", "a.txt", b"z" * 5000)]), tmp_path, 4096, chunk=1000)
    assert status_for(e.value) == 413
    assert list(tmp_path.iterdir()) == []


def test_missing_file_part_wrong_type_and_garbage(tmp_path: Path) -> None:
    with pytest.raises(DomainError) as e:
        _receive(_body([("name", None, b"x")]), tmp_path, 1000)
    assert status_for(e.value) == 422
    with pytest.raises(DomainError) as e:
        _receive(b"{}", tmp_path, 1000, ctype="application/json")
    assert status_for(e.value) == 415
    with pytest.raises(DomainError) as e:
        _receive(_body([("file", "a", b"1"), ("file", "b", b"2")]), tmp_path, 1000)
    assert status_for(e.value) == 422
    assert list(tmp_path.iterdir()) == []


def test_publish_takes_the_next_free_version(tmp_path: Path) -> None:
    models = tmp_path / "models" / "m"
    assert next_version(models) == 1
    for expected in ("1", "2", "3"):
        staging = tmp_path / f"staging-{expected}"
        staging.mkdir()
        (staging / "config.json").write_text(expected)
        assert publish(staging, models, f"job_{expected}") == expected
        assert (models / expected / "config.json").read_text() == expected and not staging.exists()
        assert published_version(models, f"job_{expected}") == expected  # a re-run of the job finds it
    (models / "10").mkdir()
    (models / "10" / "x").write_text("")
    (models / "beta").mkdir()
    assert next_version(models) == 11
    retire(models, "10")  # deleting the highest version leaves its number used
    (models / "10" / "x").unlink()
    (models / "10").rmdir()
    retire(models, "2")  # a lower one leaves the mark where it was
    assert next_version(models) == 11
    staging = tmp_path / "staging-next"
    staging.mkdir()
    assert publish(staging, models, "job_next") == "11"
    assert published_version(models, "job_other") is None


def test_memory_estimate_by_hand_linear_adam() -> None:
    """K=1000 labels, D=500 features, d=64, batch 256, 1024 negatives, Adam (weight + 2 states a weight,
    a float64 step count a row)."""
    est = budget.estimate(TrainParams(dim=64, batch_size=256, negatives=1024), 1000, 500)
    head = 1000 * 65  # labels × (d + 1)
    projection = 500 * 64
    candidates = 1000  # min(K, negatives + batch) = min(1000, 1280)
    step = 256 * candidates * 4 + candidates * 65 * 2 + 256 * 64 * 2 + 500 * 64 * 2
    assert (est.head, est.projection, est.hidden) == (head, projection, 0)
    assert est.bytes == ((head + projection) * 3 + step) * 4 + (1000 + 500) * 8 == 6_179_072


def test_memory_estimate_by_hand_mlp_and_maxout_each_optimizer() -> None:
    """Hidden layers: mlp width d, maxout width d·pieces (`width` rows of d + 1 weights a layer); Adam
    keeps 2 states per weight and a float64 step a row, row-wise Adagrad a float32 sum a row."""
    k, f, d, b, m = 50_000, 20_000, 128, 512, 4096
    for encoder, pieces, width in (("mlp", 2, 128), ("maxout", 3, 384)):
        for optimizer, mult, row in (("adam", 3, 8), ("adagrad", 1, 4)):
            p = TrainParams(
                dim=d, batch_size=b, negatives=m, encoder=encoder, hidden=2, pieces=pieces
            ).model_copy(update={"optimizer": optimizer})
            est = budget.estimate(p, k, f)
            hidden = 2 * (d * width + width)
            tables = (k * (d + 1) + f * d + hidden) * mult * 4 + (k + f + 2 * width) * row
            cand = b + m  # < K
            step = b * cand * 4 + cand * (d + 1) * 2 + b * (d + width * 2) * 2 + f * d * 2
            assert est.hidden == hidden, (encoder, optimizer)
            assert est.bytes == tables + step * 4, (encoder, optimizer)


def test_batch_times_negatives_is_counted_and_named() -> None:
    """The step's batch × candidates scores dominate a large batch with many negatives on many labels."""
    p = TrainParams(dim=16, batch_size=MAX_BATCH, negatives=MAX_NEGATIVES)
    est = budget.estimate(p, 10**6, 1000)
    assert est.scores == MAX_BATCH * (MAX_NEGATIVES + MAX_BATCH) * 4
    assert est.culprit() == "batch_size" and est.bytes > 80 << 30
    small = budget.estimate(TrainParams(dim=16), 10**6, 1000)
    assert small.bytes < est.bytes / 100


@given(
    labels=st.integers(1, 10**7),
    features=st.integers(1, 10**6),
    dim=st.integers(1, 4096),
    batch=st.integers(1, MAX_BATCH),
    negatives=st.integers(1, MAX_NEGATIVES),
)
def test_memory_estimate_grows_with_every_term(
    labels: int, features: int, dim: int, batch: int, negatives: int
) -> None:
    for optimizer in ("adam", "adagrad"):
        params = TrainParams(dim=dim, batch_size=batch, negatives=negatives, group_size=1)
        params = params.model_copy(update={"optimizer": optimizer})
        est = budget.estimate(params, labels, features)
        assert est.bytes == est.tables + est.step * 4
        assert est.tables == run_bytes(labels, features, params).tables
        for bigger in (
            budget.estimate(params, labels + 1, features),
            budget.estimate(params, labels, features + 1),
            budget.estimate(params.model_copy(update={"batch_size": batch + 1}), labels, features),
        ):
            assert bigger.bytes > est.bytes


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
    except DomainError as e:
        assert 400 <= status_for(e) < 500
        assert list(dest.iterdir()) == []
    else:
        assert got.path.exists()


def test_body_without_its_closing_boundary_is_refused(tmp_path: Path) -> None:
    whole = _body([("file", "a.txt", b"1 1 1\n0 0:1\n")])
    cut = whole[: whole.rindex(f"--{BOUNDARY}--".encode())]
    with pytest.raises(DomainError) as e:
        _receive(cut, tmp_path, 1000)
    assert status_for(e.value) == 400 and "closing boundary" in str(e.value)
    assert list(tmp_path.iterdir()) == []
