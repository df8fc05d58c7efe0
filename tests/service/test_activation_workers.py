"""`ovex serve --workers 2`: an activation's 200 holds for every worker (a worker that cannot confirm
makes it a 503 that says so); an activation racing a delete is a 404, never a 409 with an OS error; a
version that is a link is deleted as a link, at once or at the next start."""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.serving.catalog import DELETING
from service.serving.peers import Peers
from service.serving.registry import CONFIRM_S
from tests.service.conftest import API_KEY, Server, copy_version, start_server, stop_server
from tests.service.test_hot_swap import recorded
from tests.service.test_workers import BODY, all_workers_serve, versions_by_worker

ADMIN = {"X-API-Key": API_KEY}
PLANTED = f"{DELETING}9-0badc0de"  # what a delete cut short by a crash leaves: a version's link, renamed


@pytest.fixture(scope="module")
def pair(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two workers serving `m`: versions 1 and 2, version 3 a link to a directory outside the models
    directory, and the link of a version whose deletion a crash cut short."""
    work = tmp_path_factory.mktemp("activation_workers")
    models = work / "models"
    copy_version(model_store, models, "small", "1", as_name="m")
    copy_version(model_store, models, "small", "2", as_name="m")
    outside = work / "outside"
    copy_version(model_store, outside, "small", "1", as_name="linked", as_version="3")
    (models / "m" / "3").symlink_to(outside / "linked" / "3", target_is_directory=True)
    copy_version(model_store, outside, "small", "1", as_name="linked", as_version="9")
    (models / "m" / PLANTED).symlink_to(outside / "linked" / "9", target_is_directory=True)
    srv = start_server(models, work, {"OVEX_WORKERS": "2", "OVEX_THREADS": "1"})
    versions_by_worker(srv)  # both workers up
    yield srv
    stop_server(srv)


def activate(c: httpx.Client, version: str) -> httpx.Response:
    return c.post(f"/v1/models/m/versions/{version}/activate", headers=ADMIN)


def test_an_activation_waits_for_live_and_starting_workers_only() -> None:
    """A slot with a live worker counts until it followed from a read after the ask; a slot being
    forked counts (its worker has read nothing yet); an empty slot (a reaped worker) does not."""
    peers = Peers(4)
    me = peers.process(0)
    peers.occupy(0, os.getpid())
    peers.occupy(1, 101)
    peers.starting(2)
    peers.vacate(3)
    earlier = time.monotonic_ns()
    peers.process(1).followed(earlier)
    asked = me.ask()
    assert peers.process(1).wait(1.0) and peers.process(2).wait(0.0)  # both woken, both behind
    assert me.confirm(asked, 0.01) == (1, 3)
    peers.process(1).followed(time.monotonic_ns())
    assert me.confirm(asked, 0.01) == (2, 3)
    peers.process(2).followed(time.monotonic_ns())
    t0 = time.monotonic()
    assert me.confirm(asked, 5.0) == (3, 3) and time.monotonic() - t0 < 0.5
    assert not peers.process(1).wait(0.0)  # followed since the ask: nothing new
    peers.vacate(2)
    assert me.confirm(me.ask(), 0.01) == (1, 2)


def test_every_answer_after_an_activation_names_the_version_it_activated(pair: Server) -> None:
    """Predict from several connections while v1 and v2 are activated in turn every second: an answer to
    a request sent after an activation's 200 (and before the next activation) names that version."""
    answers: list[tuple[float, int, str | None, str]] = []  # sent at, status, version, worker
    stop = threading.Event()

    def hammer(seed: int) -> None:
        with pair.client() as c:
            i = seed
            while not stop.is_set():
                i += 1
                headers = {"connection": "close"} if i % 25 == 0 else {}  # new connections now and then
                sent = time.monotonic()
                r = c.post("/v1/models/m/predict", json=BODY, headers=headers)
                version = r.json()["version"] if r.status_code == 200 else None
                answers.append((sent, r.status_code, version, r.headers.get("x-ovex-worker", "?")))

    acts: list[tuple[float, float, str, int, str]] = []  # sent, answered, version, status, body
    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        with pair.client() as c:
            for k in range(10):
                version = "12"[k % 2]
                sent = time.monotonic()
                r = activate(c, version)
                acts.append((sent, time.monotonic(), version, r.status_code, r.text))
                time.sleep(max(0.0, sent + 1.0 - time.monotonic()))
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    ends = [a[0] for a in acts[1:]] + [min(a[0] for a in answers[-8:])]
    checked = violations = 0
    workers: set[str] = set()
    for (_, answered, version, _, _), end in zip(acts, ends, strict=True):
        for sent, status, got, worker in answers:
            if answered <= sent < end and status == 200:
                checked += 1
                workers.add(worker)
                violations += got != version
    latency = [a[1] - a[0] for a in acts]
    print(
        f"\nactivation across 2 workers: {len(answers)} answers, {checked} checked, {violations} naming "
        f"another version; activation latency p50 {statistics.median(latency):.3f} s, "
        f"max {max(latency):.3f} s"
    )
    assert [a[3] for a in acts] == [200] * len(acts), [a[4] for a in acts if a[3] != 200][:2]
    assert [a for a in answers if a[1] != 200] == []
    assert checked >= 100 and len(workers) == 2, (checked, workers)
    assert violations == 0


def test_an_activation_a_worker_cannot_confirm_is_a_503_saying_it_is_recorded(pair: Server) -> None:
    """A worker frozen (SIGSTOP) cannot follow: the activation answers 503 once the wait is over, saying
    it is recorded; thawed, the worker follows, and activating again answers 200."""
    with pair.client() as c:
        assert activate(c, "1").status_code == 200
    frozen = int(next(iter(versions_by_worker(pair))))
    os.kill(frozen, signal.SIGSTOP)
    try:
        with pair.client() as c:  # a new connection: the worker still running takes it
            t0 = time.monotonic()
            r = activate(c, "2")
            waited = time.monotonic() - t0
        assert r.status_code == 503, r.text
        detail = r.json()["detail"]
        assert "recorded as active" in detail and "serves in 1 of this server's 2 workers" in detail, detail
        assert "activate it again" in detail and str(frozen) not in detail
        assert CONFIRM_S <= waited < CONFIRM_S + 10, waited
        assert recorded(pair)["m"] == "2"
    finally:
        os.kill(frozen, signal.SIGCONT)
    all_workers_serve(pair, "2", within=5.0)
    with pair.client() as c:
        r = activate(c, "2")
    assert r.status_code == 200, r.text


def _race(srv: Server, version: str, delay: float) -> tuple[httpx.Response, httpx.Response]:
    """Activate `version` and, `delay` later, delete it, on two connections; both answers."""
    got: dict[str, httpx.Response] = {}

    def act() -> None:
        with srv.client() as c:
            got["activate"] = activate(c, version)

    def delete() -> None:
        with srv.client() as c:
            time.sleep(delay)
            got["delete"] = c.delete(f"/v1/models/m/versions/{version}", headers=ADMIN)

    threads = [threading.Thread(target=act), threading.Thread(target=delete)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return got["activate"], got["delete"]


def test_an_activation_racing_a_delete_is_a_404_or_wins(pair: Server, model_store: Path) -> None:
    """Activate and delete the same version at once, the delete sent at several points of the load: the
    activation answers 200 (then the delete is refused: it is active) or 404 (then the delete won);
    never a 409 or an answer that shows an OS error."""
    outcomes: list[tuple[int, str, int, str]] = []
    for k in range(24):
        version = str(100 + k)
        copy_version(model_store, pair.models_dir, "small", "1", as_name="m", as_version=version)
        a, d = _race(pair, version, delay=0.004 * (k % 12))
        outcomes.append((a.status_code, a.text, d.status_code, d.text))
    print("\nactivate/delete races (activate, delete):",
          sorted({(o[0], o[2]) for o in outcomes}), [(o[0], o[2]) for o in outcomes].count((404, 204)))
    for a_status, a_text, d_status, d_text in outcomes:
        for text in (a_text, d_text):
            assert "Errno" not in text and "FileNotFoundError" not in text
            assert str(pair.models_dir) not in text
        assert (a_status, d_status) in {(200, 409), (404, 204)}, (a_status, a_text, d_status, d_text)
        if a_status == 404:
            assert "no longer exists" in a_text or "deleted meanwhile" in a_text or "has no version" in a_text
    assert not list((pair.models_dir / "m").glob(f"{DELETING}1*"))


def test_a_version_that_is_a_link_is_deleted_as_a_link(pair: Server) -> None:
    """The link a crashed delete left is removed at start, the target untouched; deleting a version that
    is a link removes the link now and leaves nothing behind, nor touches the directory it points to."""
    outside = pair.models_dir.parent / "outside" / "linked"
    planted = pair.models_dir / "m" / PLANTED
    assert not planted.exists() and not planted.is_symlink()
    assert (outside / "9" / "config.json").is_file()
    with pair.client() as c:
        assert activate(c, "1").status_code == 200
        r = c.delete("/v1/models/m/versions/3", headers=ADMIN)
        assert r.status_code == 204, r.text
        assert "3" not in [v["version"] for v in c.get("/v1/models/m/versions").json()["versions"]]
    left = [p.name for p in (pair.models_dir / "m").iterdir() if p.name.startswith(DELETING)]
    assert left == []
    assert (outside / "3" / "config.json").is_file()
    assert not (pair.models_dir / "m" / "3").is_symlink()
