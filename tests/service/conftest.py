"""Fixtures for the service tests: small models trained once per session, real `ovex serve` processes.

Servers are `python -m service.cli serve` subprocesses on a free loopback port (the embedded job worker
off, its data dir in tmp), so the tests talk HTTP to exactly what a user runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.live import free_port, stop_process, wait_answering

REPO = Path(__file__).resolve().parents[2]
API_KEY = "service-test-key"


def train_small(
    out: Path, *, labels: int = 200, features: int = 400, rows: int = 1000, seed: int = 1, dim: int = 16
) -> Path:
    """A small sparse-input model on synthetic data (a few seconds)."""
    from trainer.params import TrainParams
    from trainer.synth import synth_dataset
    from trainer.train import train

    ds = synth_dataset(labels, features, rows, seed=seed)
    params = TrainParams(
        dim=dim, epochs=1, negatives=64, batch_size=256, seed=seed, device="cpu", eval_every=0
    )
    train(params, ds, None, out_dir=out)
    return out


K0, HELD = 300, 10  # `train_with_texts`: trained labels (all with texts), labels held out to add by text
FEATURES = 2000


def train_with_texts(root: Path) -> Path:
    """Model `lt` under `root/models` (a few seconds): planted text rows over labels 0..K0+HELD-1, all
    with texts, the last HELD labels held out of training altogether; their names and texts are written
    to `root/held.json`, to add by text."""
    from trainer.data import read_dataset
    from trainer.label_texts import read_label_texts
    from trainer.params import TrainParams
    from trainer.synth import write_label_texts, write_synth
    from trainer.train import train

    rows, texts = root / "rows.jsonl", root / "texts.jsonl"
    write_synth(rows, K0 + HELD, FEATURES, 2500, seed=4, fmt="jsonl")
    held = {str(k) for k in range(K0, K0 + HELD)}
    kept = []
    for line in rows.read_text().splitlines():
        obj = json.loads(line)
        obj["labels"] = [n for n in obj["labels"] if n not in held]
        if obj["labels"]:
            kept.append(json.dumps(obj))
    rows.write_text("\n".join(kept) + "\n")
    write_label_texts(texts, K0 + HELD, FEATURES, seed=4)
    pairs = read_label_texts(texts)
    params = TrainParams(dim=32, epochs=3, negatives=64, batch_size=128, seed=4, device="cpu", eval_every=0)
    out = root / "models" / "lt" / "1"
    train(params, read_dataset(rows), None, out_dir=out, label_texts=pairs[:K0])
    (root / "held.json").write_text(json.dumps([{"name": n, "text": t} for n, t in pairs[K0:]]))
    return out


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Trained artifacts, copied into each server's models dir as needed: small/1, small/2 (other seed)."""
    root = tmp_path_factory.mktemp("trained")
    train_small(root / "small" / "1", seed=1)
    train_small(root / "small" / "2", seed=2)
    return root


@dataclass
class Server:
    base: str
    proc: subprocess.Popen[bytes]
    models_dir: Path
    log_path: Path

    def client(self, **kw: object) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=30, **kw)  # type: ignore[arg-type]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(
    models_dir: Path,
    workdir: Path,
    env_extra: dict[str, str] | None = None,
    wait_ready: bool = True,
    timeout: float = 120,
) -> Server:
    port = free_port()
    env = dict(os.environ)
    env.update(
        {
            "OVEX_EMBEDDED_WORKER": "false",
            "OVEX_DATA_DIR": str(workdir / "data"),
            "OVEX_API_KEY": API_KEY,
            "OVEX_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
    )
    env.update(env_extra or {})
    log_path = workdir / f"server-{port}.log"
    fh = open(log_path, "wb")  # noqa: SIM115 - handed to the child, closed when the fixture ends
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--models-dir", str(models_dir), "--port", str(port)],
        cwd=workdir,
        env=env,
        stdout=fh,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    fh.close()
    srv = Server(f"http://127.0.0.1:{port}", proc, models_dir, log_path)
    try:
        wait_answering(proc, srv.base + ("/readyz" if wait_ready else "/healthz"), timeout,
                       lambda: srv.log()[-3000:])
    except RuntimeError:
        stop_server(srv)
        raise
    return srv


def stop_server(srv: Server) -> None:
    stop_process(srv.proc)


def copy_version(
    store: Path,
    dest_models: Path,
    name: str,
    version: str,
    as_name: str | None = None,
    as_version: str | None = None,
) -> Path:
    dst = dest_models / (as_name or name) / (as_version or version)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(store / name / version, dst)
    return dst


@pytest.fixture(scope="session")
def server(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A read-only server: model `small` (version 1 active, the only one there)."""
    work = tmp_path_factory.mktemp("srv")
    models = work / "models"
    copy_version(model_store, models, "small", "1")
    srv = start_server(models, work)
    yield srv
    stop_server(srv)
