"""What a newcomer meets first: `ovex demo` (what `make run` runs) keeps its API key across restarts in a
0600 file, refuses a busy port with one line that names the fix, logs readably on a terminal and as clean
JSON otherwise, and suggests a short input whose answer is sparse."""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from service.logs import HumanFormatter, JsonFormatter, configure_logging, use_json
from service.serve import check_port_free, persistent_api_key
from trainer.errors import OvexError


def test_api_key_is_created_once_with_mode_0600_and_kept(tmp_path: Path) -> None:
    data = tmp_path / "data"
    key, path = persistent_api_key(data)
    assert path == data / "api_key" and len(key) >= 20
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, _ = persistent_api_key(data)
    assert again == key  # a restart answers to the key exported before it
    path.chmod(0o644)  # loosened by hand: tightened again
    assert persistent_api_key(data)[0] == key and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("\n")  # emptied: a new key, not an empty one
    fresh, _ = persistent_api_key(data)
    assert fresh and fresh != key


def test_busy_port_is_one_line_that_names_the_fix(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OvexError, match=rf"port {port} on 127.0.0.1 is already in use.*PORT={port + 1}"):
            check_port_free("127.0.0.1", port, "make run PORT={port}")
        proc = subprocess.run(
            [sys.executable, "-m", "service.cli", "demo", "--port", str(port), "--models-dir", "nowhere"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )
    assert proc.returncode == 2
    assert proc.stdout == ""  # no banner, no key, no training before the error
    assert proc.stderr.splitlines() == [
        f"error: port {port} on 127.0.0.1 is already in use; start on another one: "
        f"make run PORT={port + 1} (or: ovex demo --port {port + 1})"
    ]
    assert list(tmp_path.iterdir()) == []  # no models dir, no data dir, no key file
    check_port_free("127.0.0.1", port, "")  # free again once the listener is gone


def _record(msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, msg, None, None)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_json_lines_hold_no_terminal_codes_and_humans_get_plain_lines() -> None:
    rec = _record("Uvicorn running on \x1b[1mhttp://x\x1b[0m", color_message="\x1b[32mINFO\x1b[0m", port=1)
    line = JsonFormatter().format(rec)
    assert "\x1b" not in line and "\\u001b" not in line and "color_message" not in line
    out = json.loads(line)
    assert out["msg"] == "Uvicorn running on http://x" and out["port"] == 1 and out["level"] == "info"
    human = HumanFormatter().format(_record("model version loaded", model="demo", version="1"))
    assert re.fullmatch(r"\d\d:\d\d:\d\d INFO +uvicorn +model version loaded  model=demo version=1", human)


def test_log_format_follows_the_terminal_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    assert use_json(None) is False and use_json(True) is True
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert use_json(None) is True and use_json(False) is False
    configure_logging("info", None)
    logging.getLogger("alembic.runtime.migration").info("Running upgrade  -> 0001")
    logging.getLogger("ovex.test").info("kept", extra={"k": 1})
    lines = sys.stderr.getvalue().splitlines()
    assert [json.loads(x)["msg"] for x in lines] == ["kept"]  # alembic's chatter stays below warning


def test_make_run_takes_a_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run PORT=8002` must reach `ovex demo` as OVEX_PORT (make itself is not run by the suite)."""
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    recipe = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "$(if $(PORT),OVEX_PORT=$(PORT) )$(VENV)/bin/ovex demo" in recipe
    from service.settings import Settings

    monkeypatch.setenv("OVEX_PORT", "8002")
    assert Settings().port == 8002
