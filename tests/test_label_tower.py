"""Label texts: the reader, the label tower in training, `label_rows`, resume and continual runs."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_train import Recorder
from trainer.artifact import load_artifact
from trainer.data import Dataset
from trainer.errors import ArtifactError, DataFormatError, ParamsError, TrainingCancelled
from trainer.hooks import QuietHooks
from trainer.label_texts import MAX_LABEL_TEXT_CHARS, check_label_text, read_label_texts
from trainer.label_tower import fade_weights, has_label_tower, label_rows, load_tower_tensors, tower_of
from trainer.params import TrainParams
from trainer.step import Stepper
from trainer.train import train

# ------------------------------------------------------------------------------------ the reader


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"name": "a"}', "missing key 'text'"),
        ('{"text": "a"}', "missing key 'name'"),
        ('{"name": 3, "text": "a"}', "'name' must be a string"),
        ('{"name": "a", "text": null}', "'text' must be a string"),
        ('{"name": "", "text": "a"}', "'name' is empty"),
        ('{"name": "a", "text": "  "}', "'text' is empty"),
        ('{"name": "a", "text": "x", "id": 1}', "unknown key"),
        ('{"name": "a", "text": "bad \\ud800 half"}', "lone surrogate"),
        ('{"name": "first", "text": "again"}', "duplicate label name 'first' (first on line 1)"),
        (json.dumps({"name": "a", "text": "x" * (MAX_LABEL_TEXT_CHARS + 1)}), "at most 10,000"),
        (json.dumps({"name": "n" * 1001, "text": "x"}), "at most 1000"),
    ],
)
def test_reader_names_the_line_and_what_to_fix(tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "texts.jsonl"
    path.write_text('{"name": "first", "text": "a label"}\n\n' + line + "\n")
    with pytest.raises(DataFormatError) as info:
        read_label_texts(path)
    assert info.value.line == 3
    assert expected in info.value.message


def test_reader_reads_names_and_texts_in_order(tmp_path: Path) -> None:
    path = tmp_path / "texts.jsonl"
    path.write_text('\ufeff{"name": "b", "text": "bee"}\n{"name": "a", "text": "ay \\u00e9"}\n')
    assert read_label_texts(path) == [("b", "bee"), ("a", "ay é")]
    assert check_label_text("a", "fine") is None
    assert check_label_text("a", "") == "'text' is empty"


def test_reader_errors_on_empty_undecodable_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DataFormatError, match="no label texts"):
        read_label_texts(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"name": "a", "text": "b"}\n{"name": "\xff", "text": "b"}\n')
    with pytest.raises(DataFormatError) as info:
        read_label_texts(bad)
    assert info.value.line == 2 and "UTF-8" in info.value.message
    with pytest.raises(DataFormatError, match="cannot open"):
        read_label_texts(tmp_path / "absent.jsonl")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300) | st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_reader_raises_only_data_format_errors(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(raw)
    try:
        out = read_label_texts(path)
    except DataFormatError as exc:
        assert exc.line >= 1
        return
    assert out and all(check_label_text(n, t) is None for n, t in out)


# ------------------------------------------------------------------------------------ planted data

N_LABELS = 12


def planted(n_rows: int, seed: int = 0) -> tuple[Dataset, list[tuple[str, str]]]:
    """Rows about one of 12 labels (two of its three words, filler words, now and then a rare word);
    every label has a text of its own words, and two more labels (zeta, omega) have texts of rare words
    and no rows."""
    rng = random.Random(seed)
    words = {f"lab{k}": [f"w{k}a", f"w{k}b", f"w{k}c"] for k in range(N_LABELS)}
    filler = ["filler", "stuff", "thing"]
    rare = ["zetaa", "zetab", "zetac", "omegaa", "omegab", "omegac"]  # now and then, in any label's rows
    texts, rows = [], []
    for i in range(n_rows):
        k = i % N_LABELS
        toks = rng.sample(words[f"lab{k}"], 2) + rng.sample(filler, 2)
        if rng.random() < 0.1:
            toks.append(rng.choice(rare))
        rng.shuffle(toks)
        texts.append(" ".join(toks))
        rows.append([f"lab{k}"])
    names = list(words)
    index = {n: i for i, n in enumerate(names)}
    indptr = np.arange(n_rows + 1)
    y = sp.csr_matrix((np.ones(n_rows, np.float32), [index[r[0]] for r in rows], indptr),
                      shape=(n_rows, len(names)))
    ds = Dataset(Y=y, n_features=0, n_labels=len(names), texts=texts, label_names=names, path="<planted>")
    label_texts = [(n, " ".join(w)) for n, w in words.items()]
    label_texts += [("zeta", "zetaa zetab zetac"), ("omega", "omegaa omegab omegac")]
    return ds, label_texts


JOINT = {"label_tower_mode": "joint", "label_tower_detach": False}  # the tower in every step's rows


def _params(**kw: object) -> TrainParams:
    base: dict[str, object] = {"dim": 64, "epochs": 4, "batch_size": 32, "negatives": 8, "group_size": 4,
                               "dropout": 0.0}
    base.update(kw)
    return TrainParams(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tower",
    [{"label_tower_mode": "apart", "label_tower_detach": True}, JOINT, {**JOINT, "label_tower_live": 3},
     {"label_tower_mode": "joint", "label_tower_detach": True, "label_tower_fade": 2.0}],
    ids=["apart", "joint", "joint-live", "joint-faded"],
)
def test_a_label_without_rows_is_the_top_answer_for_its_text(tmp_path: Path,
                                                              tower: dict[str, object]) -> None:
    ds, label_texts = planted(600)
    train(_params(**tower), ds, None, out_dir=tmp_path / "m", hooks=QuietHooks(), label_texts=label_texts)
    model = load_artifact(tmp_path / "m")
    assert model.label_names[-2:] == ["zeta", "omega"]  # joined the label space without rows
    for query, want in (("zetaa zetab zetac", "zeta"), ("omegaa omegac omegab", "omega"),
                        ("w3a w3b", "lab3")):
        ids, _ = model.topk(model.featurizer.transform_texts([query]), 1)
        assert model.label_names[int(ids[0, 0])] == want
    # the same model trained without the texts has neither label and cannot compute rows from text
    train(_params(), ds, None, out_dir=tmp_path / "plain", hooks=QuietHooks())
    assert not has_label_tower(tmp_path / "plain")
    with pytest.raises(ArtifactError, match="without label texts"):
        label_rows(tmp_path / "plain", ["zetaa"])


def test_apart_labels_with_rows_train_as_without_texts_and_the_tower_learns(tmp_path: Path) -> None:
    ds, label_texts = planted(300)
    with_rows = [(n, t) for n, t in label_texts if n.startswith("lab")]  # no text-only label: same sampler
    # unshifted, as a model with label texts is by default
    plain = train(_params(epochs=2, logit_adjust=0.0), ds, None, out_dir=tmp_path / "plain",
                  hooks=QuietHooks())
    # without text rows, which are training rows of their own
    apart = train(_params(epochs=2, label_tower_mode="apart", label_tower_detach=True, label_text_rows=False),
                  ds, None, out_dir=tmp_path / "apart", hooks=QuietHooks(), label_texts=with_rows)
    joint = train(_params(epochs=2, label_tower_mode="joint", label_tower_detach=True, label_text_rows=False),
                  ds, None, out_dir=tmp_path / "joint", hooks=QuietHooks(), label_texts=with_rows)
    heads = {name: load_artifact(tmp_path / name).model.head.detach().numpy()
             for name in ("plain", "apart", "joint")}
    np.testing.assert_allclose(heads["apart"], heads["plain"], rtol=1e-5, atol=1e-6)
    assert np.abs(heads["joint"] - heads["plain"]).max() > 1e-3  # the joint rows do carry the tower
    assert apart.final_loss > plain.final_loss  # the tower's own loss is part of the step's
    assert joint.final_loss != apart.final_loss
    proj = load_tower_tensors(tmp_path / "apart")["proj"]
    assert (proj - torch.eye(proj.shape[0])).abs().max() > 1e-4  # the map learned from the texts
    assert json.loads((tmp_path / "apart" / "label_tower.json").read_text())["mode"] == "apart"


def test_fade_weights_share_the_tower_by_training_rows() -> None:
    counts = np.array([0, 2, 6, 0])
    np.testing.assert_array_equal(fade_weights(counts, 0.0), np.ones(4, np.float32))
    np.testing.assert_allclose(fade_weights(counts, 2.0), [1.0, 0.5, 0.25, 1.0])
    assert fade_weights(counts, 2.0).dtype == np.float32


def test_label_rows_equal_the_saved_rows_of_labels_without_rows(tmp_path: Path) -> None:
    ds, label_texts = planted(300)
    train(_params(epochs=2), ds, None, out_dir=tmp_path / "m", hooks=QuietHooks(), label_texts=label_texts)
    model = load_artifact(tmp_path / "m")
    rows, bias = label_rows(tmp_path / "m", ["zetaa zetab zetac", "omegaa omegab omegac"])
    d = model.model.shape.dim
    head = model.model.head.detach().numpy()
    assert rows.dtype == np.float32 and rows.shape == (2, d) and bias.shape == (2,)
    np.testing.assert_allclose(rows, head[-2:, :d], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bias, head[-2:, d], rtol=1e-6)
    assert np.abs(rows).max() > 0
    stored = [json.loads(line) for line in (tmp_path / "m" / "label_texts.jsonl").read_text().splitlines()]
    assert [s["name"] for s in stored] == model.label_names
    assert stored[-1] == {"name": "omega", "text": "omegaa omegab omegac"}
    # a text of words the model does not know gets an empty row (it scores as the bias alone)
    rows, _ = label_rows(tmp_path / "m", ["unknownword"])
    assert not rows.any()


@contextlib.contextmanager
def _spying(method: str, record: Callable[..., None]) -> Iterator[None]:
    """Within the block every call of `Stepper.<method>` also calls record(stepper, result, *args)."""
    original = getattr(Stepper, method)

    def spy(self: Stepper, *args: Any) -> Any:
        out = original(self, *args)
        record(self, out, *args)
        return out

    setattr(Stepper, method, spy)
    try:
        yield
    finally:
        setattr(Stepper, method, original)


def _stepper_embeds(tmp_path: Path, extra_labels: int, **kw: object) -> tuple[int, int]:
    """Labels embedded per step, and the step's candidate count, with `extra_labels` text-only labels."""
    ds, label_texts = planted(200)
    label_texts += [(f"more{i}", f"w{i % N_LABELS}a zetaa") for i in range(extra_labels)]
    seen: list[tuple[int, int]] = []

    def record(stepper: Stepper, out: Any, inp: Any, lr: float) -> None:
        tower = tower_of(stepper.model)
        assert tower is not None
        seen.append((tower.embedded, int(inp.cand.label_ids.numel())))

    with _spying("learn", record):
        train(_params(epochs=1, negatives=8, **kw), ds, None, out_dir=None, hooks=QuietHooks(),
              label_texts=label_texts)
    return max(e for e, _ in seen), max(c for _, c in seen)


def test_step_embeds_only_its_candidate_labels_whatever_k(tmp_path: Path) -> None:
    small = _stepper_embeds(tmp_path, 10)
    large = _stepper_embeds(tmp_path, 20_000)
    for embedded, candidates in (small, large):
        assert embedded == candidates <= 8 + N_LABELS  # sampled negatives plus the batch's positives
    assert large[0] <= small[0]
    # with a live sample a step embeds that many of its candidates' texts, whatever K
    for extra in (10, 20_000):
        embedded, candidates = _stepper_embeds(tmp_path, extra, label_tower_live=5, **JOINT)
        assert embedded == 5 < candidates


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n_cand=st.integers(2, 30), live=st.integers(1, 30),
       hidden=st.sampled_from([0, 1]))
def test_a_live_sample_embeds_its_texts_and_reads_the_rest_from_the_refreshed_cache(
    seed: int, n_cand: int, live: int, hidden: int
) -> None:
    """`LabelTower.rows` with a live sample: right after a refresh every candidate's row is the exact
    γ·s·enc(text)·P; once the encoder moves, the live columns' rows are the new ones (and go into the cache)
    while the others are the cached ones, and the gradient reaches the input table through the live
    texts alone."""
    from trainer.label_tower import LabelTower, TextRows
    from trainer.model import ModelShape, XCModel, project_rows

    rng = np.random.default_rng(seed)
    k, f, d = 40, 60, 8
    x = sp.random(k, f, density=0.08, format="csr", random_state=seed, dtype=np.float32)
    shape = ModelShape(n_features=f, n_labels=k, dim=d, encoder="mlp" if hidden else "linear", hidden=hidden)
    model = XCModel(shape, seed=seed)
    model.train()
    weight = rng.uniform(0.2, 1.0, k).astype(np.float32)
    tower = LabelTower(TextRows.from_csr(x), 1.7, np.zeros(k, bool), d, weight=weight, live=live)
    with torch.no_grad():
        tower.proj.add_(torch.from_numpy(rng.normal(0, 0.3, (d, d)).astype(np.float32)))
    labels = torch.from_numpy(rng.choice(k, n_cand, replace=False).astype(np.int64))
    cols = tower.live_columns(n_cand, seed, 0, 0)
    if live >= n_cand:
        assert cols is None
        return
    assert cols is not None and cols.numel() == live == cols.unique().numel()
    assert torch.equal(cols, tower.live_columns(n_cand, seed, 0, 0))  # the same draw on a resumed run
    assert len({tuple(tower.live_columns(n_cand, seed, 0, start).tolist()) for start in range(20)}) > 1

    def exact(m: XCModel) -> torch.Tensor:
        with torch.no_grad():
            z = m.encode(x) @ tower.proj
        return tower.gain.detach() * z * torch.from_numpy(weight).unsqueeze(1)

    def step_rows() -> torch.Tensor:
        ind, off, val = tower.texts.gather(labels.index_select(0, cols))
        table = model.input_weight.detach().clone().requires_grad_()
        rows = tower.rows(model, project_rows(table, ind, off, val),
                          torch.from_numpy(weight).index_select(0, labels), labels, cols)
        rows.sum().backward()
        assert table.grad is not None
        touched = set(torch.nonzero(table.grad.abs().sum(1)).squeeze(1).tolist())
        live_features = set(ind.tolist())
        assert touched <= live_features
        return rows.detach()

    tower.refresh(model)
    np.testing.assert_allclose(step_rows(), exact(model)[labels], rtol=1e-4, atol=1e-5)
    before = exact(model)
    with torch.no_grad():  # the encoder moves, as training moves it
        model.input_weight.add_(torch.from_numpy(rng.normal(0, 0.5, (f, d)).astype(np.float32)))
    after = exact(model)
    rows = step_rows()
    is_live = torch.zeros(n_cand, dtype=torch.bool)
    is_live[cols] = True
    np.testing.assert_allclose(rows[is_live], after[labels][is_live], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rows[~is_live], before[labels][~is_live], rtol=1e-4, atol=1e-5)
    assert tower.cache is not None
    cached = tower.cache * tower.gain.detach() * torch.from_numpy(weight).unsqueeze(1)
    np.testing.assert_allclose(cached[labels[is_live]], after[labels[is_live]], rtol=1e-4, atol=1e-5)


def _embedding_steps(tower: dict[str, object], epochs: int = 2) -> list[tuple[int, bool]]:
    """(position in its epoch, whether it embedded texts) of each step of a run on 300 planted rows."""
    ds, label_texts = planted(300)
    seen: list[tuple[int, bool]] = []

    def record(stepper: Stepper, out: Any, ep: Any, i: int, j: int) -> None:
        seen.append((i // stepper.params.batch_size, out.text_inverse is not None))

    with _spying("inputs", record):
        train(_params(epochs=epochs, **tower), ds, None, out_dir=None, hooks=QuietHooks(),
              label_texts=label_texts)
    return seen


def test_an_apart_tower_trains_on_every_nth_step_of_each_epoch_and_a_joint_one_on_all() -> None:
    apart = _embedding_steps({"label_tower_mode": "apart", "label_tower_detach": True,
                              "label_tower_every": 3})
    per_epoch = -(-300 // 32)
    assert [pos for pos, _ in apart] == list(range(per_epoch)) * 2
    assert [pos for pos, embeds in apart if embeds] == [0, 3, 6, 9] * 2
    joint = _embedding_steps({"label_tower_mode": "joint", "label_tower_every": 3}, epochs=1)
    assert len(joint) == per_epoch and all(embeds for _, embeds in joint)  # its rows hold the texts


def test_label_tower_every_round_trips_and_older_params_read_as_every_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pydantic import ValidationError

    from service.cli import build_parser
    from trainer.cli import params_from_args

    assert TrainParams().label_tower_every == 16
    with pytest.raises(ValidationError, match="label_tower_every"):
        TrainParams(label_tower_every=0)
    data = json.loads(json.dumps(TrainParams(label_tower_every=5).to_json_dict()))
    assert TrainParams.from_json_dict(data).label_tower_every == 5
    del data["label_tower_every"]  # params saved before the field: the tower trained on every step
    assert TrainParams.from_json_dict(data).label_tower_every == 1
    args = build_parser().parse_args(["train", "--train", "x.jsonl", "--out", "m",
                                      "--label-tower-every", "4"])
    assert params_from_args(args).label_tower_every == 4


def test_label_tower_live_round_trips_and_older_params_read_as_every_text() -> None:
    from pydantic import ValidationError

    from service.cli import build_parser
    from trainer.cli import params_from_args

    assert TrainParams().label_tower_live == 0  # the default docs/training.md gives the evidence for
    for bad in (-1, 100_001):
        with pytest.raises(ValidationError, match="label_tower_live"):
            TrainParams(label_tower_live=bad)
    data = json.loads(json.dumps(TrainParams(label_tower_live=64).to_json_dict()))
    assert TrainParams.from_json_dict(data).label_tower_live == 64
    del data["label_tower_live"]  # params saved before the field: a joint step embedded every text
    assert TrainParams.from_json_dict(data).label_tower_live == 0
    args = build_parser().parse_args(["train", "--train", "x.jsonl", "--out", "m", "--label-tower-live", "0"])
    assert params_from_args(args).label_tower_live == 0


def test_text_rows_and_zero_scale_round_trip_and_older_params_read_as_before() -> None:
    from pydantic import ValidationError

    from service.cli import build_parser
    from trainer.cli import params_from_args

    for bad in (0, -1, 101):
        with pytest.raises(ValidationError, match="label_tower_zero_scale"):
            TrainParams(label_tower_zero_scale=bad)
    given = TrainParams(label_text_rows=not TrainParams().label_text_rows, label_tower_zero_scale=0.5)
    data = json.loads(json.dumps(given.to_json_dict()))
    back = TrainParams.from_json_dict(data)
    assert (back.label_text_rows, back.label_tower_zero_scale) == (given.label_text_rows, 0.5)
    del data["label_text_rows"], data["label_tower_zero_scale"]  # params saved before the fields
    older = TrainParams.from_json_dict(data)
    assert (older.label_text_rows, older.label_tower_zero_scale) == (False, 1.0)
    parser = build_parser()
    for flag, want in (("--label-text-rows", True), ("--no-label-text-rows", False)):
        args = parser.parse_args(["train", "--train", "x.jsonl", "--out", "m", flag,
                                  "--label-tower-zero-scale", "0.75"])
        p = params_from_args(args)
        assert (p.label_text_rows, p.label_tower_zero_scale) == (want, 0.75)


def test_text_rows_are_the_texts_of_labels_with_rows_each_labelled_with_its_own() -> None:
    from trainer.label_tower import LabelTower, TextRows, with_text_rows

    rng = np.random.default_rng(0)
    n_features = 9
    # label 0: a text and rows; 1: a text, no rows; 2: no text; 3: a text and rows
    texts = sp.csr_matrix(np.array([[0, 1, 0, 2, 0, 0, 0, 0, 0], [0, 0, 0, 0, 3, 0, 0, 0, 0],
                                    [0, 0, 0, 0, 0, 0, 0, 0, 0], [0.5, 0, 0, 0, 0, 0, 0, 0, 4]], np.float32))
    tower = LabelTower(TextRows.from_csr(texts), 1.0, np.array([False, True, False, False]), 8)
    x = sp.csr_matrix(rng.random((5, n_features)).astype(np.float32))
    y = sp.csr_matrix(np.array([[1, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1], [0, 0, 0, 1], [0, 0, 1, 0]],
                               np.float32))
    x2, y2 = with_text_rows(x, y, tower)
    assert x2.dtype == x.dtype and y2.dtype == y.dtype and x2.shape == (7, n_features) and y2.shape == (7, 4)
    np.testing.assert_array_equal(x2[:5].toarray(), x.toarray())
    np.testing.assert_array_equal(y2[:5].toarray(), y.toarray())
    np.testing.assert_array_equal(x2[5:].toarray(), texts[[0, 3]].toarray())
    np.testing.assert_array_equal(y2[5:].toarray(), np.eye(4, dtype=np.float32)[[0, 3]])


def test_a_run_with_text_rows_trains_on_them_and_saves_its_own_rows_counts(tmp_path: Path) -> None:
    ds, label_texts = planted(300)
    runs = {}
    for rows in (False, True):
        rec = Recorder()
        runs[rows] = train(_params(epochs=1, label_text_rows=rows), ds, None, out_dir=tmp_path / str(rows),
                           hooks=rec, label_texts=label_texts)
        # 12 labels have rows and a text; zeta and omega (no rows) get no row of their text
        assert any(f"on {300 + 12 * rows} rows per epoch" in m for m in rec.logs), rec.logs
    model = load_artifact(tmp_path / "True")
    assert model.label_counts is not None  # what PSP@k and the tower's scale read: the training rows alone
    np.testing.assert_array_equal(model.label_counts, [25] * 12 + [0, 0])
    assert json.loads((tmp_path / "True" / "config.json").read_text())["n_train_rows"] == 300
    plain = load_artifact(tmp_path / "False").model.head.detach().numpy()
    assert np.abs(model.model.head.detach().numpy()[:12] - plain[:12]).max() > 1e-3


def test_zero_scale_sets_the_norm_of_labels_without_rows_and_nothing_else(tmp_path: Path) -> None:
    ds, label_texts = planted(300)
    heads, configs = {}, {}
    for scale in (1.0, 0.5):
        out = tmp_path / str(scale)
        train(_params(epochs=1, label_tower_zero_scale=scale), ds, None, out_dir=out, hooks=QuietHooks(),
              label_texts=label_texts)
        heads[scale] = load_artifact(out).model.head.detach().numpy()
        configs[scale] = json.loads((out / "label_tower.json").read_text())
    np.testing.assert_array_equal(heads[0.5][:12], heads[1.0][:12])  # training does not read it
    assert configs[0.5]["zero_row_norm"] == pytest.approx(0.5 * configs[1.0]["zero_row_norm"], rel=1e-6)
    d = heads[1.0].shape[1] - 1
    np.testing.assert_allclose(np.linalg.norm(heads[0.5][12:, :d], axis=1), configs[0.5]["zero_row_norm"],
                               rtol=1e-5)
    rows, _ = label_rows(tmp_path / "0.5", ["zetaa zetab zetac"])  # a label added later: the same norm
    assert np.linalg.norm(rows[0]) == pytest.approx(configs[0.5]["zero_row_norm"], rel=1e-5)


@pytest.mark.parametrize(
    ("tower", "every", "stop"),
    [(JOINT, 5, 12),
     ({"label_tower_mode": "apart", "label_tower_detach": True, "label_tower_every": 4}, 5, 12),
     ({**JOINT, "label_tower_live": 3}, 3, 8)],
    ids=["joint", "apart", "joint-live-mid-epoch"],
)
def test_resume_restores_the_tower(tmp_path: Path, tower: dict[str, object], every: int, stop: int) -> None:
    ds, label_texts = planted(300)
    params = _params(epochs=2, dropout=0.2, **tower)
    train(params, ds, None, out_dir=tmp_path / "full", hooks=Recorder(), label_texts=label_texts)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(TrainingCancelled):
        train(params, ds, None, out_dir=None, hooks=Recorder(stop_after=stop), checkpoint_dir=ckpt,
              checkpoint_every=every, label_texts=label_texts)
    resumed = train(params, ds, None, out_dir=tmp_path / "m", hooks=Recorder(), checkpoint_dir=ckpt,
                    checkpoint_every=every, label_texts=label_texts)
    assert resumed.resumed_from_step == stop - stop % every  # mid-epoch for the live sample: its cache
    a, b = load_artifact(tmp_path / "full"), load_artifact(tmp_path / "m")  # comes back with it
    np.testing.assert_allclose(a.head_weight, b.head_weight, rtol=1e-4, atol=1e-5)
    ga = json.loads((tmp_path / "full" / "label_tower.json").read_text())["gain"]
    gb = json.loads((tmp_path / "m" / "label_tower.json").read_text())["gain"]
    assert ga == pytest.approx(gb, rel=1e-5) and ga != 1.0  # the gain learned, and was restored


def test_continual_runs_keep_the_tower(tmp_path: Path) -> None:
    ds, label_texts = planted(300)
    train(_params(epochs=2), ds, None, out_dir=tmp_path / "base", hooks=QuietHooks(), label_texts=label_texts)
    more, _ = planted(120, seed=1)
    # without new texts: the base's texts and tower carry over, its served rows are where training starts
    train(_params(epochs=1), more, None, out_dir=tmp_path / "c1", hooks=QuietHooks(), base=tmp_path / "base")
    assert has_label_tower(tmp_path / "c1")
    c1 = load_artifact(tmp_path / "c1")
    assert c1.label_names[-2:] == ["zeta", "omega"]
    rows, _ = label_rows(tmp_path / "c1", ["zetaa zetab zetac"])
    np.testing.assert_allclose(rows[0], c1.model.head.detach().numpy()[-2, :-1], rtol=1e-5, atol=1e-6)
    ids, _ = c1.topk(c1.featurizer.transform_texts(["zetaa zetab zetac"]), 1)
    assert c1.label_names[int(ids[0, 0])] == "zeta"
    # with new texts: a new label joins by its text alone
    train(_params(epochs=1), more, None, out_dir=tmp_path / "c2", hooks=QuietHooks(), base=tmp_path / "c1",
          label_texts=[("kappa", "filler stuff thing")])
    c2 = load_artifact(tmp_path / "c2")
    assert c2.label_names[-1] == "kappa" and c2.model.shape.n_labels == N_LABELS + 3
    # a base trained without texts, continued with them, gets a tower
    train(_params(epochs=1), ds, None, out_dir=tmp_path / "plain", hooks=QuietHooks())
    train(_params(epochs=1), more, None, out_dir=tmp_path / "c3", hooks=QuietHooks(), base=tmp_path / "plain",
          label_texts=label_texts)
    assert has_label_tower(tmp_path / "c3")
    assert load_artifact(tmp_path / "c3").label_names[-2:] == ["zeta", "omega"]


def test_label_texts_are_refused_where_the_tower_cannot_run(tmp_path: Path) -> None:
    ds, label_texts = planted(50)
    with pytest.raises(ParamsError, match="sampled loss"):
        train(_params(loss="softmax", group_size=1), ds, None, out_dir=None, hooks=QuietHooks(),
              label_texts=label_texts)
    xc = Dataset(Y=ds.Y, n_features=4, n_labels=ds.n_labels, X=sp.csr_matrix(np.ones((50, 4), np.float32)))
    with pytest.raises(ParamsError, match="text training set"):
        train(_params(), xc, None, out_dir=None, hooks=QuietHooks(), label_texts=label_texts)


def test_cli_trains_with_label_texts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli import main

    ds, label_texts = planted(120)
    assert ds.texts is not None and ds.label_names is not None
    train_path = tmp_path / "train.jsonl"
    train_path.write_text("".join(json.dumps({"text": t, "labels": [ds.label_names[int(j)]]}) + "\n"
                                  for t, j in zip(ds.texts, ds.Y.indices, strict=True)))
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"name": n, "text": t}) + "\n" for n, t in label_texts))
    assert main(["train", "--train", str(train_path), "--out", str(tmp_path / "m"), "--label-texts",
                 str(texts), "--dim", "32", "--epochs", "1", "--quiet"]) == 0
    assert has_label_tower(tmp_path / "m")
    texts.write_text('{"name": "x", "text": ""}\n')
    assert main(["train", "--train", str(train_path), "--out", str(tmp_path / "m2"), "--label-texts",
                 str(texts), "--quiet"]) != 0
    assert "texts.jsonl:1: 'text' is empty" in capsys.readouterr().err
    assert not (tmp_path / "m2").exists()
