"""The client installs on its own: its wheel built from this checkout, installed into a fresh virtual
environment from local wheels only (no index), no torch, and it still talks to a real server (sync, async
and the `ovex-client` command)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from live_server import LiveServer

CLIENT_DIR = Path(__file__).resolve().parents[1]

SMOKE = textwrap.dedent(
    """
    import asyncio, importlib.util, sys
    import ovex_client
    from ovex_client import AsyncClient, Client, NotFound

    heavy = [m for m in ("torch", "faiss", "numpy", "scipy", "fastapi", "service", "trainer")
             if importlib.util.find_spec(m) is not None]
    assert not heavy, f"importable in the client venv: {heavy}"
    assert ovex_client.__file__.startswith(sys.prefix), ovex_client.__file__  # installed, not the checkout

    url, key = sys.argv[1], sys.argv[2]
    with Client(url, key) as c:
        answer = c.predict("a kitten purrs", model="demo", top_k=2)
        assert answer.predictions[0].labels[0].name == "cats", answer
        try:
            c.get_model("missing")
        except NotFound as e:
            assert e.status_code == 404
        else:
            raise AssertionError("no NotFound")

    async def main():
        async with AsyncClient(url, key) as c:
            answers = await asyncio.gather(*(c.predict("rocket orbit", model="demo") for _ in range(4)))
            assert {a.predictions[0].labels[0].name for a in answers} == {"space"}

    asyncio.run(main())
    print("client-venv-ok")
    """
)


def base_python() -> str:
    """The interpreter the main venv was made from, so the new venv shares nothing with it."""
    return getattr(sys, "_base_executable", None) or sys.executable


PIP = [sys.executable, "-m", "pip"]


def index_reachable() -> tuple[bool, str]:
    """Whether the index pip is configured with answers at all (any HTTP status counts), and its URL."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        got = subprocess.run([*PIP, "config", "get", "global.index-url"], capture_output=True, text=True)
        url = got.stdout.strip() if got.returncode == 0 else ""
    url = url or "https://pypi.org/simple/"
    try:
        httpx.get(url.rstrip("/") + "/httpx/", timeout=15)
    except httpx.TransportError:
        return False, url
    return True, url


def build_wheelhouse(wheels: Path) -> None:
    """The client's wheel from the checkout (built by this venv's setuptools, offline), then wheels of its
    dependencies from pip's cache, its find-links and indexes. Skips only where that fails and the index
    does not answer; any other failure fails the test."""
    built = subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(CLIENT_DIR)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    [client_wheel] = wheels.glob("ovex_client-*.whl")
    deps = subprocess.run(
        [*PIP, "wheel", "--wheel-dir", str(wheels), "--find-links", str(wheels), str(client_wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if deps.returncode != 0:
        reachable, url = index_reachable()
        last = (deps.stdout + deps.stderr).strip().splitlines()[-1:]
        if not reachable:
            pytest.skip(f"the package index {url} is unreachable and pip has no local wheels of the client's "
                        f"dependencies (httpx, pydantic): {' '.join(last)[:300]}")  # fmt: skip
        raise AssertionError(f"pip wheel of the client's dependencies failed:\n{deps.stderr[-3000:]}")


@pytest.mark.slow
@pytest.mark.timeout(900)  # building wheels, creating a venv and installing into it
def test_fresh_venv_install_without_torch(live: LiveServer, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build_wheelhouse(wheels)
    venv = tmp_path / "client-venv"
    subprocess.run([base_python(), "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    offline = ["--no-index", "--find-links", str(wheels)]  # from the wheels above only
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", *offline, "ovex-client"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]

    no_torch = subprocess.run([str(py), "-c", "import torch"], capture_output=True, text=True, env=env)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr

    smoke = subprocess.run(
        [str(py), "-c", SMOKE, live.url, live.api_key],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "client-venv-ok" in smoke.stdout

    cli = subprocess.run(
        [str(venv / "bin" / "ovex-client"), "predict", "guitar chord song", "--model", "demo", "--json"],
        capture_output=True, text=True, timeout=60, env={**env, "OVEX_URL": live.url}, cwd=tmp_path,
    )
    assert cli.returncode == 0, cli.stderr
    assert '"name": "music"' in cli.stdout
