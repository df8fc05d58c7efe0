"""The web console clicked through in headless Chromium against a live `ovex serve`: keep the key, upload
a dataset, submit a job from the generated options form and watch its curves grow, cancel one, predict
(text, sparse, an input with no known word), activate another version; `/docs` renders from the server
alone. A screenshot of each page is saved under the test's temp dir."""

from __future__ import annotations

import json
import os
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
    from service.cli import main  # `ovex synth` in this process: not seconds of another's imports

    assert main(["synth", "--labels", "30", "--features", "300", "--rows", "2000", "--out",
                 str(root / "train.txt"), "--test-out", str(root / "test.txt"), "--test-rows", "300",
                 "--seed", "5"]) == 0
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
    """Open `#page` or an item's address (`#jobs/<id>`, `#models/<name>/<version>`) and wait for its page."""
    driver.get(f"{url}/#{page}")
    name = page.split("/")[0]
    wait_for(lambda: css(driver, f"#page-{name}").is_displayed(), what=f"the {page} page")


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
    shown = css_all(browser, "#job-params-fields .field") + css_all(browser, "#job-primary-fields .field")
    assert len(shown) == len(params_schema["properties"])
    # a beginner sees the few options a first job needs; the rest wait under "Advanced options"
    assert css(browser, "#param-epochs").is_displayed() and not css(browser, "#param-dim").is_displayed()
    css(browser, "#job-params summary").click()
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
    def loss_points() -> int:  # the steps' moving average and each ended epoch's mean
        return series_count(browser, "chart-loss", "loss") + series_count(browser, "chart-loss", "epoch mean")

    first = wait_for(loss_points, timeout=180, what="a loss point")
    grows = lambda: loss_points() > first  # noqa: E731
    wait_for(grows, timeout=180, what="the curve to grow")
    wait_for(lambda: css(browser, "#job-state").text == "succeeded", timeout=300, what="the job to succeed")
    assert series_count(browser, "chart-pk", "p@1") == EPOCHS
    assert loss_points() > first
    assert series_count(browser, "chart-loss", "epoch mean") == EPOCHS
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
    wait_for(lambda: "needs sampler 'uniform'" in css(browser, "#job-form").text, what="the 422 message")

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
    wait_for(lambda: "no-such-model" in css(browser, "#job-form").text, what="the refusal")


def test_console_refuses_mutations_without_the_key(browser: Any, server: Any) -> None:
    open_page(browser, server.url, "models")
    css(browser, "#key-forget").click()
    wait_for(lambda: "cleared" in flash_text(browser), what="the key to be cleared")
    button = wait_for(lambda: css(browser, "button[aria-label^='Activate ']"), what="an activate button")
    button.click()
    cell = button.find_element("xpath", "ancestor::td")
    wait_for(lambda: "missing API key" in cell.text, what="the 401 message beside the button")
    assert "Enter the server's API key" in cell.text


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
    # three words of the demo's vocabulary, their two pairs, and each text's leading words again, marked
    assert expected == [8, 0, 2, 2]
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


# ------------------------------------------------------------------------------ the first hour


def _job(server: Any, body: dict[str, Any]) -> str:
    r = httpx.post(f"{server.url}/v1/jobs", headers={"X-API-Key": server.api_key}, json=body, timeout=30)
    assert r.status_code in (200, 201, 202), r.text
    return str(r.json()["id"])


def _ended(server: Any, job_id: str, timeout: float = 300) -> dict[str, Any]:
    def done() -> Any:
        j = httpx.get(f"{server.url}/v1/jobs/{job_id}", headers={"X-API-Key": server.api_key}).json()
        return j if j["state"] in ("succeeded", "failed", "cancelled") else None
    job: dict[str, Any] = wait_for(done, timeout=timeout, what=f"job {job_id} to end")
    return job


@pytest.fixture(scope="module")
def data_ids(server: Any) -> dict[str, str]:
    """The synthetic train and test sets, uploaded (again, under other names) for the tests below."""
    ids = {"train": _upload(server, server.root / "train.txt", "hour-train"),
           "test": _upload(server, server.root / "test.txt", "hour-test")}
    for part in ("train", "test"):  # an earlier test may have stored the same bytes under another name
        ids[f"{part}_name"] = httpx.get(f"{server.url}/v1/datasets/{ids[part]}",
                                        headers={"X-API-Key": server.api_key}).json()["name"]
    return ids


def in_viewport(driver: Any, element: Any) -> bool:
    return bool(driver.execute_script(
        "const r = arguments[0].getBoundingClientRect();"
        "return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight;", element))


def with_key(driver: Any, server: Any, key: str | None = None) -> None:
    open_page(driver, server.url, "home")
    driver.execute_script("sessionStorage.setItem('ovex.apiKey', arguments[0])", key or server.api_key)
    driver.refresh()  # a fresh page: nothing left open or marked by an earlier test
    wait_for(lambda: css(driver, "#page-home").is_displayed(), what="the home page")


def test_errors_appear_beside_their_control_in_the_viewport(
    browser: Any, server: Any, data_ids: dict[str, str]
) -> None:
    """A refused job (dropout 1) and a wrong key on Activate: the message is in sight after the click, under
    the field it names, however far down the page was scrolled."""
    with_key(browser, server)
    open_page(browser, server.url, "jobs")
    wait_for(lambda: css(browser, "#param-dropout"), what="the options form")
    css(browser, "#job-model").send_keys("refused")
    option = f"#job-train option[value='{data_ids['train']}']"
    wait_for(lambda: len(css_all(browser, option)) == 1, what="datasets")
    select_value(css(browser, "#job-train"), data_ids["train"])
    css(browser, "#job-params summary").click()
    css(browser, "#param-dropout").send_keys("1")
    css(browser, "#job-params summary").click()  # collapsed again: the error must open it
    browser.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    css(browser, "#job-submit").click()
    err = wait_for(lambda: css(browser, ".inline-error[data-field='dropout']"), what="the dropout error")
    assert in_viewport(browser, err), "the error is out of sight"
    assert "params.dropout" in err.text and "less than 1" in err.text
    assert css(browser, "#param-dropout").get_attribute("aria-invalid") == "true"
    assert css(browser, "#job-params").get_attribute("open") is not None
    summary = css(browser, "#job-submit").find_element("xpath", "following-sibling::p[1]")
    assert "dropout" in summary.text  # beside the button as well
    # Activate with a wrong key, far down the models page
    shutil.copytree(server.root / "models" / "sparse" / "1", server.root / "models" / "zz-keyed" / "1")
    shutil.copytree(server.root / "models" / "sparse" / "1", server.root / "models" / "zz-keyed" / "2")
    wait_for(lambda: httpx.get(f"{server.url}/v1/models/zz-keyed").status_code == 200, timeout=60,
             what="zz-keyed")
    with_key(browser, server, "a-wrong-key")
    open_page(browser, server.url, "models")
    button = wait_for(lambda: css(browser, "button[aria-label='Activate zz-keyed version 1']"),
                      what="activate")
    browser.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    button.click()
    err = wait_for(lambda: button.find_element("xpath", "ancestor::td").find_element(
        "css selector", ".inline-error"), what="the key error")
    assert in_viewport(browser, err) and "API key" in err.text
    with_key(browser, server)


def test_job_form_is_short_and_a_base_shows_its_own_values(
    browser: Any, server: Any, data_ids: dict[str, str]
) -> None:
    job = _ended(server, _job(server, {"model": "based", "train_dataset": data_ids["train"],
                                       "params": {"epochs": 1, "dim": 24, "batch_size": 64}}))
    assert job["state"] == "succeeded", job
    with_key(browser, server)
    open_page(browser, server.url, "jobs")
    wait_for(lambda: css(browser, "#param-epochs"), what="the options form")
    visible = [e.get_attribute("id") for e in css_all(browser, "#job-form input, #job-form select")
               if e.is_displayed()]
    assert visible == ["job-model", "job-train", "job-test", "param-epochs", "job-activate", "job-continue"]
    assert css(browser, "#job-params").get_attribute("open") is None
    assert css(browser, "#param-dim").get_attribute("placeholder") == "512"
    open_page(browser, server.url, "models")
    grow = "button[aria-label='Grow based version 1 with new data']"
    wait_for(lambda: css(browser, grow), what="grow").click()
    wait_for(lambda: css(browser, "#param-dim").get_attribute("placeholder") == "24", what="the base's dim")
    assert css(browser, "#param-epochs").get_attribute("placeholder") == "1"
    assert "based version 1" in css(browser, "#job-params-note").text


def test_job_charts_urls_activation_and_live_table(
    browser: Any, server: Any, data_ids: dict[str, str]
) -> None:
    with_key(browser, server)
    open_page(browser, server.url, "jobs")
    wait_for(lambda: css(browser, "#jobs-list"), what="the jobs list")
    before = css(browser, "#jobs-list").get_attribute("data-updated")
    tested = _job(server, {"model": "charted", "train_dataset": data_ids["train"],
                           "test_dataset": data_ids["test"],
                           "params": {"epochs": 3, "dim": 16, "batch_size": 32}, "activate": True})
    # the recent jobs follow the server without a click
    wait_for(lambda: css_all(browser, f"#jobs-list tr[data-job='{tested}']"), timeout=20,
             what="the new job's row")
    assert css(browser, "#jobs-list").get_attribute("data-updated") != before
    _ended(server, tested)
    # the job's own address reopens it after a reload
    browser.get(f"{server.url}/#jobs/{tested}")
    browser.refresh()
    wait_for(lambda: tested in css(browser, "#job-detail-title").text, what="the job from its URL")
    wait_for(lambda: css(browser, "#job-state").text == "succeeded", what="its state")
    badge = wait_for(lambda: css(browser, "#job-activated-badge"), timeout=60, what="the activation")
    assert "is active" in badge.text
    # loss per step with one epoch mark and one epoch-mean point per epoch; a grid and several ticks
    assert series_count(browser, "chart-loss", "epoch mean") == 3
    assert len(css_all(browser, "#chart-loss .mark")) == 3
    assert len(css_all(browser, "#chart-loss .grid line")) >= 5
    assert len(css_all(browser, "#chart-loss text.tick.y")) >= 3
    assert len(css_all(browser, "#chart-loss text.tick.x")) >= 3
    assert css_all(browser, "#chart-loss text.tick.time")  # the elapsed-time axis
    assert "elapsed" in css(browser, "#job-timing").text
    from selenium.webdriver.common.action_chains import ActionChains
    area = css(browser, "#chart-pk .hover-area")
    ActionChains(browser).move_to_element(area).perform()
    hover = wait_for(lambda: css(browser, "#chart-pk").get_attribute("data-hover"), what="a hover readout")
    assert "epoch" in hover and "p@1" in hover
    assert series_count(browser, "chart-pk", "p@1") == 3
    assert f"{data_ids['test_name']} (300 rows)" in css(browser, "#chart-pk-caption").text
    browser.save_screenshot(str(server.root / "job-charted.png"))

    bare = _job(server, {"model": "charted", "train_dataset": data_ids["train"],
                         "params": {"epochs": 1, "dim": 16}})
    browser.get(f"{server.url}/#jobs/{bare}")
    wait_for(lambda: bare in css(browser, "#job-detail-title").text, what="the bare job")
    assert "no test set" in css(browser, "#chart-pk").text
    _ended(server, bare)


def test_log_scale_when_values_span_decades(browser: Any, server: Any) -> None:
    open_page(browser, server.url, "home")
    scales = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/console/chart.js').then(({ drawChart }) => {
          const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
          document.body.append(svg);
          const out = [];
          const line = (points) => [{name: 'loss', color: '#000', points}];
          drawChart(svg, line([[1, 9], [2, 0.5], [3, 0.004]]), {log: 'auto'});
          out.push(svg.getAttribute('data-scale'), svg.querySelectorAll('text.tick.y').length);
          drawChart(svg, line([[1, 0.9], [2, 0.5], [3, 0.4]]), {log: 'auto'});
          out.push(svg.getAttribute('data-scale'));
          svg.remove();
          done(out);
        });""")
    assert scales[0] == "log" and scales[1] >= 3 and scales[2] == "linear"


def test_predict_follows_the_model_and_gives_its_request(browser: Any, server: Any) -> None:
    import subprocess

    open_page(browser, server.url, "predict")
    wait_for(lambda: css_all(browser, "#predict-model option[value='sparse']"), what="the models")
    select_value(css(browser, "#predict-model"), "sparse")
    wait_for(lambda: css(browser, "#predict-features").is_displayed(), what="the features box for sparse")
    assert not css(browser, "#predict-text").is_displayed()
    css(browser, "#predict-features").send_keys("3:1 17:1 42:1")
    css(browser, "#predict-submit").click()
    wait_for(lambda: css(browser, "#answer-model").text == "sparse", what="the answer")
    names = [e.text for e in css_all(browser, "#answer-bars .label-name")]
    assert names and all(n.startswith("label ") and "#" not in n for n in names), names
    # the request as curl runs and gives the same labels
    css(browser, "#predict-code summary").click()
    curl = css(browser, "#code-curl").text
    assert "/v1/models/sparse/predict" in curl and '"indices":[3,17,42]' in curl
    out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30)
    answer = json.loads(out.stdout)
    assert [f"label {lab['id']}" for lab in answer["predictions"][0]["labels"]] == names
    assert "httpx.post(" in css(browser, "#code-python").text
    # an error takes the previous answer away and sits beside the field it names
    select_value(css(browser, "#predict-model"), "demo")
    wait_for(lambda: css(browser, "#predict-text").is_displayed(), what="the text box for demo")
    css(browser, "#predict-topk").clear()
    css(browser, "#predict-topk").send_keys("100000")
    css(browser, "#predict-text").send_keys("rocket orbit")
    browser.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    css(browser, "#predict-submit").click()
    err = wait_for(lambda: css(browser, "#predict-form .inline-error"), what="the refusal")
    assert not css_all(browser, "#answer-bars"), "the earlier answer is still shown"
    assert in_viewport(browser, err) and "top_k" in err.text


def test_predict_explains_with_highlighted_words(browser: Any, server: Any) -> None:
    spec = httpx.get(f"{server.url}/openapi.json").json()
    if "explain" not in spec["components"]["schemas"]["PredictRequest"]["properties"]:
        pytest.skip("this server has no explanations")
    with_key(browser, server)  # a fresh page
    open_page(browser, server.url, "predict")
    wait_for(lambda: css_all(browser, "#predict-model option[value='demo']"), what="the models")
    select_value(css(browser, "#predict-model"), "demo")
    wait_for(lambda: css(browser, "#predict-text").is_displayed(), what="the text box")
    css(browser, "#predict-text").clear()
    css(browser, "#predict-text").send_keys("rocket orbit guitar")
    css(browser, "#predict-explain").click()
    css(browser, "#predict-submit").click()
    marks = wait_for(lambda: css_all(browser, "#answer-bars li:first-child .explain mark"),
                     what="highlighted words")
    assert {m.text for m in marks} <= {"rocket", "orbit", "guitar"} and any(m.text == "rocket" for m in marks)
    assert all(m.get_attribute("data-contribution") for m in marks)


def test_home_shows_what_serves_the_next_step_and_live_traffic(browser: Any, server: Any) -> None:
    with_key(browser, server)
    for _ in range(5):
        httpx.post(f"{server.url}/v1/models/demo/predict", json={"inputs": [{"text": "rocket"}]})
    bad = httpx.post(f"{server.url}/v1/models/demo/predict", json={"inputs": [{"text": 5}]})
    assert bad.status_code == 422
    wrong_kind = {"inputs": [{"features": {"indices": [1], "values": [1.0]}}]}
    assert httpx.post(f"{server.url}/v1/models/demo/predict", json=wrong_kind).status_code == 422
    open_page(browser, server.url, "home")
    wait_for(lambda: css_all(browser, "#home-served tr"), what="the served models")
    assert "demo" in css(browser, "#home-served").text and "default" in css(browser, "#home-served").text
    assert css(browser, "#next-step").get_attribute("href")
    def cells(selector: str) -> list[str]:
        return [c.text for c in css(browser, selector).find_elements("css selector", "td")]

    def counted(selector: str, column: int, at_least: int) -> list[str] | None:
        """The row's cells once its count has caught up with the requests above (the page refreshes)."""
        row = cells(selector)
        return row if row[column] not in ("", "…") and int(row[column].replace(",", "")) >= at_least else None

    route = "#home-traffic tr[data-route='POST /v1/models/{name}/predict']"
    row = wait_for(lambda: counted(route, 5, 7), what="the predict route's traffic")
    assert row[2].endswith("ms") and row[3].endswith("ms") and int(row[4].split()[0]) >= 1, row
    # per model: latency and the requests its own checks refused (features sent to a text model)
    row = wait_for(lambda: counted("#home-models-traffic tr[data-model='demo']", 6, 5), what="demo's rows")
    assert row[2].endswith("ms") and row[3].endswith("ms") and int(row[4].split()[0]) >= 1, row
    # requests per second from two reads
    for _ in range(4):
        httpx.post(f"{server.url}/v1/models/demo/predict", json={"inputs": [{"text": "rocket"}]})
    rate = "#home-traffic tr[data-route='POST /v1/models/{name}/predict'] td:nth-child(2)"
    wait_for(lambda: float(css(browser, rate).text.replace("…", "0")) > 0, timeout=15, what="a request rate")


def test_a_new_server_says_upload_a_dataset_first(browser: Any, server: Any, tmp_path: Path) -> None:
    live = load_live_server()
    shutil.copytree(server.root / "models" / "demo", tmp_path / "models" / "demo")  # a model, no data yet
    with live.live_server(tmp_path, default_model=None) as srv:
        open_page(browser, srv.url, "home")
        browser.execute_script("sessionStorage.setItem('ovex.apiKey', arguments[0])", srv.api_key)
        browser.refresh()
        step = wait_for(lambda: css(browser, "#next-step"), what="the next step")
        assert step.text == "upload a dataset" and step.get_attribute("href").endswith("#datasets")


def test_delete_from_the_console_after_a_confirmation(browser: Any, server: Any) -> None:
    for v in ("1", "2"):
        shutil.copytree(server.root / "models" / "sparse" / "1", server.root / "models" / "zz-gone" / v)
    wait_for(lambda: httpx.get(f"{server.url}/v1/models/zz-gone").status_code == 200, timeout=60,
             what="zz-gone")
    rows = (server.root / "test.txt").read_text().splitlines()[1:41]  # bytes no other test stored
    _, d, labels = (server.root / "test.txt").read_text().splitlines()[0].split()
    (server.root / "small.txt").write_text("\n".join([f"40 {d} {labels}", *rows]) + "\n")
    ds = _upload(server, server.root / "small.txt", "to-delete")
    with_key(browser, server)
    open_page(browser, server.url, "models")
    button = wait_for(lambda: css(browser, "button[aria-label='Delete zz-gone version 1']"), what="delete v1")
    button.click()
    browser.switch_to.alert.dismiss()  # "no": nothing happens
    time.sleep(0.5)
    versions = lambda: [v["version"] for v in httpx.get(f"{server.url}/v1/models/zz-gone").json()["versions"]]  # noqa: E731
    assert versions() == ["1", "2"]
    button.click()
    browser.switch_to.alert.accept()
    wait_for(lambda: "version 1 deleted" in flash_text(browser), what="the deletion")
    assert versions() == ["2"]
    # the listing is drawn again after the message: wait for it, not for the message
    wait_for(lambda: not css_all(browser, "button[aria-label='Delete zz-gone version 1']"),
             what="version 1's row to go")

    open_page(browser, server.url, f"datasets/{ds}")
    wait_for(lambda: "to-delete" in css(browser, "#dataset-detail").text, what="the dataset from its URL")
    css(browser, f"tr[data-dataset='{ds}'] button.danger").click()
    browser.switch_to.alert.accept()
    wait_for(lambda: not css_all(browser, f"tr[data-dataset='{ds}']"), what="the dataset to go")
    gone = httpx.get(f"{server.url}/v1/datasets/{ds}", headers={"X-API-Key": server.api_key})
    assert gone.status_code == 404

    spec = httpx.get(f"{server.url}/openapi.json").json()
    if "delete" not in spec["paths"]["/v1/models/{name}"]:
        return  # this server cannot delete a whole model
    open_page(browser, server.url, "models/zz-gone")
    # found and clicked in one try: the page may draw the model again between the two (a stale element)
    wait_for(lambda: css(browser, "button[aria-label='Delete model zz-gone']").click() or True,
             what="delete model")
    browser.switch_to.alert.accept()
    wait_for(lambda: not css_all(browser, "#model-zz-gone"), timeout=30, what="the model to go")
    assert httpx.get(f"{server.url}/v1/models/zz-gone").status_code == 404


def test_models_and_versions_have_addresses(browser: Any, server: Any) -> None:
    open_page(browser, server.url, "models/sparse/1")
    row = wait_for(lambda: css(browser, "article:has(#model-sparse) tr.target[data-version='1']"),
                   what="the version row, marked")
    assert in_viewport(browser, row)


def test_versions_say_where_they_come_from_and_a_model_can_stop_serving(
    browser: Any, server: Any, data_ids: dict[str, str]
) -> None:
    first = _ended(server, _job(server, {"model": "kin", "train_dataset": data_ids["train"],
                                         "test_dataset": data_ids["test"],
                                         "params": {"epochs": 1, "dim": 16}}))
    grown = _ended(server, _job(server, {"model": "kin", "train_dataset": data_ids["train"],
                                         "base": {"version": "1"}, "params": {"epochs": 1}}))
    assert first["state"] == grown["state"] == "succeeded", (first, grown)
    with_key(browser, server)
    open_page(browser, server.url, "models/kin/2")
    card = wait_for(lambda: css(browser, "#model-kin"), what="kin").find_element("xpath", "ancestor::article")
    v1 = card.find_element("css selector", "tr[data-version='1']")
    v2 = card.find_element("css selector", "tr[data-version='2']")
    assert data_ids["test_name"] in v1.find_element("css selector", "td.test-set").text  # its P@k's test set
    assert "v2 grows v1" in v2.text
    assert v2.find_element("css selector", f"a[href='#jobs/{grown['id']}']")
    assert data_ids["train_name"] in v2.find_element("css selector", "td.origin").text
    # this server's default comes from OVEX_DEFAULT_MODEL: the console says so instead of offering a change
    make_default = card.find_element("css selector", "button[aria-label='Make kin the default model']")
    assert not make_default.is_enabled() and "OVEX_DEFAULT_MODEL" in make_default.get_attribute("title")
    card.find_element("css selector", "button[aria-label='Deactivate kin']").click()
    browser.switch_to.alert.accept()
    wait_for(lambda: "kin is deactivated" in flash_text(browser), what="the deactivation")
    sparse = {"inputs": [{"features": {"indices": [1], "values": [1.0]}}]}
    r = httpx.post(f"{server.url}/v1/models/kin/predict", json=sparse)
    assert r.status_code == 409, r.text

    def deactivated_card() -> bool:  # the list re-renders after the flash: read it whole, again if stale
        card = css(browser, "#model-kin").find_element("xpath", "ancestor::article")
        return "deactivated" in card.text and not card.find_elements(
            "css selector", "button[aria-label='Deactivate kin']")

    wait_for(deactivated_card, what="kin's card, deactivated and without its Deactivate button")


def test_the_default_model_stays_when_a_newer_one_appears(browser: Any, server: Any, tmp_path: Path) -> None:
    """No OVEX_DEFAULT_MODEL, no demo: the oldest model is the default, and a newer one that sorts first
    by name does not take its place, on the home page or as the predict page's choice."""
    live = load_live_server()
    shutil.copytree(server.root / "models" / "demo" / "1", tmp_path / "models" / "zeta" / "1")
    with live.live_server(tmp_path, default_model=None) as srv:
        newer = tmp_path / "models" / "big" / "1"
        shutil.copytree(server.root / "models" / "sparse" / "1", newer)
        later = time.time() + 5
        os.utime(newer / "config.json", (later, later))
        wait_for(lambda: httpx.get(f"{srv.url}/v1/models/big").json().get("active_version") == "1",
                 timeout=60, what="big to serve")
        open_page(browser, srv.url, "home")
        served = wait_for(lambda: css(browser, "#home-served"), what="the served models")
        wait_for(lambda: "big" in served.text, what="big on the home page")
        rows = {r.find_element("css selector", "td a").text: r.find_elements("css selector", ".badge")
                for r in css_all(browser, "#home-served tr") if r.find_elements("css selector", "td a")}
        assert [b.text for b in rows["zeta"]] == ["default"] and rows["big"] == [], rows
        open_page(browser, srv.url, "predict")
        wait_for(lambda: css_all(browser, "#predict-model option[value='big']"), what="the models")
        assert css(browser, "#predict-model").get_attribute("value") == "zeta"


def test_labels_added_by_their_texts_in_the_console_are_marked_in_answers(
    browser: Any, server: Any, tmp_path: Path, shots: Path
) -> None:
    """The "Add labels" form of a model trained with label texts (a model without them has none): a line
    it cannot read and a name the model has are refused beside the box; lines of `name: text` write the
    next version, and the predict page marks a new label in its answers as known from its text."""
    from tests.service.conftest import train_with_texts

    train_with_texts(tmp_path)  # model `lt`: planted labels with texts, a few held out to add here
    held = json.loads((tmp_path / "held.json").read_text())[:3]
    shutil.copytree(server.root / "models" / "demo", tmp_path / "models" / "demo")
    with load_live_server().live_server(tmp_path, default_model=None) as srv:
        with_key(browser, srv)
        open_page(browser, srv.url, "models")
        wait_for(lambda: css(browser, "form.add-labels[data-model='lt']"), what="the add-labels form")
        assert not css_all(browser, "form.add-labels[data-model='demo']")
        css(browser, "details.add-labels summary").click()
        box = css(browser, "#add-labels-lt")
        submit = css(browser, "form.add-labels button[type='submit']")

        def refusal(containing: str) -> str:
            submit.click()
            msg = wait_for(lambda: [e.text for e in css_all(browser, "form.add-labels .inline-error")
                                    if containing in e.text], what=f"a refusal naming {containing!r}")
            return str(msg[0])

        box.send_keys("no colon on this line")
        assert "line 1" in refusal("colon") and box.get_attribute("aria-invalid") == "true"
        box.clear()
        box.send_keys("7: w1 w2")  # a name the model has
        refusal("'7'")
        box.clear()
        box.send_keys("\n".join(f"{h['name']}: {h['text']}" for h in held))
        submit.click()
        wait_for(lambda: "version 2 adds 3 labels" in flash_text(browser), what="the new version")
        browser.save_screenshot(str(shots / "add-labels.png"))
        assert httpx.get(f"{srv.url}/v1/models/lt").json()["active_version"] == "2"
        assert (srv.root / "models" / "lt" / "1").is_dir()
        # a held label the model answers first for its own text (most of them are: test_add_labels)
        r = httpx.post(f"{srv.url}/v1/models/lt/predict", headers={"X-API-Key": srv.api_key}, timeout=30,
                       json={"inputs": [{"text": h["text"]} for h in held], "top_k": 1})
        firsts = [p["labels"][0] for p in r.json()["predictions"]]
        name, text = next((h["name"], h["text"]) for h, f in zip(held, firsts, strict=True)
                          if f["name"] == h["name"])
        open_page(browser, srv.url, "predict")
        wait_for(lambda: css_all(browser, "#predict-model option[value='lt']"), what="the models")
        select_value(css(browser, "#predict-model"), "lt")
        wait_for(lambda: css(browser, "#predict-text").is_displayed(), what="the text box")
        css(browser, "#predict-text").send_keys(text)
        css(browser, "#predict-submit").click()
        wait_for(lambda: css(browser, "#answer-model").text == "lt", what="the answer")
        shown = [(e.text, bool(e.find_elements("css selector", ".badge.from-text")))
                 for e in css_all(browser, "#answer-bars .label-name")]
        assert name in shown[0][0].split() and shown[0][1] and "from its text" in shown[0][0], shown
        browser.save_screenshot(str(shots / "add-labels-answer.png"))
