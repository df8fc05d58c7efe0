"""The hostile suite (bench/hostile.py) against a live server: a few hundred wrong, hostile or odd
requests, each answered without a server error or a dropped connection, in the protocol's error shape,
with nothing leaked, the connection usable after it and `/healthz` answering throughout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_hostile_suite(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "hostile.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    report = json.loads((tmp_path / "hostile.json").read_text())["report"]
    assert report["cases"] >= 300
    for kind in ("server_errors", "dropped", "bad_bodies", "unusable_after"):
        assert report[kind] == [], (kind, report[kind])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert report["healthz_checks"] > 50  # one every few ms while the cases run: a few seconds' worth
    # the bench reports the figures; the test leaves room for a loaded CI machine and still fails on the
    # stalls of seconds that unbounded validation caused
    assert report["healthz_max_ms_while_refusing"] < 1000, report["healthz_max_refusing_case"]
    assert report["healthz_max_ms"] < 2000, report["slowest"]
