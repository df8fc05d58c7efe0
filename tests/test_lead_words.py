"""The `lead_words` training parameter (the first words of each sentence or clause also count as marked
terms, `^word`; 3 by default) from the tokenizer through the params object, `ovex train`, the jobs API and
continual runs to the saved featurizer; and artifacts saved before the field existed, which had none."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from service.cli import main
from tests.jobs.conftest import Server, sqlite_server
from trainer.artifact import load_artifact, read_params
from trainer.data import Dataset
from trainer.errors import ParamsError
from trainer.featurize import LEAD_MARK, Featurizer, FeaturizerConfig, tokenize
from trainer.params import MAX_LEAD_WORDS, TrainParams

FAST = ["--dim", "8", "--batch-size", "16", "--negatives", "8", "--group-size", "4", "--epochs", "1",
        "--quiet"]
TOPICS = {
    "fruit": ["apple", "pear", "plum"],
    "car": ["engine", "wheel", "brake"],
    "bird": ["wing", "feather", "nest"],
}
NEW = ["zebra", "stripe", "savanna"]  # the words of the rows a continual run adds


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(n: int = 30) -> list[dict[str, Any]]:
    """Two clauses a row: a word of the label's topic first, then the same filler words for every label."""
    out = []
    for i in range(n):
        label = list(TOPICS)[i % 3]
        word = TOPICS[label][i // 3 % 3]
        out.append({"text": f"{word} of some kind. it is found here and there", "labels": [label]})
    return out


def _new_rows(n: int = 9) -> list[dict[str, Any]]:
    return [{"text": f"{NEW[i % 3]} in a herd; it grazes", "labels": ["animal"]} for i in range(n)]


def _marked(vocab: dict[str, int] | None) -> set[str]:
    assert vocab is not None
    return {term for term in vocab if term.startswith(LEAD_MARK)}


def _featurizer_json(model: Path) -> dict[str, Any]:
    return dict(json.loads((model / "featurizer" / "featurizer.json").read_text()))


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """old.jsonl (three topics), all.jsonl (those plus rows of new words and a new label); models `plain`
    (`--lead-words 0`) and `lead` (the default) trained on old.jsonl."""
    root = tmp_path_factory.mktemp("lead")
    old = _write(root / "old.jsonl", _rows())
    _write(root / "all.jsonl", _rows() + _new_rows())
    assert main(["train", "--train", str(old), "--out", str(root / "plain"), "--lead-words", "0", *FAST]) == 0
    assert main(["train", "--train", str(old), "--out", str(root / "lead"), *FAST]) == 0
    return {"root": root, "old": old, "all": root / "all.jsonl", "plain": root / "plain",
            "lead": root / "lead"}


# ------------------------------------------------------------------------------------ the tokenizer

WORD = st.text(alphabet="abcxyz", min_size=2, max_size=5)
CLAUSES = st.lists(st.lists(WORD, min_size=0, max_size=6), min_size=1, max_size=5)


@settings(max_examples=100, deadline=None)
@given(clauses=CLAUSES, ends=st.lists(st.sampled_from([". ", "; ", ": ", "! ", "? ", ".\n", ".  "]),
                                      min_size=4, max_size=4),
       lead=st.integers(0, 4), ngrams=st.sampled_from([1, 2]))
def test_lead_terms_are_each_clauses_first_words_after_the_plain_terms(
    clauses: list[list[str]], ends: list[str], lead: int, ngrams: int
) -> None:
    """Built from known clauses: the plain terms are as without the option, then each clause's first
    `lead` words, marked, in order, whatever mark ends the clause."""
    text = "".join(" ".join(c) + (ends[i] if i < len(clauses) - 1 else ".") for i, c in enumerate(clauses))
    words = [w for c in clauses for w in c]
    plain = tokenize(text, ngrams)
    assert plain[: len(words)] == words  # the option off: as before it existed
    assert tokenize(text, ngrams, lead) == [*plain, *(LEAD_MARK + w for c in clauses for w in c[:lead])]


def test_lead_terms_on_a_gloss_and_marks_inside_words() -> None:
    got = tokenize("Chaos bedlam . A state of extreme confusion; \"a dab of paint\"", 1, 3)
    assert [t for t in got if t.startswith(LEAD_MARK)] == ["^chaos", "^bedlam", "^state", "^of", "^extreme",
                                                           "^dab", "^of", "^paint"]
    # a mark inside a number or an abbreviation, not followed by a space, ends no clause
    assert [t for t in tokenize("pi is 3.14 or so", 1, 1) if t.startswith(LEAD_MARK)] == ["^pi"]
    assert tokenize("", 2, 3) == [] and tokenize(". ; !", 2, 3) == []


def test_featurizer_config_bounds_and_saved_configs_without_the_field() -> None:
    for bad in (-1, MAX_LEAD_WORDS + 1):
        with pytest.raises(ParamsError, match="lead_words must be in"):
            FeaturizerConfig(lead_words=bad)
    saved = FeaturizerConfig(ngrams=2, lead_words=3).to_dict()
    assert FeaturizerConfig.from_dict(saved).lead_words == 3
    del saved["lead_words"]  # a featurizer saved before the field: no leading word was marked
    assert FeaturizerConfig.from_dict(saved).lead_words == 0
    assert FeaturizerConfig.from_params(TrainParams()).lead_words == TrainParams().lead_words == 3


def test_a_request_is_featurized_with_the_marked_words_the_vocabulary_learned() -> None:
    texts = [r["text"] for r in _rows()]
    ds = Dataset(Y=sp.csr_matrix((len(texts), 1), dtype=np.float32), n_features=0, n_labels=1, texts=texts)
    raw: dict[str, Any] = {"min_df": 1, "tfidf": False, "l2": False, "sublinear_tf": False}
    lead = Featurizer(FeaturizerConfig(lead_words=1, **raw)).fit(ds)
    plain = Featurizer(FeaturizerConfig(lead_words=0, **raw)).fit(ds)
    assert _marked(lead.vocab) == {"^apple", "^pear", "^plum", "^engine", "^wheel", "^brake", "^wing",
                                   "^feather", "^nest", "^it"}
    assert not _marked(plain.vocab)
    x = lead.transform_texts(["apple pie. apple"])  # "apple" twice and leading twice
    assert lead.vocab is not None
    row = dict(zip(x.indices.tolist(), x.data.tolist(), strict=True))
    assert row[lead.vocab["apple"]] == row[lead.vocab["^apple"]] == pytest.approx(2.0)  # raw counts
    assert lead.terms_by_column("apple pie")[lead.vocab["^apple"]] == ["^apple"]


# ------------------------------------------------------------------------------------ TrainParams


def test_params_default_bounds_and_json_round_trip() -> None:
    assert TrainParams().lead_words == 3
    for bad in (-1, MAX_LEAD_WORDS + 1):
        with pytest.raises(ValidationError, match="lead_words") as refused:
            TrainParams(lead_words=bad)
        assert [e["loc"] for e in refused.value.errors()] == [("lead_words",)]
    for n in (0, 1, MAX_LEAD_WORDS):
        back = TrainParams.from_json_dict(json.loads(json.dumps(TrainParams(lead_words=n).to_json_dict())))
        assert back.lead_words == n and back == TrainParams(lead_words=n)
    old = TrainParams().to_json_dict()
    del old["lead_words"]  # params written before the field existed: no leading word was marked
    assert TrainParams.from_json_dict(old).lead_words == 0
    with pytest.raises(ParamsError, match="lead_words"):
        TrainParams.from_json_dict({"lead_words": -2})


# ------------------------------------------------------------------------------------ ovex train


def test_cli_lead_words_reach_the_saved_featurizer_and_params(
    texts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    for name, n in (("plain", 0), ("lead", 3)):
        model = texts[name]
        assert _featurizer_json(model)["config"]["lead_words"] == n
        assert json.loads((model / "config.json").read_text())["params"]["lead_words"] == n
        loaded = load_artifact(model)
        assert loaded.params.lead_words == n and loaded.featurizer.config.lead_words == n
        marked = _marked(loaded.featurizer.vocab)
        assert (marked == {"^apple", "^pear", "^plum", "^engine", "^wheel", "^brake", "^wing", "^feather",
                           "^nest", "^of", "^some", "^it", "^is", "^found"}) if n else not marked, marked
        # a request is featurized as training featurized it: its leading words marked with the option
        terms = loaded.featurizer.transform_texts(["apple of"]).nnz
        assert terms == (2 + 1 + 2 if n else 2 + 1)  # the words, their pair, then "^apple" and "^of"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "--lead-words LEAD_WORDS text: the first words of each sentence or clause" in helptext


@pytest.mark.parametrize(("value", "words"), [(str(MAX_LEAD_WORDS + 1), "less than or equal to"),
                                              ("-1", "greater than or equal to 0")])
def test_cli_lead_words_out_of_range_exits_2_naming_the_flag(
    texts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, words: str
) -> None:
    code = main(["train", "--train", str(texts["old"]), "--out", str(tmp_path / "m"), "--lead-words", value,
                 *FAST])
    err = capsys.readouterr().err
    assert code == 2 and "--lead-words" in err and words in err, err
    assert "Traceback" not in err and not (tmp_path / "m").exists()


# ------------------------------------------------------------------------------------ continual runs


def test_continual_run_keeps_the_base_lead_words_and_refuses_another(
    texts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["train", "--init-from", str(texts["plain"]), "--train", str(texts["all"]), "--out",
                 str(tmp_path / "refused"), "--lead-words", "3", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "lead_words=3 differs from the base model's lead_words=0" in err, err
    assert not (tmp_path / "refused").exists()
    for base, n in (("plain", 0), ("lead", 3)):
        grown = tmp_path / base
        assert main(["train", "--init-from", str(texts[base]), "--train", str(texts["all"]), "--out",
                     str(grown), "--quiet"]) == 0
        loaded = load_artifact(grown)
        assert loaded.params.lead_words == n and loaded.featurizer.config.lead_words == n
        vocab = loaded.featurizer.vocab
        assert vocab is not None and set(NEW) <= set(vocab)  # the vocabulary grew by the new words
        # and by their marked leading words only where the base marks them
        assert ({LEAD_MARK + w for w in NEW} <= _marked(vocab)) if n else not _marked(vocab)
    capsys.readouterr()


# ------------------------------------------------------------------------------------ old artifacts


def test_an_artifact_saved_before_the_field_reads_as_no_marked_words(
    texts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old"
    shutil.copytree(texts["plain"], old)  # no marked word, as every model was before the field
    config = json.loads((old / "config.json").read_text())
    del config["params"]["lead_words"]
    (old / "config.json").write_text(json.dumps(config, indent=2))
    fz = _featurizer_json(old)
    del fz["config"]["lead_words"]
    (old / "featurizer" / "featurizer.json").write_text(json.dumps(fz))

    loaded, fresh = load_artifact(old), load_artifact(texts["plain"])
    assert loaded.params.lead_words == 0 and loaded.params == fresh.params
    assert loaded.featurizer.config == fresh.featurizer.config and read_params(old)[0].lead_words == 0
    x = loaded.featurizer.transform_texts(["apple. engine wheel", "nest of some kind"])
    assert (x != fresh.featurizer.transform_texts(["apple. engine wheel", "nest of some kind"])).nnz == 0
    assert (loaded.topk(x, 2)[0] == fresh.topk(x, 2)[0]).all()
    assert main(["evaluate", str(old), str(texts["old"])]) == 0
    capsys.readouterr()


# ------------------------------------------------------------------------------------ jobs API


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("lead_srv")) as server:
        yield server


API_TINY = {"dim": 8, "epochs": 1, "batch_size": 16, "negatives": 8, "group_size": 4}


def test_a_job_trains_with_the_lead_words_it_was_given(srv: Server, texts: dict[str, Path]) -> None:
    data = srv.upload(texts["old"])["id"]
    jobs = {n: srv.submit({"model": f"lead{n}", "train_dataset": data,
                           "params": {**API_TINY, "lead_words": n}}) for n in (0, 1)}
    jobs[3] = srv.submit({"model": "lead3", "train_dataset": data, "params": API_TINY})
    for n, job_id in jobs.items():
        job = srv.wait(job_id, lambda j: j["state"] == "succeeded", 240, "the job to succeed")
        assert job["params"]["lead_words"] == n, job["params"]
        artifact = srv.models_dir / f"lead{n}" / str(job["model_version"])
        assert _featurizer_json(artifact)["config"]["lead_words"] == n
        assert bool(_marked(load_artifact(artifact).featurizer.vocab)) == (n > 0)
    # continuing the version without marked words: another value is refused before queueing
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])
    r = srv.client.post("/v1/jobs", json={"model": "lead0", "train_dataset": data, "base": {},
                                          "params": {"lead_words": 2}})
    assert r.status_code == 422, r.text
    assert "lead_words=2 differs from the base model's lead_words=0" in r.json()["detail"][0]["msg"], r.text
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs


@pytest.mark.parametrize(("value", "words"), [
    (MAX_LEAD_WORDS + 1, "less than or equal to"), (-1, "greater than or equal to 0"), ("3", "valid integer"),
])
def test_a_job_with_lead_words_out_of_range_is_a_422_naming_it(
    srv: Server, texts: dict[str, Path], value: Any, words: str
) -> None:
    data = srv.upload(texts["old"])["id"]
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": data,
                                          "params": {"lead_words": value}})
    assert r.status_code == 422, r.text
    errs = [e for e in r.json()["detail"] if e["loc"] == ["body", "params", "lead_words"]]
    assert errs and words in errs[0]["msg"], r.text
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs
