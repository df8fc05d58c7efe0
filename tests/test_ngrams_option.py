"""The `ngrams` training parameter (1 = words, 2 = words and adjacent word pairs, the default) from the
params object through `ovex train`, the jobs API and continual runs to the saved featurizer; and artifacts
saved before the field existed, which were single words."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.cli import main
from tests.jobs.conftest import Server, sqlite_server
from trainer.artifact import load_artifact, read_params
from trainer.data import write_xc
from trainer.errors import ParamsError
from trainer.params import TrainParams
from trainer.synth import synth_dataset

# no marked leading words (`--lead-words`, its own tests): a vocabulary here is words and pairs alone
FAST = ["--dim", "8", "--batch-size", "16", "--negatives", "8", "--group-size", "4", "--epochs", "1",
        "--lead-words", "0", "--quiet"]
TOPICS = {
    "fruit": ["red", "apple", "sweet", "ripe", "orchard"],
    "car": ["fast", "engine", "wheel", "road", "driver"],
    "bird": ["wing", "feather", "nest", "song", "flight"],
    "fish": ["river", "scale", "swim", "gill", "stream"],
}
NEW = ["zebra", "stripe", "savanna", "herd", "grass"]  # the words of the rows a continual run adds


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(n: int = 40) -> list[dict[str, Any]]:
    """Texts of three words of their label's topic, in varying order (so word pairs vary too)."""
    out = []
    for i in range(n):
        label = list(TOPICS)[i % 4]
        words = TOPICS[label]
        out.append({"text": " ".join(words[(i + 2 * j) % 5] for j in range(3)), "labels": [label]})
    return out


def _new_rows(n: int = 12) -> list[dict[str, Any]]:
    return [{"text": " ".join(NEW[(i + j) % 5] for j in range(3)), "labels": ["animal"]} for i in range(n)]


def _pairs(vocab: dict[str, int] | None) -> set[str]:
    assert vocab is not None
    return {term for term in vocab if " " in term}


def _featurizer_json(model: Path) -> dict[str, Any]:
    return dict(json.loads((model / "featurizer" / "featurizer.json").read_text()))


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """old.jsonl (four topics), all.jsonl (those plus rows of new words and a new label); models `words`
    (`--ngrams 1`) and `pairs` (the default) trained on old.jsonl."""
    root = tmp_path_factory.mktemp("ngrams")
    old = _write(root / "old.jsonl", _rows())
    _write(root / "all.jsonl", _rows() + _new_rows())
    assert main(["train", "--train", str(old), "--out", str(root / "words"), "--ngrams", "1", *FAST]) == 0
    assert main(["train", "--train", str(old), "--out", str(root / "pairs"), *FAST]) == 0
    return {"root": root, "old": old, "all": root / "all.jsonl", "words": root / "words",
            "pairs": root / "pairs"}


# ------------------------------------------------------------------------------------ TrainParams


def test_params_default_bounds_and_json_round_trip() -> None:
    assert TrainParams().ngrams == 2
    assert TrainParams.model_fields["ngrams"].default == 2
    for bad in (0, 3):
        with pytest.raises(ValidationError, match="ngrams") as refused:
            TrainParams(ngrams=bad)
        assert [e["loc"] for e in refused.value.errors()] == [("ngrams",)]
    for n in (1, 2):
        data = TrainParams(ngrams=n).to_json_dict()
        assert data["ngrams"] == n
        back = TrainParams.from_json_dict(json.loads(json.dumps(data)))
        assert back.ngrams == n and back == TrainParams(ngrams=n)
    # params written before the field existed (artifacts, stored jobs) were single words
    old = TrainParams().to_json_dict()
    del old["ngrams"]
    assert TrainParams.from_json_dict(old).ngrams == 1
    assert TrainParams.from_json_dict({}).ngrams == 1
    with pytest.raises(ParamsError, match="ngrams"):
        TrainParams.from_json_dict({"ngrams": 3})


# ------------------------------------------------------------------------------------ ovex train


def test_cli_ngrams_reaches_the_saved_featurizer_and_params(
    texts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    for name, n in (("words", 1), ("pairs", 2)):
        model = texts[name]
        meta = _featurizer_json(model)
        assert meta["kind"] == "text" and meta["config"]["ngrams"] == n, meta["config"]
        assert json.loads((model / "config.json").read_text())["params"]["ngrams"] == n
        loaded = load_artifact(model)
        assert loaded.params.ngrams == n and loaded.featurizer.config.ngrams == n
        pairs = _pairs(loaded.featurizer.vocab)
        if n == 1:
            assert not pairs and {"apple", "engine", "feather"} <= set(loaded.featurizer.vocab)
        else:
            assert all(len(p.split()) == 2 for p in pairs) and "red sweet" in pairs, sorted(pairs)
        # a request is featurized as training featurized it: "red" and "sweet", plus "red sweet" with pairs
        assert loaded.featurizer.transform_texts(["red sweet"]).nnz == 1 + n
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "--ngrams NGRAMS text: word n-grams in the vocabulary" in helptext and "(default: 2)" in helptext


@pytest.mark.parametrize("value", ["3", "0"])
def test_cli_ngrams_out_of_range_exits_2_naming_the_flag(
    texts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    code = main(["train", "--train", str(texts["old"]), "--out", str(tmp_path / "m"), "--ngrams", value,
                 *FAST])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: invalid flags: --ngrams: "), err
    assert ("less than or equal to 2" if value == "3" else "greater than or equal to 1") in err, err
    assert "Traceback" not in err and not (tmp_path / "m").exists()


# ------------------------------------------------------------------------------------ continual runs


def test_continual_run_keeps_the_base_ngrams_and_refuses_another(
    texts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = texts["words"]
    code = main(["train", "--init-from", str(base), "--train", str(texts["all"]), "--out",
                 str(tmp_path / "refused"), "--ngrams", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "ngrams=2 differs from the base model's ngrams=1" in err, err
    assert "keeps the base's ngrams" in err and not (tmp_path / "refused").exists()

    # not given: the base's single words, also for the words the new rows bring
    grown = tmp_path / "grown"
    assert main(["train", "--init-from", str(base), "--train", str(texts["all"]), "--out", str(grown),
                 "--quiet"]) == 0
    capsys.readouterr()
    loaded = load_artifact(grown)
    assert loaded.params.ngrams == 1 and loaded.featurizer.config.ngrams == 1
    assert json.loads((grown / "config.json").read_text())["params"]["ngrams"] == 1
    vocab = loaded.featurizer.vocab
    assert vocab is not None and set(NEW) <= set(vocab), sorted(vocab)  # the vocabulary did grow
    assert not _pairs(vocab), sorted(_pairs(vocab))
    # the same given value as the base's is no conflict
    assert main(["train", "--init-from", str(base), "--train", str(texts["all"]), "--out",
                 str(tmp_path / "same"), "--ngrams", "1", "--quiet"]) == 0
    assert load_artifact(tmp_path / "same").featurizer.config.ngrams == 1

    # a base of word pairs grows by the new rows' pairs (so the check above could fail)
    paired = tmp_path / "paired"
    assert main(["train", "--init-from", str(texts["pairs"]), "--train", str(texts["all"]), "--out",
                 str(paired), "--quiet"]) == 0
    grown_pairs = _pairs(load_artifact(paired).featurizer.vocab)
    assert any(set(p.split()) <= set(NEW) for p in grown_pairs), sorted(grown_pairs)
    assert load_artifact(paired).params.ngrams == 2
    code = main(["train", "--init-from", str(texts["pairs"]), "--train", str(texts["all"]), "--out",
                 str(tmp_path / "o"), "--ngrams", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "ngrams=1 differs from the base model's ngrams=2" in err, err


def test_ngrams_does_not_apply_to_a_sparse_feature_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = synth_dataset(10, 40, 120, seed=4)
    write_xc(tmp_path / "xc.txt", ds.X, ds.Y)
    assert main(["train", "--train", str(tmp_path / "xc.txt"), "--out", str(tmp_path / "xc"), *FAST]) == 0
    capsys.readouterr()
    assert read_params(tmp_path / "xc")[1] == "sparse"
    code = main(["train", "--init-from", str(tmp_path / "xc"), "--train", str(tmp_path / "xc.txt"),
                 "--out", str(tmp_path / "o"), "--ngrams", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert ("ngrams=1 does not apply: the base model takes sparse features (XC data) and this is a setting "
            "of text featurizers (leave ngrams out)") in err, err
    assert "differs" not in err and not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------ old artifacts


def test_an_artifact_saved_before_the_field_reads_as_single_words(
    texts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old"
    shutil.copytree(texts["words"], old)  # single words, as every model was before the field
    config = json.loads((old / "config.json").read_text())
    del config["params"]["ngrams"]
    (old / "config.json").write_text(json.dumps(config, indent=2))

    loaded, fresh = load_artifact(old), load_artifact(texts["words"])
    assert loaded.params.ngrams == 1 and loaded.params == fresh.params
    assert read_params(old)[0].ngrams == 1
    x = loaded.featurizer.transform_texts(["red apple", "fast engine wheel"])
    assert (loaded.topk(x, 2)[0] == fresh.topk(x, 2)[0]).all()
    assert main(["evaluate", str(old), str(texts["old"])]) == 0
    capsys.readouterr()

    # continued, it keeps single words and its successor records them
    code = main(["train", "--init-from", str(old), "--train", str(texts["all"]), "--out",
                 str(tmp_path / "o"), "--ngrams", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "ngrams=2 differs from the base model's ngrams=1" in err, err
    assert main(["train", "--init-from", str(old), "--train", str(texts["all"]), "--out",
                 str(tmp_path / "next"), "--quiet"]) == 0
    assert json.loads((tmp_path / "next" / "config.json").read_text())["params"]["ngrams"] == 1
    assert not _pairs(load_artifact(tmp_path / "next").featurizer.vocab)


# ------------------------------------------------------------------------------------ jobs API


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("ngrams_srv")) as server:
        yield server


API_TINY = {"dim": 8, "epochs": 1, "batch_size": 16, "negatives": 8, "group_size": 4}


def _finished(srv: Server, job_id: str) -> dict[str, Any]:
    return srv.wait(job_id, lambda j: j["state"] == "succeeded", 240, "the job to succeed")


def test_a_job_trains_with_the_ngrams_it_was_given(srv: Server, texts: dict[str, Path]) -> None:
    data = srv.upload(texts["old"])["id"]
    words = srv.submit({"model": "words", "train_dataset": data, "params": {**API_TINY, "ngrams": 1}})
    pairs = srv.submit({"model": "pairs", "train_dataset": data, "params": API_TINY})
    for job_id, model, n in ((words, "words", 1), (pairs, "pairs", 2)):
        job = _finished(srv, job_id)
        assert job["params"]["ngrams"] == n, job["params"]
        artifact = srv.models_dir / model / str(job["model_version"])
        assert _featurizer_json(artifact)["config"]["ngrams"] == n
        loaded = load_artifact(artifact)
        assert loaded.params.ngrams == n
        assert bool(_pairs(loaded.featurizer.vocab)) == (n == 2)

    # a job continuing the single-word version: given 2 is refused before queueing, left out it keeps 1
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])
    more = srv.upload(texts["all"])["id"]
    r = srv.client.post("/v1/jobs", json={"model": "words", "train_dataset": more, "base": {},
                                          "params": {"ngrams": 2}})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "params"] and "ngrams=2 differs from the base model's ngrams=1" in \
        detail["msg"], detail
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs  # nothing queued
    grow = srv.submit({"model": "words", "train_dataset": more, "base": {}, "params": {"epochs": 1}})
    job = _finished(srv, grow)
    assert job["params"]["ngrams"] == 1, job["params"]
    grown = load_artifact(srv.models_dir / "words" / str(job["model_version"]))
    assert grown.featurizer.config.ngrams == 1 and set(NEW) <= set(grown.featurizer.vocab or {})
    assert not _pairs(grown.featurizer.vocab)


@pytest.mark.parametrize(("value", "words"), [
    (5, "less than or equal to 2"), (0, "greater than or equal to 1"), ("2", "valid integer"),
])
def test_a_job_with_ngrams_out_of_range_is_a_422_naming_it(
    srv: Server, texts: dict[str, Path], value: Any, words: str
) -> None:
    data = srv.upload(texts["old"])["id"]
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": data, "params": {"ngrams": value}})
    assert r.status_code == 422, r.text
    errs = [e for e in r.json()["detail"] if e["loc"] == ["body", "params", "ngrams"]]
    assert errs and words in errs[0]["msg"], r.text
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs
