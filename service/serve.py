"""`ovex serve` and `ovex demo`: run the HTTP service (demo: after training a small model once).

Thin: parse flags into `Settings` (flags override `OVEX_*` variables), set up logs, hand the app to uvicorn.
One serving process: the app runs in this process. `--workers N`: a supervisor imports the serving code once
and forks N serving processes that share the listening socket and those imports; each builds its app from the
settings handed over here and loads the models itself (weights memory-mapped, so N serving processes hold one
copy; indexes never built before a fork).
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from service.logs import configure_logging, uvicorn_log_config
from service.settings import RETRIEVAL_KINDS, SETTINGS_ENV, Settings
from trainer.errors import OvexError, ParamsError

if TYPE_CHECKING:
    import scipy.sparse as sp

log = logging.getLogger("ovex.serve")


def _add_server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models-dir", type=Path, default=None, help="artifacts at DIR/<name>/<version>/")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="TCP port (default 8000)")
    p.add_argument("--api-key", default=None, help="key for mutating endpoints (or OVEX_API_KEY)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch/faiss threads, split between serving processes")
    p.add_argument("--workers", type=int, default=None, help="serving processes on one port (default 1)")
    p.add_argument("--retrieval", choices=RETRIEVAL_KINDS, default=None)
    p.add_argument("--log-level", default=None)


def settings_from_args(args: argparse.Namespace, **extra: Any) -> Settings:
    """Flags given on the command line override the environment; the rest comes from `OVEX_*`."""
    flags = {
        "models_dir": args.models_dir,
        "host": args.host,
        "port": args.port,
        "api_key": args.api_key,
        "threads": args.threads,
        "workers": args.workers,
        "retrieval": args.retrieval,
        "log_level": args.log_level,
    }
    overrides = {k: v for k, v in flags.items() if v is not None}
    overrides.update(extra)
    try:
        return Settings(**overrides)
    except ValidationError as exc:  # a bad flag or OVEX_* value: say which, no traceback
        problems = []
        for e in exc.errors():
            field = str(e["loc"][0]) if e["loc"] else "?"
            where = f"--{field.replace('_', '-')}" if field in overrides else f"OVEX_{field.upper()}"
            problems.append(f"{where}: {e['msg']}")
        raise ParamsError("; ".join(problems)) from None


_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def serving_process_settings(settings: Settings) -> Settings:
    """What each of N serving processes runs with: its share of the threads (N processes never
    oversubscribe the cores `threads` allows), and no job worker of its own (the parent runs one for all)."""
    share = max(1, settings.threads // settings.workers)
    lone = max(1, settings.lone_scan_threads // settings.workers)
    return settings.model_copy(update={"threads": share, "lone_scan_threads": lone, "embedded_worker": False})


def _uvicorn_options(settings: Settings) -> dict[str, Any]:
    from service.http_protocol import with_header_timeout

    return {
        "host": settings.host,
        "port": settings.port,
        "log_config": uvicorn_log_config(),
        "access_log": settings.access_log,
        "log_level": settings.log_level.lower(),
        # open SSE streams (/v1/jobs/{id}/events) would otherwise hold shutdown until their job ends
        "timeout_graceful_shutdown": 5,
        "http": with_header_timeout(settings.header_timeout_s, settings.max_header_bytes),
    }


def run_server(settings: Settings) -> int:
    import uvicorn

    configure_logging(settings.log_level, settings.log_json)
    if settings.workers > 1:
        return run_serving_processes(settings)
    from service.app import create_app  # torch, faiss: only in processes that serve

    uvicorn.run(create_app(settings), **_uvicorn_options(settings))
    return 0


def run_serving_processes(settings: Settings) -> int:
    """N forked serving processes on one port (see `service.prefork`) and one job worker for them all."""
    import uvicorn

    from service.prefork import Supervisor, preload

    metrics_dir = Path(tempfile.mkdtemp(prefix="ovex-metrics-"))
    # prometheus_client reads this when first imported (below): every serving process then writes its
    # values there
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    child = serving_process_settings(settings)
    # each serving process pins its own torch/faiss/BLAS threads; the variables reach the job worker too
    os.environ[SETTINGS_ENV] = child.to_child_json()
    os.environ.update({name: str(child.threads) for name in _THREAD_ENV})
    preload()
    from service.training.runtime import EmbeddedWorker

    config = uvicorn.Config("service.app:app_from_env", factory=True, **_uvicorn_options(child))
    sock = config.bind_socket()
    jobs = EmbeddedWorker(settings) if settings.embedded_worker else None
    log.info("starting serving processes",
             extra={"processes": settings.workers, "threads_each": child.threads})
    try:
        # an event loop silent for twice the longest a request may wait is hung, not busy
        hang_s = max(5.0, 2 * settings.request_timeout_s)
        return Supervisor(config, sock, settings.workers, jobs, metrics_dir, hang_s).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    check_port_free(settings.host, settings.port, "ovex serve --port {port}")
    return run_server(settings)


# --------------------------------------------------------------------------------------------------
# demo

_CONS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"


def pseudo_words(n: int, seed: int) -> list[str]:
    """n distinct pronounceable words (consonant-vowel syllables), deterministic in the seed."""
    import numpy as np  # here, not at the top: the supervisor of N serving processes stays small

    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        syl = int(rng.integers(2, 4))
        w = "".join(
            _CONS[int(rng.integers(len(_CONS)))] + _VOWELS[int(rng.integers(len(_VOWELS)))]
            for _ in range(syl)
        )
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def rows_to_texts(x: sp.csr_matrix, vocab: list[str]) -> list[str]:
    """Bag-of-words counts → text (each feature's word repeated by its count)."""
    texts = []
    for r in range(x.shape[0]):
        s, e = x.indptr[r], x.indptr[r + 1]
        words = [
            " ".join([vocab[int(j)]] * max(1, round(float(v))))
            for j, v in zip(x.indices[s:e], x.data[s:e], strict=True)
        ]
        texts.append(" ".join(words))
    return texts


DEMO = {"labels": 2000, "features": 3000, "rows": 4000, "seed": 7}


def _demo_vocab(labels: int, features: int, seed: int) -> tuple[list[str], list[str]]:
    """The demo's words (feature j is `vocab[j]`) and label names, both deterministic in the seed."""
    vocab = pseudo_words(features, seed)
    topic_words = pseudo_words(2 * labels + features, seed + 1)[features:]
    return vocab, [f"{topic_words[2 * i]} {topic_words[2 * i + 1]}" for i in range(labels)]


def build_demo_model(
    models_dir: Path,
    labels: int = DEMO["labels"],
    features: int = DEMO["features"],
    rows: int = DEMO["rows"],
    seed: int = DEMO["seed"],
) -> Path:
    """Synthetic text data with readable label names → a trained model at models_dir/demo/1."""
    from trainer.data import Dataset
    from trainer.params import TrainParams
    from trainer.synth import synth
    from trainer.train import train

    vocab, names = _demo_vocab(labels, features, seed)
    x, y = synth(labels, features, rows, seed)
    xt, yt = synth(labels, features, max(500, rows // 10), seed, part=1)
    train_ds = Dataset(
        Y=y,
        n_features=0,
        n_labels=labels,
        texts=rows_to_texts(x, vocab),
        label_names=names,
        path="<demo train>",
    )
    test_ds = Dataset(
        Y=yt, n_features=0, n_labels=labels, texts=rows_to_texts(xt, vocab), label_names=names,
        path="<demo test>",
    )
    # the demo's words are drawn independently, so word pairs carry nothing: words alone, in the groups the
    # demo was set up with (the README shows this model's answers)
    params = TrainParams(
        dim=64, epochs=3, negatives=256, batch_size=128, lr=0.02, seed=seed, device="cpu", min_df=1,
        ngrams=1, group_size=128,
    )
    out = models_dir / "demo" / "1"
    train(params, train_ds, test_ds, out_dir=out)
    return out


def demo_sample(artifact: Path, labels: int = DEMO["labels"], features: int = DEMO["features"],
                rows: int = DEMO["rows"], seed: int = DEMO["seed"]) -> str:
    """A four-word input whose sparsemax answer has two or three labels: two words from the planted
    prototypes of each of two frequent labels. Candidates are tried in a fixed order against the model."""
    import numpy as np

    from trainer.artifact import load_artifact
    from trainer.sparse_maps import sparsemax
    from trainer.synth import planted_prototypes, synth

    vocab, _ = _demo_vocab(labels, features, seed)
    protos = planted_prototypes(labels, features, seed)
    _, y = synth(labels, features, rows, seed)
    top = np.argsort(-np.asarray(y.sum(axis=0)).ravel(), kind="stable")[:5]
    candidates = [
        " ".join(vocab[int(j)] for lab in (a, b) for j in protos[int(lab)].indices[:2])
        for i, a in enumerate(top)
        for b in top[i + 1 :]
    ]
    model = load_artifact(artifact)
    for text in candidates:
        h = model.encode(model.featurizer.transform_texts([text]))
        scores = (h @ model.head_weight.T + model.head_bias)[0]
        if 2 <= int((sparsemax(scores) > 0).sum()) <= 3:
            return text
    return candidates[0]


API_KEY_FILE = "api_key"


def persistent_api_key(data_dir: Path) -> tuple[str, Path]:
    """The key kept in `<data_dir>/api_key` (mode 0600), created on first use: a restart keeps it."""
    path = data_dir / API_KEY_FILE
    if path.exists():
        key = path.read_text().strip()
        if key:
            path.chmod(0o600)
            return key, path
    data_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(18)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    path.chmod(0o600)
    return key, path


def check_port_free(host: str, port: int, fix: str) -> None:
    """Fail fast, before any work, with one line that says how to pick another port."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OvexError(
                    f"port {port} on {host} is already in use; start on another one: "
                    + fix.format(port=port + 1)
                ) from None
            raise OvexError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def cmd_demo(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    check_port_free(settings.host, settings.port, "make run PORT={port} (or: ovex demo --port {port})")
    key_line = "from OVEX_API_KEY"
    if settings.api_key is None:
        key, key_path = persistent_api_key(Path(settings.data_dir))
        settings = settings_from_args(args, api_key=key)
        key_line = f"{key}\n    kept in {key_path} (mode 0600): export OVEX_API_KEY=$(cat {key_path})"
    configure_logging(settings.log_level, settings.log_json)
    demo_dir = Path(settings.models_dir) / "demo"
    versions = sorted(
        (p for p in demo_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    ) if demo_dir.is_dir() else []
    if not versions:
        t0 = time.perf_counter()
        print("ovex demo: generating synthetic data and training a 2,000-label model …", flush=True)
        versions = [build_demo_model(Path(settings.models_dir))]
        print(f"ovex demo: trained in {time.perf_counter() - t0:.1f}s → {versions[0]}", flush=True)
    try:
        sample = demo_sample(versions[0])
    except OvexError:  # a demo model that cannot be read is reported by the registry once serving
        from service.api.schemas import DEMO_TEXT

        sample = DEMO_TEXT
    base = f"http://{settings.host}:{settings.port}"
    body = json.dumps({"inputs": [{"text": sample}], "top_k": 5})
    print(
        f"ovex demo: serving {settings.models_dir} on {base}\n"
        f"  console: {base}/    API docs: {base}/docs\n"
        f"  API key (uploads, jobs, activation): {key_line}\n"
        f"  try: curl -s {base}/v1/predict -H 'content-type: application/json' -d '{body}'",
        flush=True,
    )
    return run_server(settings)


def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="serve every model under --models-dir over HTTP")
    _add_server_flags(p)
    p.set_defaults(func=cmd_serve)
    p = subparsers.add_parser("demo", help="train a small demo model once (synthetic data), then serve it")
    _add_server_flags(p)
    p.set_defaults(func=cmd_demo)
