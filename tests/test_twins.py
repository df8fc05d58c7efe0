"""Twins: a label whose text is an input's own text. A run with label texts counts how its training rows
treat theirs; when they never carry them, the saved model leaves an input's twins out of its answers, in
the trainer's scoring and in the service's, and keeps them where the rows say a twin is an answer.
Also `label_tower_zero_bias`, the bias added to the labels known by their text alone."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from service.serving.predictor import InputRow, Options
from service.serving.registry import load_served
from service.settings import Settings
from trainer import metrics as xc_metrics
from trainer.artifact import load_artifact
from trainer.data import Dataset
from trainer.hooks import QuietHooks
from trainer.params import TrainParams
from trainer.train import train
from trainer.twins import (
    TWIN_EVIDENCE,
    TWIN_RARELY,
    Twins,
    count_twins,
    drop_excluded,
    same_text,
    twin_index,
)

N_KINDS = 6


def taxonomy(n_rows: int, twins_are_labels: bool, seed: int = 0) -> tuple[Dataset, list[tuple[str, str]]]:
    """Things of 6 kinds: a thing's row has two of its kind's words and a word of its own. Each kind k
    also has a sub-kind `sub{k}`, itself a label (of the things below it, every third row of kind k)
    whose text is the text of some rows of kind k: those rows' twin. On a taxonomy a thing is not its
    own kind, so the twin is not the row's label (`twins_are_labels` False); the other case puts it
    among the row's labels."""
    rng = random.Random(seed)
    names = [f"kind{k}" for k in range(N_KINDS)] + [f"sub{k}" for k in range(N_KINDS)]
    index = {n: i for i, n in enumerate(names)}
    texts, labels = [], []
    for i in range(n_rows):
        k = i % N_KINDS
        if i % 5 == 0:  # the sub-kind's own row: its text is the label `sub{k}`'s
            texts.append(f"k{k}a k{k}b subword{k}")
            labels.append([f"kind{k}", f"sub{k}"] if twins_are_labels else [f"kind{k}"])
            continue
        words = [*rng.sample([f"k{k}a", f"k{k}b", f"k{k}c"], 2), f"own{i}"]
        texts.append(" ".join(words))
        labels.append([f"kind{k}", f"sub{k}"] if i % 3 == 0 else [f"kind{k}"])
    rows = [index[n] for ls in labels for n in ls]
    indptr = np.cumsum([0] + [len(ls) for ls in labels])
    y = sp.csr_matrix((np.ones(len(rows), np.float32), rows, indptr), shape=(n_rows, len(names)))
    ds = Dataset(Y=y, n_features=0, n_labels=len(names), texts=texts, label_names=names, path="<taxonomy>")
    label_texts = [(f"kind{k}", f"k{k}a k{k}b k{k}c") for k in range(N_KINDS)]
    label_texts += [(f"sub{k}", f"k{k}a k{k}b subword{k}") for k in range(N_KINDS)]
    return ds, label_texts


def _params(**kw: object) -> TrainParams:
    base: dict[str, object] = {"dim": 32, "epochs": 3, "batch_size": 32, "negatives": 4, "group_size": 4,
                               "dropout": 0.0, "eval_every": 0}
    base.update(kw)
    return TrainParams(**base)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 200), labelled=st.integers(0, 200))
def test_twins_are_excluded_only_on_enough_rows_that_rarely_carry_them(rows: int, labelled: int) -> None:
    labelled = min(labelled, rows)
    twins = Twins(rows, labelled)
    assert twins.excluded == (rows >= TWIN_EVIDENCE and labelled / rows < 1 / TWIN_RARELY)


def test_count_twins_matches_texts_by_words_not_by_case_or_spacing() -> None:
    names = ["a", "b", "c"]
    texts = {"a": "Red  Apple", "b": "green pear", "c": "red apple"}
    y = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32))
    # row 0: twins a and c, neither its label; row 1: twins a and c, a its label; row 2: none
    got = count_twins([" red apple", "RED APPLE ", "yellow"], twin_index(names, texts), y)
    assert got == Twins(rows=2, labelled=1)
    assert same_text("  Red\tApple ") == same_text("red apple")


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 8), n_ex=st.integers(0, 3))
def test_drop_excluded_is_the_top_k_of_the_labels_left(seed: int, k: int, n_ex: int) -> None:
    rng = np.random.default_rng(seed)
    n, width = 4, k + n_ex
    scores = np.sort(rng.normal(size=(n, width)).astype(np.float32), axis=1)[:, ::-1]
    ids = np.stack([rng.permutation(50)[:width] for _ in range(n)])
    exclude = [rng.choice(ids[r], size=min(n_ex, width), replace=False).tolist() if r % 2 else []
               for r in range(n)]
    got_ids, got_scores, cut_best = drop_excluded(ids, scores, exclude, k)
    for r in range(n):
        left = [c for c in range(width) if ids[r, c] not in exclude[r]]
        keep = left[:k]
        want = ids[r, keep].tolist() + [-1] * (k - len(keep))
        assert got_ids[r].tolist() == want
        assert cut_best[r] == (scores[r, left[k]] if len(left) > k else -np.inf)  # the best cut off
        assert np.all(np.isneginf(got_scores[r, len(keep):]))
        np.testing.assert_array_equal(got_scores[r, : len(keep)], scores[r, keep])


@pytest.mark.parametrize("mode", ["joint", "apart"])
def test_a_twin_the_rows_never_carry_is_left_out_of_answers_in_training_scores_and_service(
    tmp_path: Path, mode: str
) -> None:
    ds, label_texts = taxonomy(480, twins_are_labels=False)
    out = tmp_path / "m" / "1"
    result = train(_params(label_tower_mode=mode), ds, ds, out_dir=out, hooks=QuietHooks(),
                   label_texts=label_texts)
    config = json.loads((out / "label_tower.json").read_text())
    assert config["twins"] == {"rows": 96, "labelled": 0, "excluded": True}
    model = load_artifact(out)
    # the run's own evaluation scores what will be served: twins left out
    assert ds.texts is not None
    top, _ = model.topk(model.featurizer.transform(ds), 5, exclude=model.excluded(ds.texts))
    assert result.metrics["p@1"] == pytest.approx(xc_metrics.precision_at_k(top, ds.Y, 1))
    text = "k2a k2b subword2"  # sub2's own text: a thing of kind 2, never labelled sub2
    sub2 = model.label_names.index("sub2")
    assert model.excluded([text, "k2a k2c", None]) == [[sub2], [], []]
    x = model.featurizer.transform_texts([text])
    ids, _ = model.topk(x, 5)
    assert sub2 in ids[0].tolist()  # the model as trained ranks the twin among its best...
    ids, scores = model.topk(x, 5, exclude=model.excluded([text]))
    assert sub2 not in ids[0].tolist() and model.label_names[int(ids[0, 0])] == "kind2"  # ...served: left out
    assert np.all(np.diff(scores[0]) <= 0)
    served = load_served("m", "1", out, Settings(models_dir=tmp_path, data_dir=tmp_path))
    for norm in ("sparsemax", "evsoftmax", "softmax", "none"):
        for exact in (False, True):
            (row,) = served.predictor.predict([InputRow(text=text)], Options(5, norm, exact))  # type: ignore[arg-type]
            names = [lb.name for lb in row.labels]
            assert "sub2" not in names and names[0] == "kind2", (norm, exact, names)
            if exact:
                assert row.certified
    # another input is answered as before: the rule is the input's own text, not the label
    (row,) = served.predictor.predict([InputRow(text="k2a k2c subword2")], Options(5, "none", True))
    plain, _ = model.topk(model.featurizer.transform_texts(["k2a k2c subword2"]), 5)
    assert [lb.id for lb in row.labels] == plain[0].tolist()


def test_a_twin_the_rows_carry_stays_an_answer(tmp_path: Path) -> None:
    ds, label_texts = taxonomy(480, twins_are_labels=True)
    out = tmp_path / "m"
    train(_params(), ds, None, out_dir=out, hooks=QuietHooks(), label_texts=label_texts)
    assert json.loads((out / "label_tower.json").read_text())["twins"] == {
        "rows": 96, "labelled": 96, "excluded": False}
    model = load_artifact(out)
    text = "k2a k2b subword2"
    assert model.twins is None and model.excluded([text]) == [[]]
    ids, _ = model.topk(model.featurizer.transform_texts([text]), 2)
    assert {model.label_names[int(i)] for i in ids[0]} == {"kind2", "sub2"}


def test_label_tower_zero_bias_moves_the_text_only_labels_bias_and_round_trips(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from service.cli import build_parser
    from trainer.cli import params_from_args

    assert TrainParams().label_tower_zero_bias == 2.5  # the default docs/training.md gives the evidence for
    for bad in (-101.0, 101.0, float("nan")):
        with pytest.raises(ValidationError, match="label_tower_zero_bias"):
            TrainParams(label_tower_zero_bias=bad)
    data = json.loads(json.dumps(TrainParams(label_tower_zero_bias=1.25).to_json_dict()))
    assert TrainParams.from_json_dict(data).label_tower_zero_bias == 1.25
    del data["label_tower_zero_bias"]  # params saved before the field: text-only labels had no shift
    assert TrainParams.from_json_dict(data).label_tower_zero_bias == 0.0
    args = build_parser().parse_args(["train", "--train", "x.jsonl", "--out", "m",
                                      "--label-tower-zero-bias", "-0.5"])
    assert params_from_args(args).label_tower_zero_bias == -0.5
    ds, label_texts = taxonomy(240, twins_are_labels=False)
    label_texts = [*label_texts, ("newkind", "k1a newword")]  # no row carries it
    biases = []
    for shift in (0.0, 1.5):
        out = tmp_path / f"z{shift}"
        train(_params(label_tower_zero_bias=shift), ds, None, out_dir=out, hooks=QuietHooks(),
              label_texts=label_texts)
        model = load_artifact(out)
        biases.append(float(model.head_bias[model.label_names.index("newkind")]))
        stored = json.loads((out / "label_tower.json").read_text())["zero_row_bias"]
        assert biases[-1] == pytest.approx(stored)
    assert biases[1] - biases[0] == pytest.approx(1.5, abs=1e-5)  # the same run otherwise
