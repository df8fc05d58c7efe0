"""Twins against a live `ovex serve`: a model whose training rows never carry their twins leaves an input's
twin out of its answers over HTTP, on the int8 index and the exact scan, for every normalization, and a
label added later by its text joins the rule (`trainer/twins.py`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.service.conftest import API_KEY, Server, start_server, stop_server
from tests.test_twins import _params, taxonomy

TWIN_TEXT = "k2a k2b subword2"  # the label sub2's own text: a thing of kind 2, never labelled sub2


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from trainer.hooks import QuietHooks
    from trainer.train import train

    root = tmp_path_factory.mktemp("twins-srv")
    ds, label_texts = taxonomy(480, twins_are_labels=False)
    out = root / "models" / "tax" / "1"
    train(_params(), ds, None, out_dir=out, hooks=QuietHooks(), label_texts=label_texts)
    assert json.loads((out / "label_tower.json").read_text())["twins"]["excluded"] is True
    s = start_server(root / "models", root, {"OVEX_RETRIEVAL": "int8"})
    try:
        yield s
    finally:
        stop_server(s)


def _answer(srv: Server, text: str, norm: str, exact: bool) -> list[str]:
    with srv.client() as c:
        r = c.post("/v1/models/tax/predict", json={"inputs": [{"text": text}], "top_k": 5,
                                                   "normalization": norm, "exact": exact})
    assert r.status_code == 200, r.text
    pred = r.json()["predictions"][0]
    return [lab["name"] for lab in pred["labels"]]


@pytest.mark.parametrize("norm", ["sparsemax", "evsoftmax", "softmax", "none"])
@pytest.mark.parametrize("exact", [False, True], ids=["index", "exact"])
def test_an_inputs_twin_is_never_answered_over_http(srv: Server, norm: str, exact: bool) -> None:
    names = _answer(srv, TWIN_TEXT, norm, exact)
    assert names and names[0] == "kind2" and "sub2" not in names, names


def test_a_label_added_by_text_is_left_out_for_its_own_text(srv: Server) -> None:
    with srv.client(headers={"X-API-Key": API_KEY}) as c:
        r = c.post("/v1/models/tax/labels", json={"labels": [{"name": "sub9", "text": "k4a k4b subword9"}],
                                                  "activate": True})
        assert r.status_code == 201, r.text
        assert c.get("/v1/models/tax").json()["active_version"] == "2"
    from trainer.artifact import load_artifact

    text = "k4a k4b subword9"
    v2 = load_artifact(srv.models_dir / "tax" / "2")
    ids, _ = v2.topk(v2.featurizer.transform_texts([text]), 5)
    assert "sub9" in [v2.label_names[int(i)] for i in ids[0]]  # its row, from its text, ranks high...
    for norm in ("none", "sparsemax"):
        names = _answer(srv, text, norm, exact=True)
        assert names and "sub9" not in names, names  # ...but it is the input's twin: left out
    assert "sub2" not in _answer(srv, TWIN_TEXT, "none", exact=False)  # the old twins still are
