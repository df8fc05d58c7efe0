"""Fixtures for the job-system tests: tiny synthetic datasets, a real `ovex serve` on 127.0.0.1, standalone
workers, and PostgreSQL started on loopback for the `services` tests.

PostgreSQL comes from Debian (`apt-get install -y postgresql`; initdb/pg_ctl run as the `postgres` user when
we are root). When it cannot be started the dependent tests are skipped with the reason, never passed —
unless `OVEX_REQUIRE_SERVICES=1` (CI sets it), which turns a missing PostgreSQL into a failure.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.training.runtime import terminate
from tests.live import free_port, wait_answering

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key-jobs"


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVEX_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    terminate(proc, timeout)


REQUIRE_SERVICES = os.environ.get("OVEX_REQUIRE_SERVICES", "") not in ("", "0", "false")


def _unavailable(reason: str) -> None:
    """Skip with the reason; under OVEX_REQUIRE_SERVICES=1 a missing service fails the test instead."""
    if REQUIRE_SERVICES:
        pytest.fail(f"{reason} (OVEX_REQUIRE_SERVICES=1: PostgreSQL is required)")
    pytest.skip(reason)


# -------------------------------------------------------------------------------------- datasets
@pytest.fixture(scope="session")
def synth_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """XC train/test files with planted structure (small: a job trains in seconds)."""
    from trainer.data import write_xc
    from trainer.synth import synth

    d = tmp_path_factory.mktemp("synth")
    X, Y = synth(40, 300, 600, seed=3, part=0)
    write_xc(d / "train.txt", X, Y)
    Xt, Yt = synth(40, 300, 200, seed=3, part=1)
    write_xc(d / "test.txt", Xt, Yt)
    (d / "bad.txt").write_text("3 10 5\n0,1 1:1.0 2:0.5\n2 3:1.0\n7 4:1.0\n")
    Xw, Yw = synth(40, 400, 50, seed=4)
    write_xc(d / "wide.txt", Xw, Yw)  # 400 features: does not fit a model trained on 300

    def jsonl(path: Path, X: Any, Y: Any, extra_label: str | None = None) -> None:
        with open(path, "w") as fh:
            for r in range(X.shape[0]):
                words = [f"w{j}" for j in X.indices[X.indptr[r] : X.indptr[r + 1]]]
                labels = [f"topic{k}" for k in Y.indices[Y.indptr[r] : Y.indptr[r + 1]]]
                if extra_label and r == X.shape[0] - 1:
                    labels.append(extra_label)
                fh.write(json.dumps({"text": " ".join(words), "labels": labels}) + "\n")

    jsonl(d / "train.jsonl", X, Y)
    jsonl(d / "test_unknown.jsonl", Xt[:30], Yt[:30], extra_label="never-seen")
    return {
        "train": d / "train.txt",
        "test": d / "test.txt",
        "bad": d / "bad.txt",
        "wide": d / "wide.txt",
        "train_jsonl": d / "train.jsonl",
        "test_unknown_jsonl": d / "test_unknown.jsonl",
    }


# -------------------------------------------------------------------------------------- backends
@dataclass
class Backend:
    """A job database; `fresh_env()` gives each server its own empty one."""

    name: str
    fresh_env: Callable[[], dict[str, str]] = field(default=lambda: {})


def _run_as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", "postgres", "--", *cmd]
    return ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(cmd)]


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _apt_install(package: str) -> str | None:
    """Install a Debian package when running as root (CI); returns an error text or None."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"{package} not installed and cannot apt-get install it here (not root)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            return f"{' '.join(cmd)} failed: {r.stderr.strip()[-300:]}"
    return None


@dataclass
class Postgres:
    """A PostgreSQL server on loopback in its own temp dir; `stop()` and `start()` it again to take the
    job database away from a running service (its data survives)."""

    root: Path
    pg_ctl: str
    port: int

    @property
    def url(self) -> str:
        """The test database (`ovex_test`)."""
        return f"postgresql+psycopg://ovex@127.0.0.1:{self.port}/ovex_test"

    def start(self) -> str | None:
        """Start the server; an error text, or None once it accepts connections."""
        opts = f"-p {self.port} -k {self.root / 'sock'} -c listen_addresses=127.0.0.1 -c fsync=off " \
               "-c max_connections=200"
        r = subprocess.run(
            _run_as_postgres([self.pg_ctl, "-D", str(self.root / "data"), "-o", opts, "-l",
                              str(self.root / "log"), "-w", "-t", "60", "start"]),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode == 0:
            return None
        log = (self.root / "log").read_text()[-400:] if (self.root / "log").exists() else ""
        return f"{r.stderr.strip()[-300:]} {log}"

    def stop(self, mode: str = "immediate") -> None:
        subprocess.run(
            _run_as_postgres([self.pg_ctl, "-D", str(self.root / "data"), "-m", mode, "-w", "stop"]),
            capture_output=True,
            timeout=60,
        )


def start_postgres() -> Postgres:
    """initdb and start a server with an empty `ovex_test` database; skips (or fails) when it cannot."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        err = _apt_install("postgresql")
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not (initdb and pg_ctl):
            _unavailable(f"PostgreSQL unavailable: {err or 'initdb/pg_ctl not found'}")
    assert initdb and pg_ctl
    root = Path(tempfile.mkdtemp(prefix="ovex-pg-"))
    root.chmod(0o755)
    sock = root / "sock"
    sock.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    pg = Postgres(root, pg_ctl, free_port())
    r = subprocess.run(
        _run_as_postgres([initdb, "-D", str(root / "data"), "-A", "trust", "-U", "ovex", "--no-sync"]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        _unavailable(f"PostgreSQL initdb failed: {r.stderr.strip()[-400:]}")
    err = pg.start()
    if err is not None:
        shutil.rmtree(root, ignore_errors=True)
        _unavailable(f"PostgreSQL did not start: {err}")
    try:
        import psycopg

        admin = f"host=127.0.0.1 port={pg.port} user=ovex dbname=postgres"
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("CREATE DATABASE ovex_test")
    except BaseException:
        remove_postgres(pg)
        raise
    return pg


def remove_postgres(pg: Postgres) -> None:
    pg.stop()
    shutil.rmtree(pg.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    pg = start_postgres()
    try:
        yield pg.url
    finally:
        remove_postgres(pg)


@pytest.fixture
def own_postgres() -> Iterator[Postgres]:
    """A PostgreSQL server of the test's own, which it may stop and restart."""
    pg = start_postgres()
    try:
        yield pg
    finally:
        remove_postgres(pg)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def backend(request: pytest.FixtureRequest) -> Backend:
    """The same tests run on the embedded default (SQLite) and on PostgreSQL."""
    if request.param == "sqlite":
        return Backend("sqlite")
    pg = request.getfixturevalue("postgres_url")

    def fresh_env() -> dict[str, str]:
        return {"OVEX_DB_URL": fresh_postgres_db(pg)}

    return Backend("postgres", fresh_env)


def fresh_postgres_db(base_url: str) -> str:
    """A new empty database on the test server; its URL."""
    import psycopg

    name = f"ovex_{os.urandom(4).hex()}"
    admin = base_url.replace("postgresql+psycopg://", "postgresql://").rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return base_url.rsplit("/", 1)[0] + f"/{name}"


# -------------------------------------------------------------------------------------- processes
class Server:
    """`ovex serve` in a subprocess with its own temp dirs, plus helpers to talk to it."""

    def __init__(self, root: Path, backend: Backend, *, embedded_worker: bool, extra_env: dict[str, str]):
        self.root = root
        self.data_dir = root / "data"
        self.models_dir = root / "models"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = _child_env(
            {
                "OVEX_DATA_DIR": str(self.data_dir),
                "OVEX_MODELS_DIR": str(self.models_dir),
                "OVEX_API_KEY": API_KEY,
                "OVEX_CHECKPOINT_EVERY": "20",
                "OVEX_JOB_LEASE_S": "3",
                "OVEX_JOB_HEARTBEAT_S": "0.5",
                # jobs claimed and their events streamed within 0.1 s, not 0.25: tests wait on many jobs
                "OVEX_JOB_POLL_S": "0.1",
                "OVEX_EMBEDDED_WORKER": "true" if embedded_worker else "false",
                "OVEX_THREADS": "1",
                "OVEX_WARMUP": "false",
                **backend.fresh_env(),
                **extra_env,
            }
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.client = httpx.Client(base_url=self.base, headers={"X-API-Key": API_KEY}, timeout=30)

    def start(self, wait: bool = True) -> None:
        log = open(self.root / "server.log", "ab")  # noqa: SIM115
        cmd = [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--models-dir",
            str(self.models_dir),
        ]
        self.proc = subprocess.Popen(
            cmd,
            env=self.env,
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        assert self.proc is not None
        # a loaded CI box imports torch and faiss slowly
        wait_answering(self.proc, self.base + "/healthz", 240, self.log_tail)

    def start_worker(self) -> subprocess.Popen[bytes]:
        log = open(self.root / f"worker{len(self.workers)}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "worker"],
            env=self.env,
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.workers.append(proc)
        return proc

    def wait_workers_ready(self, timeout: float = 90) -> None:
        """Until every started worker has logged that it is claiming jobs (migrations done)."""
        deadline = time.monotonic() + timeout
        for i in range(len(self.workers)):
            log = self.root / f"worker{i}.log"
            while "claiming jobs from" not in (log.read_text(errors="replace") if log.exists() else ""):
                if time.monotonic() > deadline:
                    raise AssertionError(f"worker {i} did not start:\n{self.log_tail()}")
                time.sleep(0.1)

    def worker_pid(self, worker: str) -> int:
        """The process behind a job's opaque worker id, from the line the worker logs when it starts."""
        for path in sorted(self.root.glob("*.log")):
            text = path.read_text(errors="replace")
            # a terminal's "pid=…" or a JSON line's "pid": …
            found = re.search(rf'{re.escape(worker)}: claiming jobs from .*?\bpid(?:=|": )(\d+)', text)
            if found:
                return int(found.group(1))
        raise AssertionError(f"no worker {worker!r} in the logs:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        parts = []
        for p in sorted(self.root.glob("*.log")):
            parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-n:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        self.client.close()
        for w in self.workers:
            _stop(w)
        if self.proc is not None:
            _stop(self.proc)

    # -- API helpers ------------------------------------------------------------------------------
    def upload(self, path: Path, name: str | None = None) -> dict[str, Any]:
        with open(path, "rb") as fh:
            data = {"name": name} if name else None
            r = self.client.post("/v1/datasets", files={"file": (path.name, fh, "text/plain")}, data=data)
        assert r.status_code in (200, 201), r.text
        return dict(r.json())

    def submit(self, body: dict[str, Any]) -> str:
        r = self.client.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        assert r.json()["state"] == "queued"
        return str(r.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait(
        self, job_id: str, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if pred(job):
                return job
            pending_activation = job["state"] == "succeeded" and job["activate"] and not job["activated"]
            if job["state"] in ("succeeded", "failed", "cancelled") and not pending_activation:  # final
                raise AssertionError(f"job ended before {what}: {json.dumps(job)}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {json.dumps(job)}\n{self.log_tail()}")
            time.sleep(0.1)

    def logs(self, job_id: str) -> str:
        r = self.client.get(f"/v1/jobs/{job_id}/logs")
        assert r.status_code == 200, r.text
        return r.text

    def final_state(self, job_id: str, timeout: float = 120) -> str:
        """Follow the SSE stream to its end; the state of its last `state` event."""
        return next(d["state"] for kind, d in reversed(self.events(job_id, timeout)) if kind == "state")

    def events(self, job_id: str, timeout: float = 120) -> list[tuple[str, dict[str, Any]]]:
        """Follow the SSE stream to its end; (event, data) pairs."""
        out: list[tuple[str, dict[str, Any]]] = []
        kind = "message"
        with self.client.stream("GET", f"/v1/jobs/{job_id}/events", timeout=timeout) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:"):
                    out.append((kind, json.loads(line.split(":", 1)[1])))
        return out


TINY_PARAMS: dict[str, Any] = {"dim": 8, "batch_size": 64, "negatives": 16, "epochs": 1, "eval_every": 0}


def assert_params_refused(srv: Server, body: dict[str, Any], field: str, bad: tuple[Any, ...]) -> None:
    """Each value of `field` in `bad` makes `POST /v1/jobs` a 422 naming `params.<field>`, and no job is
    queued: the check every job option's test makes."""
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])
    for value in bad:
        r = srv.client.post("/v1/jobs", json={**body, "params": {**body.get("params", {}), field: value}})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"][:3] == ["body", "params", field], r.text
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs  # nothing queued


@contextlib.contextmanager
def sqlite_server(root: Path, **extra_env: str) -> Iterator[Server]:
    """`ovex serve` on SQLite with its embedded job worker, its files under `root` (`extra_env`: more
    settings); stopped on the way out."""
    server = Server(root, Backend("sqlite"), embedded_worker=True, extra_env=extra_env)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def factory(
        backend: Backend, *, embedded_worker: bool = True, workers: int = 0, **extra_env: str
    ) -> Server:
        """A started server; `workers` standalone workers are launched alongside (their start-up overlaps)."""
        srv = Server(
            tmp_path_factory.mktemp("srv"), backend, embedded_worker=embedded_worker, extra_env=extra_env
        )
        servers.append(srv)
        srv.start(wait=False)
        for _ in range(workers):
            srv.start_worker()
        srv.wait_ready()
        return srv

    yield factory
    for srv in servers:
        srv.stop()


@pytest.fixture(scope="module")
def train_id(srv: Server, synth_files: dict[str, Path]) -> str:
    """The tiny training set uploaded to the module's own `srv` (each module that uses it defines one)."""
    return str(srv.upload(synth_files["train"])["id"])
