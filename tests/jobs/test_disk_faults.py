"""A full or read-only disk, for real, under a live `ovex serve`: the data and models directories are small
tmpfs mounts, filled to the last byte or remounted read-only while the server runs. Every fault answers a
507 or 503 that says what happened in words, leaves nothing half-written, keeps the connection usable, and
the same request succeeds once the fault is cleared. Skipped, with the reason, where tmpfs cannot be
mounted (not root, no CAP_SYS_ADMIN).

The job database sits on the ordinary disk: a tmpfs holding an open SQLite file cannot be remounted
read-only.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.conftest import API_KEY, Server, sqlite_server

TINY = {"dim": 16, "batch_size": 32, "negatives": 8, "lr": 0.05, "epochs": 1}
LONG = {**TINY, "epochs": 3000, "eval_every": 0}  # runs until the disk fills under it


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (skips the test when mounting is refused)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fault the disk: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True, capture_output=True)


@contextlib.contextmanager
def full(directory: Path) -> Iterator[None]:
    """The file system of `directory` filled to its last byte while inside; the filler goes on the way out."""
    filler = directory / f"filler-{uuid.uuid4().hex[:6]}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        for size in (1 << 16, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    probe = directory / "probe"
    with pytest.raises(OSError) as e:
        probe.write_bytes(b"\0" * 4096)
    assert e.value.errno == errno.ENOSPC
    probe.unlink(missing_ok=True)
    try:
        yield
    finally:
        filler.unlink()


@contextlib.contextmanager
def read_only(mount: Path) -> Iterator[None]:
    remount(mount, "ro")
    try:
        yield
    finally:
        remount(mount, "rw")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("disk")
    db = f"sqlite:///{root / 'db' / 'ovex.db'}"
    with tmpfs(root / "data", "8m"), tmpfs(root / "models", "8m"), sqlite_server(root, OVEX_DB_URL=db) as s:
        yield s


def _upload(srv: Server, path: Path) -> tuple[http.client.HTTPResponse, Any, bool]:
    """POST the file on a fresh keep-alive connection, then GET /healthz on the same one: (the upload's
    response, its JSON body, whether the second request went over the same connection and got a 200)."""
    boundary = uuid.uuid4().hex
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{path.name}\"\r\n"
            "Content-Type: text/plain\r\n\r\n")
    body = head.encode() + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        conn.request("POST", "/v1/datasets", body=body, headers={
            "X-API-Key": API_KEY, "Content-Type": f"multipart/form-data; boundary={boundary}"})
        resp = conn.getresponse()
        payload = json.loads(resp.read())
        sock = conn.sock
        reused = False
        if sock is not None and not resp.will_close:
            conn.request("GET", "/healthz")
            again = conn.getresponse()
            again.read()
            reused = conn.sock is sock and again.status == 200
        return resp, payload, reused
    finally:
        conn.close()


def _no_class_names(text: str) -> None:
    for word in ("Error", "Exception", "errno", "Errno", "Traceback", "/tmp", "/data", "internal error"):
        assert word not in text, text


def _leftovers(srv: Server) -> list[str]:
    """Temporary and half-written files: the upload directory's, stored datasets', job and copy dirs."""
    out = [f"uploads/{p.name}" for p in (srv.data_dir / "uploads").glob("*")]
    out += [f"jobs/{p.name}" for p in (srv.data_dir / "jobs").glob("*")]
    out += [str(p.relative_to(srv.models_dir)) for p in srv.models_dir.glob("*/.incoming-*")]
    return out


def test_an_upload_on_a_full_disk_is_a_507_and_succeeds_once_there_is_room(
    srv: Server, synth_files: dict[str, Path]
) -> None:
    with full(srv.data_dir):
        resp, body, reused = _upload(srv, synth_files["train"])
        assert resp.status == 507, body
        assert "disk is full" in body["detail"] and "free space" in body["detail"], body
        _no_class_names(body["detail"])
        assert reused, "the connection was not usable after the 507"
        assert _leftovers(srv) == []
        assert srv.client.get("/v1/datasets").json()["datasets"] == []
    resp, body, _ = _upload(srv, synth_files["train"])
    assert resp.status == 201, body
    assert body["rows"] == 600 and _leftovers(srv) == []


def test_an_upload_on_a_read_only_disk_is_a_503_and_succeeds_once_writable(
    srv: Server, synth_files: dict[str, Path]
) -> None:
    with read_only(srv.data_dir):
        resp, body, reused = _upload(srv, synth_files["test"])
        assert resp.status == 503, body
        assert "read-only" in body["detail"] and resp.getheader("Retry-After"), body
        _no_class_names(body["detail"])
        assert reused, "the connection was not usable after the 503"
    assert _leftovers(srv) == []
    resp, body, _ = _upload(srv, synth_files["test"])
    assert resp.status == 201, body


def _dataset(srv: Server, path: Path) -> str:
    return str(srv.upload(path)["id"])


def _failed(srv: Server, job_id: str) -> str:
    job = srv.wait(job_id, lambda j: j["state"] == "failed", 180, "the job to fail")
    return str(job["error"])


def test_a_job_whose_model_does_not_fit_the_disk_fails_in_words_and_leaves_nothing(
    srv: Server, synth_files: dict[str, Path]
) -> None:
    """The models directory is another file system: publishing copies the model there, and the disk fills
    during the copy. The half-copied version goes, the job's files go, and the error says what happened."""
    train = _dataset(srv, synth_files["train"])
    with full(srv.models_dir):
        job_id = srv.submit({"model": "m", "train_dataset": train, "params": TINY})
        error = _failed(srv, job_id)
        assert "disk is full while writing the model" in error, error
        _no_class_names(error)
        assert _leftovers(srv) == [] and not list(srv.models_dir.glob("m/[0-9]*"))
    job_id = srv.submit({"model": "m", "train_dataset": train, "params": TINY})
    assert srv.final_state(job_id) == "succeeded", srv.log_tail()
    assert (srv.models_dir / "m" / "1" / "config.json").is_file() and _leftovers(srv) == []


def test_a_job_whose_disk_fills_while_it_trains_fails_in_words_and_leaves_nothing(
    srv: Server, synth_files: dict[str, Path]
) -> None:
    train = _dataset(srv, synth_files["train"])
    job_id = srv.submit({"model": "long", "train_dataset": train, "params": LONG})
    srv.wait(job_id, lambda j: ((j["progress"] or {}).get("step") or 0) > 0, 120, "training to start")
    with full(srv.data_dir):
        error = _failed(srv, job_id)
        assert "no space left" in error or "disk is full" in error, error
        _no_class_names(error)
        assert _leftovers(srv) == [], _leftovers(srv)


def test_deleting_a_version_on_a_full_or_read_only_disk_is_refused_and_the_version_stays(
    srv: Server, synth_files: dict[str, Path]
) -> None:
    """Deleting writes the highest-version record first: a disk that cannot take it refuses the delete
    before anything is removed."""
    train = _dataset(srv, synth_files["train"])
    job_id = srv.submit({"model": "d", "train_dataset": train, "params": TINY})
    assert srv.final_state(job_id) == "succeeded", srv.log_tail()
    # pinned before version 2 appears: a never-activated model serves its highest version once it loads
    assert srv.client.post("/v1/models/d/versions/1/activate").status_code == 200
    shutil.copytree(srv.models_dir / "d" / "1", srv.models_dir / "d" / "2")
    deadline = time.monotonic() + 60
    while '"2"' not in srv.client.get("/v1/models/d/versions").text:
        assert time.monotonic() < deadline, srv.log_tail()
        time.sleep(0.2)
    with read_only(srv.models_dir):
        r = srv.client.delete("/v1/models/d/versions/2")
        assert r.status_code == 503 and "read-only" in r.json()["detail"], r.text
        _no_class_names(r.json()["detail"])
    assert (srv.models_dir / "d" / "2" / "config.json").is_file()
    activated = srv.client.post("/v1/models/d/versions/2/activate")
    assert activated.status_code == 200, activated.text  # whole: it loads and serves
    with full(srv.models_dir):
        r = srv.client.delete("/v1/models/d/versions/1")
        assert r.status_code == 507 and "disk is full" in r.json()["detail"], r.text
        _no_class_names(r.json()["detail"])
    assert (srv.models_dir / "d" / "1" / "config.json").is_file()
    assert srv.client.get("/v1/models/d").json()["active_version"] == "2"
    # once a higher version was deleted, deleting version 1 writes no record: its rename is what fails
    shutil.copytree(srv.models_dir / "d" / "2", srv.models_dir / "d" / "3")
    while '"3"' not in srv.client.get("/v1/models/d/versions").text:
        assert time.monotonic() < deadline + 60, srv.log_tail()
        time.sleep(0.2)
    assert srv.client.delete("/v1/models/d/versions/3").status_code == 204
    with read_only(srv.models_dir):
        r = srv.client.delete("/v1/models/d/versions/1")
        assert r.status_code == 503 and "read-only" in r.json()["detail"], r.text
    assert (srv.models_dir / "d" / "1" / "config.json").is_file()
    assert srv.client.delete("/v1/models/d/versions/1").status_code == 204
    assert sorted(os.listdir(srv.models_dir / "d")) == [".highest-version", "2"]


def test_a_job_database_on_the_full_disk_fails_the_job_in_words_and_frees_its_files(
    tmp_path: Path, synth_files: dict[str, Path]
) -> None:
    """The default layout: the SQLite database shares the data disk with the job's checkpoints. The job
    gives its files' space back before it records its failure, so the record can be written. The disk
    fills once a checkpoint is on it: a job with no files yet has no space to give back, and its record
    waits for the disk to have room (the reaper then re-queues it)."""
    with tmpfs(tmp_path / "data", "8m"), sqlite_server(tmp_path) as srv:
        train = _dataset(srv, synth_files["train"])
        job_id = srv.submit({"model": "long", "train_dataset": train, "params": LONG})
        checkpoints = srv.data_dir / "jobs" / job_id / "checkpoints"
        deadline = time.monotonic() + 120
        while not (checkpoints.is_dir() and any(checkpoints.iterdir())):
            assert time.monotonic() < deadline, f"no checkpoint after 120 s\n{srv.log_tail()}"
            time.sleep(0.1)
        with full(srv.data_dir):
            error = _failed(srv, job_id)
            assert "no space left" in error or "disk is full" in error, error
            _no_class_names(error)
            assert _leftovers(srv) == [], _leftovers(srv)


def test_a_full_disk_under_the_job_database_is_a_507_in_words(tmp_path: Path) -> None:
    """SQLite's own "database or disk is full", on a real full disk: the store's refusal says so."""
    from service.db.engine import make_engine, migrate
    from service.db.tables import DatasetRow
    from service.errors import InsufficientStorage
    from service.training.store import JobStore

    with tmpfs(tmp_path / "db", "2m") as db:
        engine = make_engine(f"sqlite:///{db / 'ovex.db'}")
        migrate(engine)
        store = JobStore(engine)
        rows = (DatasetRow(id=f"ds_{i:020d}", name="x" * 4000, checksum=f"{i:064d}", format="xc",
                           filename="f.txt", size_bytes=1, rows=1, features=1, labels=1, created_at=0.0)
                for i in range(100_000))
        with full(db), pytest.raises(InsufficientStorage) as e:
            for row in rows:  # the WAL's free pages first, then the disk
                store.add_dataset(row)
        assert "job database's disk is full" in e.value.message and "free space" in e.value.message
        _no_class_names(e.value.message)
        engine.dispose()
