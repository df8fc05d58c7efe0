"""The artifact's small readers (shape, params, featurizer kind) without its weights, and the service's
uses of them: the catalog's summary of a version and the input kind of a model."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from service.serving.catalog import ModelCatalog
from service.serving.input_kind import artifact_kind
from trainer.artifact import read_featurizer_kind, read_params, read_shape, save_artifact
from trainer.data import Dataset
from trainer.errors import ArtifactError
from trainer.featurize import Featurizer
from trainer.model import ModelShape, XCModel
from trainer.params import TrainParams

N_FEATURES, N_LABELS, DIM = 20, 6, 4


@pytest.fixture
def catalog(tmp_path: Path) -> ModelCatalog:
    """A models directory with one saved version, m/1."""
    x = sp.random(12, N_FEATURES, density=0.3, format="csr", dtype=np.float32, random_state=0)
    y = sp.csr_matrix((np.ones(12, dtype=np.float32), np.arange(12) % N_LABELS, np.arange(13)),
                      shape=(12, N_LABELS))
    featurizer = Featurizer.fit(Dataset(Y=y, n_features=N_FEATURES, n_labels=N_LABELS, X=x))
    model = XCModel(ModelShape(N_FEATURES, N_LABELS, DIM, encoder="mlp", hidden=1), seed=0)
    save_artifact(tmp_path / "models" / "m" / "1", model, featurizer, [f"l{i}" for i in range(N_LABELS)],
                  TrainParams(dim=DIM, encoder="mlp", hidden=1), {"p@1": 0.25})
    return ModelCatalog(tmp_path / "models")


def test_the_shape_is_read_without_the_weights(catalog: ModelCatalog) -> None:
    version = catalog.version_dir("m", "1")
    (version / "weights.safetensors").unlink()  # the readers never open it
    shape = read_shape(version)
    assert (shape.n_features, shape.n_labels, shape.dim, shape.encoder, shape.hidden) == (
        N_FEATURES, N_LABELS, DIM, "mlp", 1)
    assert read_featurizer_kind(version) == "sparse"
    assert catalog.summary("m", "1") == {"n_labels": N_LABELS, "n_features": N_FEATURES, "dim": DIM,
                                         "metrics": {"p@1": 0.25}}
    assert artifact_kind(version) == "sparse"


def _edit_config(version: Path, **changes: object) -> None:
    config = json.loads((version / "config.json").read_text())
    (version / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize(("damage", "says"), [
    (lambda v: (v / "config.json").unlink(), "missing config.json"),
    (lambda v: (v / "config.json").write_text('{"schema_version": 2, "n_'), "config.json is not valid JSON"),
    (lambda v: ((v / "config.json").unlink(), (v / "config.json").mkdir()), "config.json cannot be read"),
    (lambda v: _edit_config(v, schema_version=99), "unsupported schema_version 99"),
    (lambda v: _edit_config(v, n_labels=N_LABELS + 1), "shape disagrees with n_features/n_labels/dim"),
    (lambda v: _edit_config(v, shape=[1, 2]), "config.json has invalid params/shape"),
    (lambda v: _edit_config(v, dim=None, shape=None), "config.json has invalid params/shape"),
])
def test_a_broken_config_is_an_artifact_error_and_a_summary_without_the_shape(
    catalog: ModelCatalog, damage: Callable[[Path], object], says: str
) -> None:
    """The reader says what is wrong under the name it is given, never the server's path; the catalog's
    summary of such a version keeps what it can read (its metrics) and leaves the shape out."""
    version = catalog.version_dir("m", "1")
    damage(version)
    with pytest.raises(ArtifactError) as err:
        read_shape(version, "model 'm' version 1")
    assert says in str(err.value) and str(err.value).startswith("model 'm' version 1: "), err.value
    assert str(catalog.root) not in str(err.value)
    assert catalog.summary("m", "1") == {"metrics": {"p@1": 0.25}}
    with pytest.raises(ArtifactError, match="model 'm' version 1: "):
        read_params(version, "model 'm' version 1")


def test_params_that_do_not_validate_still_leave_the_shape_readable(catalog: ModelCatalog) -> None:
    """The shape is the config's own record: a params field this ovex does not know (a newer writer)
    stops a load, not the listing of the version's size."""
    version = catalog.version_dir("m", "1")
    config = json.loads((version / "config.json").read_text())
    _edit_config(version, params={**config["params"], "from_the_future": 1})
    with pytest.raises(ArtifactError, match="invalid params"):
        read_params(version)
    assert read_shape(version).n_labels == N_LABELS
    assert catalog.summary("m", "1")["n_labels"] == N_LABELS


def test_a_featurizer_that_does_not_say_its_kind(catalog: ModelCatalog) -> None:
    version = catalog.version_dir("m", "1")
    meta = version / "featurizer" / "featurizer.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "kind": 3}))
    with pytest.raises(ArtifactError, match=r"featurizer/featurizer\.json does not say its kind"):
        read_featurizer_kind(version)
    assert artifact_kind(version) is None
    meta.unlink()
    with pytest.raises(ArtifactError, match=r"missing featurizer/featurizer\.json"):
        read_featurizer_kind(version)
    assert artifact_kind(version) is None
