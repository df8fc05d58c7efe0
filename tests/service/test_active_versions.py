"""One truth for what is active: the database row, followed by every replica, kept across restarts."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.serving.active import ActiveVersions
from tests.service.conftest import API_KEY, Server, copy_version, start_server, stop_server

BODY = {"inputs": [{"features": {"indices": [3, 17, 101], "values": [1.0, 2.0, 0.5]}}], "top_k": 3}


def served_version(srv: Server, model: str = "m", within: float = 5.0) -> str:
    """The version answering predictions, once the model's listing names the same one (a swap may land
    between the two reads: then both are read again)."""
    deadline = time.monotonic() + within
    with srv.client() as c:
        while True:
            r = c.post(f"/v1/models/{model}/predict", json=BODY)
            assert r.status_code == 200, r.text
            version: str = r.json()["version"]
            listed = c.get(f"/v1/models/{model}").json()["active_version"]
            if listed == version:
                return version
            assert time.monotonic() < deadline, f"predict answers {version!r}, the listing says {listed!r}"
            time.sleep(0.05)


def wait_for_version(srv: Server, want: str, within: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        if served_version(srv) == want:
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"{srv.base} still serves {served_version(srv)!r}, not {want!r}, after {within}s")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ActiveVersions]:
    s = ActiveVersions.for_url(f"sqlite:///{tmp_path / 'ovex.db'}")
    s.migrate()
    yield s
    s.close()


def test_first_choice_wins_and_activation_overrides(store: ActiveVersions) -> None:
    assert store.record_first("m", "3") == "3"
    assert store.record_first("m", "4") == "3"  # a later process follows the first choice
    store.set("m", "4")
    assert store.get("m") == "4" and store.all() == {"m": "4"}
    assert store.record_first("m", "5") == "4"


def test_racing_first_choices_agree(store: ActiveVersions) -> None:
    answers: list[str] = []
    barrier = threading.Barrier(8)

    def pick(v: str) -> None:
        barrier.wait()
        answers.append(store.record_first("race", v))

    threads = [threading.Thread(target=pick, args=(str(i),)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(answers)) == 1 and answers[0] == store.get("race")


def test_legacy_file_is_adopted_without_overriding_the_database(
    store: ActiveVersions, tmp_path: Path
) -> None:
    store.set("a", "9")
    (tmp_path / "active.json").write_text('{"models": {"a": "1", "b": "2"}}')
    store.import_legacy_file(tmp_path)
    assert store.all() == {"a": "9", "b": "2"}
    assert not (tmp_path / "active.json").exists() and (tmp_path / "active.json.imported").exists()
    (tmp_path / "active.json").write_text("{broken")
    store.import_legacy_file(tmp_path)  # unreadable: ignored with a warning, nothing changes
    assert store.all() == {"a": "9", "b": "2"}


def test_two_replicas_agree_after_activation_and_after_restart(model_store: Path, tmp_path: Path) -> None:
    """Two servers sharing a models dir and a database: one activates, the other follows within 5 s."""
    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1", as_name="m")
    copy_version(model_store, models, "small", "2", as_name="m")
    a = start_server(models, tmp_path)
    b = start_server(models, tmp_path)
    try:
        assert served_version(a) == served_version(b) == "2"  # nobody activated: the highest, recorded
        with a.client() as c:
            r = c.post("/v1/models/m/versions/1/activate", headers={"X-API-Key": API_KEY})
            assert r.status_code == 200, r.text
        assert served_version(a) == "1"
        wait_for_version(b, "1", within=5.0)
        stop_server(a)
        stop_server(b)
        a, b = start_server(models, tmp_path), start_server(models, tmp_path)
        assert served_version(a) == served_version(b) == "1"
    finally:
        stop_server(a)
        stop_server(b)


def test_a_never_activated_model_serves_the_same_version_after_a_restart(
    model_store: Path, tmp_path: Path
) -> None:
    """The first choice is recorded: a newer version arriving on disk does not change what a restart
    serves (it serves once activated)."""
    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1", as_name="m")
    srv = start_server(models, tmp_path)
    try:
        assert served_version(srv) == "1"
        copy_version(model_store, models, "small", "2", as_name="m")
        stop_server(srv)
        srv = start_server(models, tmp_path)
        assert served_version(srv) == "1"
        with srv.client() as c:
            listed = c.get("/v1/models/m").json()
        assert [v["version"] for v in listed["versions"]] == ["1", "2"]
    finally:
        stop_server(srv)


def test_a_recorded_version_that_vanished_falls_back_without_forgetting_it(
    model_store: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1", as_name="m")
    copy_version(model_store, models, "small", "2", as_name="m")
    store = ActiveVersions.for_url(f"sqlite:///{tmp_path / 'data' / 'ovex.db'}")
    store.migrate()
    store.set("m", "1")
    shutil.rmtree(models / "m" / "1")
    srv = start_server(models, tmp_path)
    try:
        assert served_version(srv) == "2"
        assert store.get("m") == "1"  # the choice stands: restoring version 1 serves it again
        tmp = copy_version(model_store, models, "small", "1", as_name="m", as_version=".arriving")
        tmp.rename(models / "m" / "1")  # atomically, as artifacts are written
        wait_for_version(srv, "1", within=5.0)
    finally:
        stop_server(srv)
        store.close()


def test_activation_of_an_unknown_version_is_a_404_and_records_nothing(
    model_store: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    copy_version(model_store, models, "small", "1", as_name="m")
    srv = start_server(models, tmp_path)
    try:
        with httpx.Client(base_url=srv.base, timeout=30) as c:
            r = c.post("/v1/models/m/versions/9/activate", headers={"X-API-Key": API_KEY})
        assert r.status_code == 404 and "no version '9'" in r.json()["detail"]
        store = ActiveVersions.for_url(f"sqlite:///{tmp_path / 'data' / 'ovex.db'}")
        assert store.all() == {"m": "1"}
        store.close()
    finally:
        stop_server(srv)
