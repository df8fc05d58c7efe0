"""The web console clicked through in headless Chromium against a live `ovex serve`: keep the key, upload
a dataset, submit a job from the generated options form and watch its curves grow, cancel one, predict
(text, sparse, an input with no known word), activate another version; `/docs` renders from the server
alone. A screenshot of each page is saved under the test's temp dir."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.live import load_live_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EPOCHS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    live = load_live_server()
    if not live.server_available():
        pytest.skip("the ovex server stack is not installed")
    root = tmp_path_factory.mktemp("console")
    live.make_models(root / "models")
    # a second version of `sparse` (the highest serves first) so the console can switch back to 1
    shutil.copytree(root / "models" / "sparse" / "1", root / "models" / "sparse" / "2")
    live.run_ovex("synth", "--labels", "30", "--features", "300", "--rows", "2000", "--out", "train.txt",
                  "--test-out", "test.txt", "--test-rows", "300", "--seed", "5", cwd=root)
    with live.live_server(root, default_model="demo") as srv:
        yield srv


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # the element is not there yet
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


def css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def css_all(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def flash_text(driver: Any) -> str:
    return str(css(driver, "#flash").text)


def select_value(element: Any, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(element).select_by_value(value)


def series_count(driver: Any, chart: str, series: str) -> int:
    lines = css_all(driver, f"#{chart} polyline[data-series='{series}']")
    return int(lines[0].get_attribute("data-count")) if lines else 0


def open_page(driver: Any, url: str, page: str) -> None:
    driver.get(f"{url}/#{page}")
    wait_for(lambda: css(driver, f"#page-{page}").is_displayed(), what=f"the {page} page")


def keep_key(driver: Any, key: str) -> None:
    field = css(driver, "#api-key")
    field.clear()
    field.send_keys(key)
    css(driver, "#key-form button[type='submit']").click()
    wait_for(lambda: "kept" in flash_text(driver), what="the key confirmation")


def test_console_upload_train_predict_activate(browser: Any, server: Any, shots: Path) -> None:
    url = server.url
    open_page(browser, url, "models")
    assert css(browser, "#readiness").text != "server unreachable"
    keep_key(browser, server.api_key)
    assert browser.execute_script("return sessionStorage.getItem('ovex.apiKey')") == server.api_key

    # ---- datasets: upload with progress, the stats of what was stored
    open_page(browser, url, "datasets")
    for name in ("train.txt", "test.txt"):
        css(browser, "#upload-file").send_keys(str(server.root / name))
        css(browser, "#upload-name").clear()
        css(browser, "#upload-name").send_keys(f"synth-{name}")
        css(browser, "#upload-submit").click()
        wait_for(lambda n=name: f"synth-{n}" in css(browser, "#upload-stats").text, what=f"{name} stats")
    stats = css(browser, "#upload-stats").text
    assert "300" in stats and "xc" in stats  # the test set: 300 rows, XC format
    assert css(browser, "#upload-progress").get_attribute("value") == "100"
    listed = httpx.get(f"{url}/v1/datasets").json()["datasets"]
    assert {d["name"] for d in listed} == {"synth-train.txt", "synth-test.txt"}
    assert len(css_all(browser, "#datasets-list tbody tr")) == 2
    browser.save_screenshot(str(shots / "datasets.png"))
    by_name = {d["name"]: d["id"] for d in listed}

    # ---- jobs: the options form comes from the OpenAPI schema of TrainParams
    open_page(browser, url, "jobs")
    wait_for(lambda: css(browser, "#param-epochs"), what="the generated params form")
    loss_options = [o.get_attribute("value") for o in css_all(browser, "#param-loss option")]
    assert {"ove", "softmax", "sparsemax"} <= set(loss_options)
    spec = httpx.get(f"{url}/openapi.json").json()
    ref = spec["components"]["schemas"]["JobCreate"]["properties"]["params"]["$ref"]
    params_schema = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert len(css_all(browser, "#job-params-fields .field")) == len(params_schema["properties"])
    css(browser, "#job-model").send_keys("console-model")
    wait_for(lambda: len(css_all(browser, "#job-train option")) == 3, what="the dataset choices")
    select_value(css(browser, "#job-train"), by_name["synth-train.txt"])
    select_value(css(browser, "#job-test"), by_name["synth-test.txt"])
    for field, value in (("epochs", str(EPOCHS)), ("batch_size", "8"), ("dim", "32")):
        css(browser, f"#param-{field}").send_keys(value)
    select_value(css(browser, "#param-loss"), "ove")
    css(browser, "#job-submit").click()
    wait_for(lambda: css(browser, "#job-detail").is_displayed(), what="the job panel")

    # the loss curve grows while the job runs, one P@k point per epoch
    first = wait_for(lambda: series_count(browser, "chart-loss", "loss"), timeout=180, what="a loss point")
    grows = lambda: series_count(browser, "chart-loss", "loss") > first  # noqa: E731
    wait_for(grows, timeout=180, what="the curve to grow")
    wait_for(lambda: css(browser, "#job-state").text == "succeeded", timeout=300, what="the job to succeed")
    assert series_count(browser, "chart-pk", "p@1") == EPOCHS
    assert series_count(browser, "chart-loss", "loss") > first
    job = httpx.get(f"{url}/v1/jobs").json()["jobs"][0]
    assert job["state"] == "succeeded" and job["params"]["epochs"] == EPOCHS and job["params"]["dim"] == 32
    assert "version 1" in css(browser, "#job-summary").text
    css(browser, "#job-logs-box summary").click()
    wait_for(lambda: "state: succeeded" in css(browser, "#job-logs").text, what="the job log")
    browser.save_screenshot(str(shots / "jobs.png"))

    # a long job, cancelled from its panel
    css(browser, "#job-model").clear()
    css(browser, "#job-model").send_keys("console-slow")
    css(browser, "#param-epochs").clear()
    css(browser, "#param-epochs").send_keys("500")
    css(browser, "#job-submit").click()
    wait_for(lambda: "console-slow" in css(browser, "#job-detail-title").text, what="the slow job's panel")
    css(browser, "#job-cancel").click()
    wait_for(lambda: css(browser, "#job-state").text == "cancelled", timeout=120, what="the cancel")

    # out-of-range options are stopped by the form (bounds from the schema), the rest by the server
    css(browser, "#param-epochs").clear()
    css(browser, "#param-epochs").send_keys("0")
    assert browser.execute_script("return document.querySelector('#param-epochs').validity.valid") is False
    css(browser, "#param-epochs").clear()
    css(browser, "#param-epochs").send_keys("2")
    select_value(css(browser, "#param-sampler"), "unigram")
    css(browser, "#job-submit").click()
    wait_for(lambda: "needs sampler 'uniform'" in flash_text(browser), what="the 422 message")
    assert "body.params" in flash_text(browser)

    # ---- predict: text, the sparse distribution as bars, exact flag, the version that answered
    open_page(browser, url, "predict")
    wait_for(lambda: len(css_all(browser, "#predict-model option")) >= 3, what="the model choices")
    select_value(css(browser, "#predict-model"), "demo")
    assert not css(browser, "#predict-features").is_displayed()  # text input is the default
    css(browser, "#predict-text").send_keys("rocket orbit planet galaxy")
    css(browser, "#predict-submit").click()
    wait_for(lambda: css_all(browser, "#answer-bars li"), what="the answer bars")
    bars = css_all(browser, "#answer-bars li")
    assert "space" in bars[0].text
    answer = httpx.post(f"{url}/v1/models/demo/predict",
                        json={"inputs": [{"text": "rocket orbit planet galaxy"}], "top_k": 10}).json()
    assert len(bars) == len(answer["predictions"][0]["labels"])
    assert css(browser, "#answer-version").text == answer["version"]
    assert ("exact" in css(browser, "#answer-exact").text) is answer["predictions"][0]["exact"]
    widths = [float(b.get_attribute("style").split("width:")[1].rstrip("%;")) for b in
              css_all(browser, "#answer-bars .bar")]
    assert widths == sorted(widths, reverse=True) and abs(sum(widths) - 100) < 1.0  # sparsemax sums to 1
    assert not css_all(browser, "#answer-unknown")
    browser.save_screenshot(str(shots / "predict.png"))

    css(browser, "#predict-text").clear()
    css(browser, "#predict-text").send_keys("hello world")
    css(browser, "#predict-submit").click()
    wait_for(lambda: css(browser, "#answer-unknown").is_displayed(), what="the no-known-feature note")

    select_value(css(browser, "#predict-model"), "console-model")
    css(browser, "input[name='kind'][value='features']").click()
    css(browser, "#predict-features").send_keys("3:1 17:1 42:1")
    css(browser, "#predict-submit").click()
    wait_for(lambda: css(browser, "#answer-model").text == "console-model", what="the sparse answer")
    assert css_all(browser, "#answer-bars li")

    # ---- models: versions with metrics; activate sparse v1 over v2
    open_page(browser, url, "models")
    wait_for(lambda: css(browser, "#model-console-model"), what="the new model")
    assert httpx.get(f"{url}/v1/models/sparse").json()["active_version"] == "2"
    button = wait_for(lambda: css(browser, "button[aria-label='Activate sparse version 1']"), what="activate")
    browser.save_screenshot(str(shots / "models.png"))
    button.click()
    wait_for(lambda: "version 1 is active" in flash_text(browser), timeout=60, what="the activation")
    assert httpx.get(f"{url}/v1/models/sparse").json()["active_version"] == "1"
    row = css(browser, "#model-sparse").find_element("xpath", "ancestor::article")
    assert "active" in row.find_element("css selector", "tr[data-version='1']").text
    # script errors only: the refused job above is a 422 on purpose
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and e["source"] != "network"]
    assert errors == [], errors


def _upload(server: Any, path: Path, name: str) -> str:
    with path.open("rb") as fh:
        r = httpx.post(f"{server.url}/v1/datasets", headers={"X-API-Key": server.api_key},
                       files={"file": (path.name, fh)}, data={"name": name}, timeout=60)
    assert r.status_code in (200, 201), r.text
    return str(r.json()["id"])


def _wait_job(server: Any, job_id: str) -> dict[str, Any]:
    job = wait_for(lambda: (j := httpx.get(f"{server.url}/v1/jobs/{job_id}").json())["state"]
                   in ("succeeded", "failed", "cancelled") and j, timeout=300, what=f"job {job_id}")
    assert job["state"] == "succeeded", job
    return dict(job)


def _tree_digest(path: Path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def test_console_grows_a_model_with_new_labels(browser: Any, server: Any, shots: Path) -> None:
    """From the models page: Grow on a version opens the job form set to continue it; the job trains the
    next version on data with new labels, its panel shows what it continues and P@k on rows with and
    without a new label, and the version it grew from is left as it was."""
    # the base: the synthetic training rows whose labels are all among the first 24 of 30
    lines = (server.root / "train.txt").read_text().splitlines()
    n_rows, n_features, _ = lines[0].split()
    labels_of = [ln.split(" ", 1)[0] for ln in lines[1:]]
    kept = [ln for ln, ls in zip(lines[1:], labels_of, strict=True)
            if ls and all(int(v) < 24 for v in ls.split(","))]
    assert 0 < len(kept) < int(n_rows)
    (server.root / "base.txt").write_text(f"{len(kept)} {n_features} 24\n" + "\n".join(kept) + "\n")
    base_ds = _upload(server, server.root / "base.txt", "grow-base.txt")
    full_ds = _upload(server, server.root / "train.txt", "grow-train.txt")
    test_ds = _upload(server, server.root / "test.txt", "grow-test.txt")
    r = httpx.post(f"{server.url}/v1/jobs", headers={"X-API-Key": server.api_key}, timeout=30, json={
        "model": "console-grow", "train_dataset": base_ds, "activate": True,
        "params": {"epochs": 3, "dim": 32, "batch_size": 16}})
    assert r.status_code == 202, r.text
    _wait_job(server, r.json()["id"])
    v1 = server.root / "models" / "console-grow" / "1"
    before = _tree_digest(v1)
    v1_labels = (v1 / "labels.txt").read_text().splitlines()

    open_page(browser, server.url, "models")
    browser.refresh()  # a fresh page: not the forms an earlier test filled, nor a list from before the model
    wait_for(lambda: css(browser, "#page-models").is_displayed(), what="the models page")
    keep_key(browser, server.api_key)
    wait_for(lambda: css(browser, "button[aria-label='Grow console-grow version 1 with new data']"),
             what="the grow button").click()
    wait_for(lambda: css(browser, "#page-jobs").is_displayed(), what="the jobs page")
    assert css(browser, "#job-model").get_attribute("value") == "console-grow"
    assert css(browser, "#job-continue").is_selected() and css(browser, "#job-base-fields").is_displayed()
    wait_for(lambda: css(browser, "#job-base-version").get_attribute("value") == "1", what="version 1 chosen")
    wait_for(lambda: len(css_all(browser, "#job-replay option")) >= 4, what="the replay choices")
    select_value(css(browser, "#job-train"), full_ds)
    select_value(css(browser, "#job-test"), test_ds)
    browser.execute_script("document.querySelector('#job-base').scrollIntoView()")
    browser.save_screenshot(str(shots / "grow-form.png"))
    css(browser, "#job-submit").click()
    wait_for(lambda: "console-grow" in css(browser, "#job-detail-title").text, what="the job panel")
    assert "continues console-grow version 1" in css(browser, "#job-summary").text
    wait_for(lambda: css(browser, "#job-state").text == "succeeded", timeout=300, what="the job to succeed")
    wait_for(lambda: "version 2" in css(browser, "#job-summary").text, what="the version it made")
    parts = wait_for(lambda: [r.get_attribute("data-part") for r in css_all(browser, "#job-metrics tbody tr")]
                     == ["all", "new", "old"], what="P@k split by new and old labels")
    assert parts
    job = httpx.get(f"{server.url}/v1/jobs?limit=1").json()["jobs"][0]
    assert job["base"]["model"] == "console-grow" and job["base"]["version"] == "1"
    assert job["model_version"] == "2" and job["params"]["epochs"] == job["params"]["continual_epochs"]
    metrics = job["progress"]["metrics"]
    for part in ("new", "old"):
        row = [c.text for c in css_all(browser, f"#job-metrics tr[data-part='{part}'] td")]
        assert row[1] == f"{int(metrics[f'{part}.rows'])}" and row[2] == f"{metrics[f'{part}.p@1']:.4f}", row
    assert css_all(browser, "#job-metrics tr[data-part='all'] td")[1].text == "300"  # the test set's rows
    browser.execute_script("document.querySelector('#job-detail').scrollIntoView()")
    browser.save_screenshot(str(shots / "grow-job.png"))
    # version 1 untouched; version 2 keeps its labels' ids and adds the 6 new ones after them
    assert _tree_digest(v1) == before
    info = httpx.get(f"{server.url}/v1/models/console-grow").json()
    assert [v["version"] for v in info["versions"]] == ["1", "2"]
    v2_labels = (server.root / "models" / "console-grow" / "2" / "labels.txt").read_text().splitlines()
    assert v2_labels[:24] == v1_labels and len(v2_labels) == 30

    # continuing a model that has no stored version: the form says so, the server refuses with a reason
    css(browser, "#job-model").clear()
    css(browser, "#job-model").send_keys("no-such-model")
    css(browser, "#job-train").click()  # the name field loses focus: its versions are looked up
    wait_for(lambda: "no stored version" in css(browser, "#job-base-version").text, what="the empty choice")
    css(browser, "#job-submit").click()
    wait_for(lambda: "no-such-model" in flash_text(browser), what="the refusal")


def test_console_refuses_mutations_without_the_key(browser: Any, server: Any) -> None:
    open_page(browser, server.url, "models")
    css(browser, "#key-forget").click()
    wait_for(lambda: "cleared" in flash_text(browser), what="the key to be cleared")
    wait_for(lambda: css(browser, "button[aria-label^='Activate ']"), what="an activate button").click()
    wait_for(lambda: "missing API key" in flash_text(browser), what="the 401 message")
    assert "Enter the server's API key" in flash_text(browser)


def test_console_is_labelled_keyboard_usable_and_fits_a_phone(browser: Any, server: Any, shots: Path) -> None:
    from selenium.webdriver.common.keys import Keys

    for page in ("models", "datasets", "jobs", "predict"):
        open_page(browser, server.url, page)
        if page == "jobs":
            wait_for(lambda: css(browser, "#param-epochs"), what="the params form")
        unlabelled = browser.execute_script(
            "return [...document.querySelectorAll('input, select, textarea')]"
            ".filter(e => e.offsetParent !== null && e.labels.length === 0 && !e.getAttribute('aria-label'))"
            ".map(e => e.id || e.name)")
        assert unlabelled == [], f"{page}: controls without a label: {unlabelled}"
    # keyboard: tab from the top reaches the nav links; Enter on one opens its page
    open_page(browser, server.url, "models")
    browser.refresh()  # focus at the top of a fresh page, not where an earlier test left it
    wait_for(lambda: css(browser, "#page-models").is_displayed(), what="the models page")
    body = css(browser, "body")
    for _ in range(12):
        body = browser.switch_to.active_element
        if body.get_attribute("data-page") == "predict":
            break
        body.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.get_attribute("data-page") == "predict"
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    wait_for(lambda: css(browser, "#page-predict").is_displayed(), what="predict by keyboard")

    browser.set_window_size(390, 844)
    try:
        for page in ("models", "datasets", "jobs", "predict"):
            open_page(browser, server.url, page)
            time.sleep(0.3)
            overflow = browser.execute_script(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 0, f"{page} scrolls sideways by {overflow}px on a 390px screen"
            browser.save_screenshot(str(shots / f"narrow-{page}.png"))
    finally:
        browser.set_window_size(1280, 1000)


def test_api_docs_render_without_the_internet(browser: Any, server: Any, shots: Path) -> None:
    for path, ready in (("/docs", ".opblock"),):
        browser.get(server.url + path)
        wait_for(lambda r=ready: css_all(browser, r), timeout=60, what=f"{path} to render")
        resources = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        outside = [r for r in resources if not r.startswith(server.url)]
        assert outside == [], f"{path} loads from outside the server: {outside}"
        browser.save_screenshot(str(shots / f"{path.strip('/')}.png"))
    html = httpx.get(server.url + "/docs").text
    assert "http://" not in html.replace(server.url, "") and "https://" not in html
    assert json.loads(httpx.get(server.url + "/openapi.json").text)["paths"]


def test_answers_say_how_many_input_features_the_model_knows(server: Any) -> None:
    """The field behind the console's "no known feature" note, checked against the featurizer itself."""
    from trainer.artifact import load_artifact

    model = load_artifact(server.models_dir / "demo" / "1")
    texts = ["rocket orbit planet", "hello world", "rocket rocket zebra", "guitar HELLO"]
    expected = np.diff(model.featurizer.transform_texts(texts).indptr).tolist()
    assert expected == [5, 0, 1, 1]  # three words of the demo's vocabulary and their two pairs
    r = httpx.post(f"{server.url}/v1/predict", json={"inputs": [{"text": t} for t in texts]})
    assert r.status_code == 200, r.text
    assert [p["known_features"] for p in r.json()["predictions"]] == expected
    sparse = {"inputs": [{"features": {"indices": [1, 2, 3], "values": [1.0, 0.0, 2.0]}},
                         {"features": {"indices": [5], "values": [0.0]}}]}
    r = httpx.post(f"{server.url}/v1/models/sparse/predict", json=sparse)
    assert [p["known_features"] for p in r.json()["predictions"]] == [2, 0]
    schema = httpx.get(f"{server.url}/openapi.json").json()["components"]["schemas"]["PredictionOut"]
    assert "nothing was recognised" in schema["properties"]["known_features"]["description"]


def test_console_pages_the_older_versions_of_a_model(browser: Any, server: Any) -> None:
    """A model with more versions than the listing shows: the card says how many there are, and "Show older
    versions" fetches the rest a page at a time, above the newest, each with its buttons."""
    import os

    many = 25
    for v in range(1, many + 1):
        shutil.copytree(server.root / "models" / "sparse" / "1", server.root / "models" / "crowded" / str(v),
                        copy_function=os.link)
    wait_for(lambda: httpx.get(f"{server.url}/v1/models/crowded").json()["active_version"] == str(many),
             timeout=60, what="the crowded model to load")
    open_page(browser, server.url, "models")
    card = wait_for(lambda: css(browser, "#model-crowded"), what="the crowded model").find_element(
        "xpath", "ancestor::article")
    shown = [r.get_attribute("data-version") for r in card.find_elements("css selector", "tbody tr")]
    assert shown == [str(v) for v in range(many - 19, many + 1)]  # the newest 20, oldest first
    assert f"newest 20 of {many} versions" in card.text
    older = "button[aria-label='Show older versions of crowded']"
    card.find_element("css selector", older).click()
    wait_for(lambda: len(card.find_elements("css selector", "tbody tr")) == many, what="the older versions")
    shown = [r.get_attribute("data-version") for r in card.find_elements("css selector", "tbody tr")]
    assert shown == [str(v) for v in range(1, many + 1)]
    assert f"all {many} versions" in card.text
    assert not card.find_element("css selector", older).is_displayed()
    assert card.find_element("css selector", "button[aria-label='Activate crowded version 1']")
