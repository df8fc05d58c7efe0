"""Artifact round trip (save → load → identical scores) and one clear ArtifactError per kind of damage."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from trainer.artifact import SCHEMA_VERSION, load_artifact, save_artifact
from trainer.data import Dataset
from trainer.errors import ArtifactError
from trainer.featurize import Featurizer
from trainer.model import ModelShape, XCModel
from trainer.params import TrainParams

N_FEATURES, N_LABELS, DIM = 40, 12, 8


def _data(rows: int = 30, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    x = sp.random(rows, N_FEATURES, density=0.2, format="csr", dtype=np.float32, random_state=seed)
    y = sp.csr_matrix((np.ones(rows, dtype=np.float32), rng.integers(0, N_LABELS, rows), np.arange(rows + 1)),
                      shape=(rows, N_LABELS))
    return Dataset(Y=y, n_features=N_FEATURES, n_labels=N_LABELS, X=x)


def _model(encoder: str = "linear", hidden: int = 0) -> XCModel:
    model = XCModel(ModelShape(N_FEATURES, N_LABELS, DIM, encoder=encoder, hidden=hidden), seed=3)
    with torch.no_grad():  # a non-trivial head, so the round trip is tested on real values
        model.head.copy_(torch.randn_like(model.head))
        model.input_bias.copy_(torch.randn_like(model.input_bias))
    return model


def _save(tmp_path: Path, encoder: str = "linear", hidden: int = 0) -> tuple[Path, XCModel, Dataset]:
    ds = _data()
    feat = Featurizer.fit(ds)
    model = _model(encoder, hidden)
    params = TrainParams(dim=DIM, encoder=encoder, hidden=hidden)  # type: ignore[arg-type]
    names = [f"label {i} \"quoted\"\tand tab" for i in range(N_LABELS)]
    out = save_artifact(tmp_path / "model", model, feat, names, params, {"p@1": 0.5},
                        label_counts=np.arange(N_LABELS), n_train_rows=30)
    return out, model, ds


@pytest.mark.parametrize(("encoder", "hidden"), [("linear", 0), ("mlp", 2)])
def test_round_trip_gives_identical_scores(tmp_path: Path, encoder: str, hidden: int) -> None:
    out, model, ds = _save(tmp_path, encoder, hidden)
    loaded = load_artifact(out)
    x = loaded.featurizer.transform(ds)
    expected = model.score(model.encode(x)).numpy()
    np.testing.assert_array_equal(loaded.scores(x), expected)
    np.testing.assert_array_equal(loaded.head_weight, model.head_weight.numpy())
    np.testing.assert_array_equal(loaded.head_bias, model.head_bias.numpy())
    assert loaded.encode(x).shape == (ds.n_rows, DIM) and loaded.encode(x).dtype == np.float32
    assert loaded.label_names[0] == "label 0 \"quoted\"\tand tab"
    assert (loaded.n_features, loaded.n_labels, loaded.dim) == (N_FEATURES, N_LABELS, DIM)
    assert loaded.metrics == {"p@1": 0.5}
    assert loaded.config["schema_version"] == SCHEMA_VERSION
    prop = loaded.propensities()
    assert prop is not None and prop.shape == (N_LABELS,) and np.all(np.diff(prop) > 0)
    ids, scores = loaded.topk(x, 3)
    np.testing.assert_array_equal(ids, np.argsort(-expected, axis=1, kind="stable")[:, :3])
    np.testing.assert_allclose(scores, np.take_along_axis(expected, ids, axis=1), rtol=1e-6)
    assert np.all(np.diff(scores, axis=1) <= 0)


def test_save_replaces_an_existing_model_and_leaves_no_temp_dirs(tmp_path: Path) -> None:
    out, _, _ = _save(tmp_path)
    out2, _, _ = _save(tmp_path)
    assert out == out2 and load_artifact(out2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_save_refuses_to_replace_a_non_model_directory(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "precious.txt").write_text("keep me")
    with pytest.raises(ArtifactError, match="not an ovex model"):
        _save(tmp_path)
    assert (tmp_path / "model" / "precious.txt").exists()


def _edit_json(name: str, change: Callable[[dict[str, object]], object]) -> Callable[[Path], object]:
    def edit(root: Path) -> None:
        data = json.loads((root / name).read_text())
        change(data)
        (root / name).write_text(json.dumps(data))
    return edit


def _edit_weights(change: Callable[[dict[str, torch.Tensor]], object]) -> Callable[[Path], object]:
    def edit(root: Path) -> None:
        tensors = load_file(str(root / "weights.safetensors"))
        change(tensors)
        save_file(tensors, str(root / "weights.safetensors"))
    return edit


def _truncate(path: Path, n: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-n])


def _set(key: str, value: object) -> Callable[[dict[str, object]], None]:
    return lambda d: d.__setitem__(key, value)


CORRUPTIONS: list[tuple[str, Callable[[Path], object], str]] = [
    ("no config", lambda r: (r / "config.json").unlink(), "missing config.json"),
    ("no weights", lambda r: (r / "weights.safetensors").unlink(), "missing weights.safetensors"),
    ("no labels", lambda r: (r / "labels.txt").unlink(), "missing labels.txt"),
    ("no metrics", lambda r: (r / "metrics.json").unlink(), "missing metrics.json"),
    ("no featurizer", lambda r: shutil.rmtree(r / "featurizer"), "missing featurizer"),
    ("config not json", lambda r: (r / "config.json").write_text("{nope"), "config.json is not valid JSON"),
    ("future schema", _edit_json("config.json", _set("schema_version", 99)), "unsupported schema_version 99"),
    ("no schema", _edit_json("config.json", lambda d: d.pop("schema_version")), "schema_version None"),
    ("bad params", _edit_json("config.json", _set("params", {"dim": -1})), "invalid params"),
    ("dims disagree", _edit_json("config.json", _set("n_labels", 13)), "shape disagrees"),
    ("weights garbage", lambda r: (r / "weights.safetensors").write_bytes(b"\x00" * 20), "unreadable"),
    ("missing tensor", _edit_weights(lambda t: t.pop("head")), "lacks tensor 'head'"),
    ("wrong shape", _edit_weights(lambda t: t.__setitem__("head", torch.zeros(N_LABELS, DIM))),
     "'head' has shape"),
    ("truncated weights", lambda r: _truncate(r / "weights.safetensors", 16), "does not fit"),
    ("header too long", lambda r: (r / "weights.safetensors").write_bytes(b"\xff" * 8 + b"{}"), "exceeds"),
    ("extra tensor", _edit_weights(lambda t: t.__setitem__("bogus", torch.zeros(2))), "unexpected tensors"),
    ("nan weights", _edit_weights(lambda t: t["input.weight"].fill_(float("nan"))), "non-finite"),
    ("too few labels", lambda r: (r / "labels.txt").write_text('"a"\n'), "labels.txt has 1 names"),
    ("label not json", lambda r: (r / "labels.txt").write_text("plain\n" * N_LABELS), "labels.txt:1"),
    ("two labels a line", lambda r: (r / "labels.txt").write_text(
        '"a"\n"b","c"\n' + '"d"\n' * (N_LABELS - 3)),
     "labels.txt:2"),
    ("empty label line", lambda r: (r / "labels.txt").write_text('"a"\n\n' + '"d"\n' * (N_LABELS - 1)),
     "labels.txt:2"),
    ("label a number", lambda r: (r / "labels.txt").write_text('"a"\n7\n' + '"d"\n' * (N_LABELS - 2)),
     "labels.txt:2"),
    ("metrics list", lambda r: (r / "metrics.json").write_text("[]"), "metrics.json must hold"),
]


@pytest.mark.parametrize(("case", "damage", "message"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_each_corruption_gets_its_artifact_error(
    tmp_path: Path, case: str, damage: Callable[[Path], object], message: str
) -> None:
    out, _, _ = _save(tmp_path)
    damage(out)
    with pytest.raises(ArtifactError) as err:
        load_artifact(out)
    assert message in str(err.value), (case, str(err.value))
    assert str(out) in str(err.value)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not a model directory"):
        load_artifact(tmp_path / "nothing")


def test_params_saved_before_group_size_existed_read_as_pairwise_ove(tmp_path: Path) -> None:
    """Models and stored jobs written before `group_size` were trained with the pairwise bound."""
    root, _, _ = _save(tmp_path)
    config = json.loads((root / "config.json").read_text())
    assert config["params"]["group_size"] == TrainParams().group_size
    del config["params"]["group_size"]
    (root / "config.json").write_text(json.dumps(config))
    assert load_artifact(root).params.group_size == 1
    assert TrainParams.from_json_dict({"group_size": 16}).group_size == 16


def _mapping_of(address: int) -> tuple[str, str]:
    """(permissions, path) of the /proc/self/maps entry holding `address`."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= address < hi:
            return parts[1], parts[5] if len(parts) > 5 else ""
    raise AssertionError(f"address {address:#x} is in no mapping")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc/self/maps")
def test_big_tables_are_mapped_read_only_from_the_file(tmp_path: Path) -> None:
    """Serving processes share one copy of the weights: the tables live in a read-only map of the file."""
    out, model, _ = _save(tmp_path)
    loaded = load_artifact(out)
    for t in (loaded.model.head, loaded.model.input_weight):
        perms, path = _mapping_of(t.data_ptr())
        assert Path(path) == (out / "weights.safetensors").resolve()
        assert perms.startswith("r-"), perms
    np.testing.assert_array_equal(loaded.model.head.numpy(), model.head.detach().numpy())


def test_schema_1_artifacts_with_a_split_head_still_load(tmp_path: Path) -> None:
    out, model, ds = _save(tmp_path)
    tensors = load_file(str(out / "weights.safetensors"))
    head = tensors.pop("head")
    tensors["head.weight"], tensors["head.bias"] = head[:, :DIM].contiguous(), head[:, DIM].contiguous()
    save_file(tensors, str(out / "weights.safetensors"))
    _edit_json("config.json", _set("schema_version", 1))(out)
    loaded = load_artifact(out)
    x = loaded.featurizer.transform(ds)
    np.testing.assert_array_equal(loaded.scores(x), model.score(model.encode(x)).numpy())


def test_huge_finite_weights_whose_sum_overflows_still_load(tmp_path: Path) -> None:
    """The fast finiteness check (one sum) must not refuse finite values that overflow when summed."""
    out, _, _ = _save(tmp_path)
    _edit_weights(lambda t: t["input.weight"].fill_(3e38))(out)
    assert float(load_artifact(out).model.input_weight.max()) == pytest.approx(3e38)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(), max_size=8))
def test_labels_file_round_trips_any_names(names: list[str]) -> None:
    """labels.txt holds any names, one JSON string a line: quotes, backslashes, newlines, separators."""
    from trainer.artifact import labels_text

    text = labels_text(names)
    assert text == "".join(json.dumps(n, ensure_ascii=False) + "\n" for n in names)  # one name a line
    assert [json.loads(line) for line in text.split("\n")[:-1]] == names
