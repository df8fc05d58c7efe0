"""Screenshots of every console page at 1400 px and 390 px wide, into docs/images/.

Starts a real `ovex serve` over a temporary folder (the test suite's two small models, a synthetic XC data
set uploaded through the API, one short training job with a test set), then opens each page in the same
headless Chromium the browser tests use (/usr/bin/chromium through /usr/bin/chromedriver).

    python scripts/screenshots.py [--out docs/images]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.console.conftest import CHROME_FLAGS, CHROMEDRIVER, CHROMIUM  # noqa: E402
from tests.live import load_live_server  # noqa: E402

WIDTHS = {"wide": (1400, 1000), "narrow": (390, 844)}
MAX_HEIGHT = 2600  # a page taller than this is cut: the pictures are for reading, not for scrolling


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    opts.add_argument("--hide-scrollbars")
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def wait(check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (v := check()):
                return v
        except Exception:  # not there yet
            pass
        time.sleep(0.2)
    raise RuntimeError("the console did not show what was expected in time")


def prepare(srv: Any) -> str:
    """Two data sets, a trained and activated model with a test set; returns the job's id."""
    keyed = {"X-API-Key": srv.api_key}
    ids = {}
    for name in ("train.txt", "test.txt"):
        with (srv.root / name).open("rb") as fh:
            r = httpx.post(f"{srv.url}/v1/datasets", headers=keyed, files={"file": (name, fh)},
                           data={"name": f"synth-{name}"}, timeout=60)
        r.raise_for_status()
        ids[name] = r.json()["id"]
    body = {"model": "synth", "train_dataset": ids["train.txt"], "test_dataset": ids["test.txt"],
            "params": {"epochs": 6, "dim": 32, "batch_size": 16}, "activate": True}
    job = httpx.post(f"{srv.url}/v1/jobs", headers=keyed, json=body, timeout=30)
    job.raise_for_status()
    job_id = str(job.json()["id"])
    wait(lambda: httpx.get(f"{srv.url}/v1/jobs/{job_id}", headers=keyed).json()["activated"], timeout=600)
    for text in ("rocket orbit planet", "guitar drum", "rocket"):
        httpx.post(f"{srv.url}/v1/models/demo/predict", json={"inputs": [{"text": text}]})
    return job_id


def shoot(driver: Any, srv: Any, job_id: str, out: Path) -> list[Path]:
    from selenium.webdriver.common.by import By

    css = lambda sel: driver.find_element(By.CSS_SELECTOR, sel)  # noqa: E731
    driver.get(srv.url + "/#home")
    driver.execute_script("sessionStorage.setItem('ovex.apiKey', arguments[0])", srv.api_key)
    made = []
    pages = {
        "home": ("#home", lambda: css("#home-traffic tr")),
        "models": ("#models", lambda: css("#model-synth")),
        "datasets": ("#datasets", lambda: css("#datasets-list tbody tr")),
        "job": (f"#jobs/{job_id}", lambda: css("#chart-pk polyline")),
        "predict": ("#predict", None),
    }
    for w, h in WIDTHS.values():
        for page, (hash_, ready) in pages.items():
            driver.set_window_size(w, h)
            driver.get(srv.url + "/" + hash_)
            driver.refresh()
            if ready:
                wait(ready)
            if page == "home":
                time.sleep(5.5)  # a second read of /metrics: requests per second
            if page == "predict":
                wait(lambda: css("#predict-model option"))
                css("#predict-text").send_keys("rocket orbit guitar")
                explain = css("#predict-explain")
                if explain.is_displayed():
                    explain.click()
                css("#predict-submit").click()
                wait(lambda: css("#answer-bars li"))
            time.sleep(0.6)
            height = h
            for _ in range(3):  # the window's frame takes some of its height: grow until the page fits
                missing = driver.execute_script(
                    "return document.documentElement.scrollHeight - window.innerHeight")
                if missing <= 0 or height >= MAX_HEIGHT:
                    break
                height = min(height + missing, MAX_HEIGHT)
                driver.set_window_size(w, height)
                time.sleep(0.4)
            driver.execute_script("window.scrollTo(0, 0)")
            time.sleep(0.2)
            path = out / f"console-{page}-{w}.png"
            driver.save_screenshot(str(path))
            made.append(path)
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    live = load_live_server()
    with tempfile.TemporaryDirectory(prefix="ovex-shots-") as tmp:
        root = Path(tmp)
        live.make_models(root / "models")
        live.run_ovex("synth", "--labels", "30", "--features", "300", "--rows", "2000", "--out", "train.txt",
                      "--test-out", "test.txt", "--test-rows", "300", "--seed", "5", cwd=root)
        with live.live_server(root, default_model="demo") as srv:
            job_id = prepare(srv)
            driver = browser()
            try:
                made = shoot(driver, srv, job_id, args.out)
            finally:
                driver.quit()
    for p in made:
        print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
