"""The one home of what the tests' servers share: the client's live-server helper (loaded by path: that
folder is not a package, and it must run where only the client is installed) and its free-port picker,
wait and stop, which every launcher under tests/ imports from here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_live_server() -> ModuleType:
    name = "ovex_tests_live_server"
    if name in sys.modules:
        return sys.modules[name]
    path = ROOT / "clients" / "python" / "tests" / "live_server.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server or database a test starts."""
    return int(load_live_server().free_port())


def wait_answering(
    proc: subprocess.Popen[bytes], url: str, timeout: float, log_tail: Callable[[], str]
) -> None:
    """Until `url` answers 200 (raises with the log when the server exits or the time is up)."""
    load_live_server().wait_answering(proc, url, timeout, log_tail)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds."""
    load_live_server().stop_process(proc, timeout)
