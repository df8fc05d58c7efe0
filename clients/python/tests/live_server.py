"""A real ovex server on loopback for integration tests: `ovex serve` in a subprocess.

Used by the client's tests and by the README test; it needs the server stack (the main venv). Where only
the client is installed, say so with `OVEX_CLIENT_ONLY=1`: `server_available()` is then False and those
tests skip, saying why. Without the switch a server that does not import fails them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

API_KEY = "test-key-0123456789"


CLIENT_ONLY = "OVEX_CLIENT_ONLY"


def server_available() -> bool:
    """False only where told so (`OVEX_CLIENT_ONLY=1`). Elsewhere a `service` package that does not import
    or a missing `ovex` command is a broken install: it raises, so the live tests fail instead of skipping."""
    if os.environ.get(CLIENT_ONLY, "").strip().lower() in ("1", "true", "yes"):
        return False
    hint = f"set {CLIENT_ONLY}=1 to skip the live-server tests where only the client is installed"
    try:
        import service.app  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"the ovex server does not import ({e}); {hint}") from e
    if ovex_command() is None:
        raise RuntimeError(f"no ovex command next to {sys.executable} or on PATH; {hint}")
    return True


def ovex_command() -> list[str] | None:
    exe = Path(sys.executable).with_name("ovex")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ovex")
    return [found] if found else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_answering(
    proc: subprocess.Popen[bytes], url: str, timeout: float, log_tail: Callable[[], str]
) -> None:
    """Poll `url` until it answers 200; raise with the server's log when the process exits first or
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"ovex serve exited with {proc.returncode}:\n{log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"ovex serve: {url} did not answer 200 in {timeout:g} s:\n{log_tail()}")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, and SIGKILL when it has not exited `timeout` seconds later."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def run_ovex(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = ovex_command()
    assert cmd is not None, "the ovex command is not installed"
    proc = subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"ovex {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def make_dataset(
    path: Path, *, labels: int = 24, features: int = 300, rows: int = 400, seed: int = 1
) -> Path:
    """`ovex synth` in this process: the server stack is imported here already, another interpreter would
    import it again for a second."""
    from service.cli import main

    argv = ["synth", "--labels", str(labels), "--features", str(features), "--rows", str(rows), "--out",
            str(path), "--seed", str(seed)]
    if main(argv):
        raise RuntimeError(f"ovex {' '.join(argv)} failed")
    return path


TOPICS = {
    "cats": "cat kitten purr whiskers meow",
    "dogs": "dog puppy bark leash fetch",
    "space": "rocket orbit planet galaxy astronaut",
    "cooking": "recipe oven bake flour sugar",
    "music": "guitar melody chord drum song",
    "sports": "football goal match team score",
}


def make_text_dataset(path: Path, rows: int = 240, seed: int = 3) -> Path:
    """JSONL texts with planted topic words: each row mixes one or two topics' words plus filler."""
    import random

    rng = random.Random(seed)
    names = sorted(TOPICS)
    filler = ["the", "a", "of", "and", "to", "in", "on", "with", "this", "that"]
    with path.open("w") as fh:
        for _ in range(rows):
            labels = rng.sample(names, rng.choice([1, 1, 2]))
            words = [w for lab in labels for w in rng.sample(TOPICS[lab].split(), 3)]
            words += rng.sample(filler, 3)
            rng.shuffle(words)
            fh.write(json.dumps({"text": " ".join(words), "labels": labels}) + "\n")
    return path


def make_models(models_dir: Path, *, epochs: int = 3) -> None:
    """Two tiny models, trained by the real `ovex` CLI code in one process (torch is imported once):
    `demo` over texts (the topics above) and `sparse` over XC-format features (24 labels, 300 features)."""
    work = models_dir.parent
    work.mkdir(parents=True, exist_ok=True)
    texts = make_text_dataset(work / "demo-train.jsonl")
    sparse = work / "sparse-train.txt"
    demo, sparse_out = models_dir / "demo" / "1", models_dir / "sparse" / "1"
    runs = [
        ["synth", "--labels", "24", "--features", "300", "--rows", "400", "--out", str(sparse)],
        ["train", "--train", str(texts), "--out", str(demo), "--epochs", str(epochs), "--quiet"],
        ["train", "--train", str(sparse), "--out", str(sparse_out), "--epochs", "2", "--quiet"],
    ]
    script = (
        "import json, sys\nfrom service.cli import main\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    if main(argv):\n        sys.exit('ovex ' + ' '.join(argv) + ' failed')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(runs)], cwd=work,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"making the test models failed:\n{proc.stderr[-3000:]}")


@dataclass
class LiveServer:
    url: str
    api_key: str
    root: Path
    models_dir: Path
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def server_env(root: Path, api_key: str, port: int, default_model: str | None = "demo") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVEX_")}
    env.update({
        "OVEX_MODELS_DIR": str(root / "models"),
        "OVEX_DATA_DIR": str(root / "data"),
        "OVEX_API_KEY": api_key,
        "OVEX_HOST": "127.0.0.1",
        "OVEX_PORT": str(port),
        "OVEX_THREADS": "1",
        # jobs are claimed and their event streams see news within 0.1 s, not the default 0.25: the tests
        # run dozens of short jobs and wait on each (an idle server polls more often, still ~3% of a core)
        "OVEX_JOB_POLL_S": "0.1",
    })
    if default_model:  # tests add models named before it; /v1/predict stays on it
        env["OVEX_DEFAULT_MODEL"] = default_model
    return env


@contextlib.contextmanager
def live_server(
    root: Path,
    *,
    api_key: str = API_KEY,
    ready_timeout: float = 120.0,
    command: str = "serve",
    default_model: str | None = "demo",
) -> Iterator[LiveServer]:
    """Start `ovex serve` (or `ovex demo`) on a free loopback port over `root/models` and `root/data`;
    wait for /readyz."""
    cmd = ovex_command()
    assert cmd is not None
    port = free_port()
    models_dir, data_dir = root / "models", root / "data"
    models_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = root / "server.log"
    with log_path.open("wb") as log:
        argv = [*cmd, command, "--host", "127.0.0.1", "--port", str(port), "--models-dir", str(models_dir)]
        proc = subprocess.Popen(
            argv,
            cwd=root, env=server_env(root, api_key, port, default_model),
            stdout=log, stderr=subprocess.STDOUT,
        )
    server = LiveServer(f"http://127.0.0.1:{port}", api_key, root, models_dir, data_dir, proc, log_path)
    try:
        wait_answering(proc, f"{server.url}/readyz", ready_timeout, server.log_tail)
        yield server
    finally:
        stop_process(proc)
