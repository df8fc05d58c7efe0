"""Label texts from the client against a real server: upload a label-texts file, train with it, then add
labels by their texts with the SDK and with `ovex-client labels add`; answers mark a label known by its
text alone until a job with rows for it trains it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from live_server import TOPICS, LiveServer, make_text_dataset
from ovex_client import Client, Conflict, cli
from ovex_client.errors import APIError


@pytest.fixture(scope="module")
def topics(live: LiveServer) -> str:
    """Model `topics`, trained by a job with the topics' words as their label texts."""
    rows = make_text_dataset(live.root / "topics-train.jsonl", seed=7)
    texts = live.root / "topics-texts.jsonl"
    texts.write_text("".join(json.dumps({"name": n, "text": t}) + "\n" for n, t in TOPICS.items()))
    with Client(live.url, live.api_key, timeout=120) as c:
        data = c.upload_dataset(rows)
        label_texts = c.upload_dataset(texts, kind="label_texts")
        assert label_texts.format == "label_texts" and label_texts.labels == len(TOPICS)
        job = c.submit_job("topics", data.id, label_texts=label_texts.id, activate=True,
                           params={"epochs": 3, "dim": 16})
        done = c.wait_for_job(job.id)
        assert done.state == "succeeded", done.error
        return str(done.model_version)


def test_sdk_adds_labels_by_text(live: LiveServer, topics: str) -> None:
    with Client(live.url, live.api_key, timeout=120) as c:
        labels = [("felines", "cat kitten purr"), {"name": "rockets", "text": "rocket orbit"}]
        added = c.add_labels("topics", labels, activate=True)
        assert added.name == "topics" and added.base_version == topics and added.activated
        assert added.added == 2 and added.first_label_id == len(TOPICS) and added.n_labels == len(TOPICS) + 2
        assert c.get_model("topics").active_version == added.version
        with pytest.raises(Conflict) as e:
            c.add_labels("topics", [("cats", "cat")])
        assert "cats" in e.value.message
        with pytest.raises(APIError) as e2:
            c.add_labels("sparse", [("x", "w1")])  # trained without label texts
        assert e2.value.status_code == 409 and "label texts" in e2.value.message


def test_cli_labels_add(
    live: LiveServer, topics: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = ["--url", live.url, "--api-key", live.api_key]
    f = tmp_path / "labels.jsonl"
    f.write_text('{"name": "pets", "text": "dog puppy cat kitten"}\n\n'
                 '{"name": "baking", "text": "oven flour"}\n')
    code = cli.main(["labels", "add", "topics", "--file", str(f), "--activate", *conn])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "model topics: version" in out and "(active)" in out and "2 added" in out
    code = cli.main(["labels", "add", "topics", "--file", str(f), "--json", *conn])
    out, err = capsys.readouterr()
    assert code == 1 and "409" in err and "pets" in err  # the names are the model's now
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "a", "text": "x"}\n{"name": "b"}\n')
    code = cli.main(["labels", "add", "topics", "--file", str(bad), *conn])
    out, err = capsys.readouterr()
    assert code == 2 and "bad.jsonl:2" in err
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"name": "c", "text": "   "}\n')
    code = cli.main(["labels", "add", "topics", "--file", str(blank), *conn])
    out, err = capsys.readouterr()
    assert code == 1 and "422" in err and "empty" in err


def test_answers_mark_a_label_known_by_its_text_until_a_job_trains_it(
    live: LiveServer, topics: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "planet galaxy orbit"
    with Client(live.url, live.api_key, timeout=120) as c:
        added = c.add_labels("topics", [("stargazing", text)], activate=True)

        def marks() -> dict[str | None, bool]:  # every label of the model: its mark in the answer
            model = c.get_model("topics")
            answer = c.predict(text, model="topics", top_k=model.n_labels, normalization="none")
            labels = answer.predictions[0].labels
            assert answer.version == model.active_version and len(labels) == model.n_labels
            return {lab.name: lab.from_text for lab in labels}

        before = marks()  # the topics trained on rows; the labels this module added by their texts
        assert before["stargazing"] and all(marked == (name not in TOPICS) for name, marked in before.items())
        code = cli.main(["predict", text, "--model", "topics", "--top-k", "3", "--normalization", "none",
                         "--url", live.url, "--api-key", live.api_key])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert [ln.endswith("(from its text)") for ln in out.splitlines() if "stargazing" in ln] == [True]
        # a continual job on that version with rows for the label: it has rows now, and is no longer marked
        rows = tmp_path / "stars.jsonl"
        rows.write_text("".join(json.dumps({"text": f"{text} the {w}", "labels": ["stargazing"]}) + "\n"
                                for w in ("a", "of", "and", "to", "in", "on")))
        data = c.upload_dataset(rows)
        job = c.submit_job("topics", data.id, base={"version": added.version}, activate=True,
                           params={"epochs": 2})
        done = c.wait_for_job(job.id)
        assert done.state == "succeeded", done.error
        assert marks() == {**before, "stargazing": False}
