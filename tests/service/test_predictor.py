"""The predictor in-process: gated (DropMax) heads are scored exactly, including the ev-softmax mean."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from service.predictor import InputRow, Job, Options
from service.registry import load_served
from service.settings import Settings
from trainer.artifact import load_artifact
from trainer.sparse_maps import evsoftmax, sparsemax


@pytest.fixture(scope="module")
def dropmax_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.params import TrainParams
    from trainer.synth import synth_dataset
    from trainer.train import train

    out = tmp_path_factory.mktemp("dm") / "dm" / "1"
    ds = synth_dataset(120, 300, 600, seed=4)
    params = TrainParams(loss="dropmax", dim=16, epochs=1, negatives=32, batch_size=128, device="cpu",
                         eval_every=0)
    train(params, ds, None, out_dir=out)
    return out


def _rows(n: int, n_features: int) -> list[InputRow]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        idx = rng.choice(n_features, size=10, replace=False).astype(np.int64)
        out.append(InputRow(indices=idx, values=rng.uniform(0.5, 2, 10).astype(np.float32)))
    return out


def test_dropmax_head_is_served_with_its_gate(dropmax_model: Path, tmp_path: Path) -> None:
    loaded = load_artifact(dropmax_model)
    assert "dropmax" in loaded.model.extra
    served = load_served("dm", "1", dropmax_model, Settings(models_dir=tmp_path, data_dir=tmp_path))
    assert served.retrieval == "exact"
    rows = _rows(6, loaded.n_features)
    x = sp.vstack([sp.csr_matrix((r.values, (np.zeros(10, int), r.indices)), shape=(1, loaded.n_features))
                   for r in rows]).tocsr()
    full = loaded.scores(loaded.featurizer.transform_sparse(x)).astype(np.float64)
    jobs = [Job(rows, Options(top_k=120, normalization="sparsemax")),
            Job(rows, Options(top_k=120, normalization="evsoftmax")),
            Job(rows, Options(top_k=5, normalization="none"))]
    sm, ev, none = served.predictor.predict_jobs_safe(jobs)
    assert not isinstance(sm, Exception) and not isinstance(ev, Exception) and not isinstance(none, Exception)
    for r, row in enumerate(full):
        want = sparsemax(row)
        got = {lb.id: lb.prob for lb in sm[r].labels}
        assert set(got) == set(np.flatnonzero(want > 0).tolist()) and sm[r].exact
        for i, p in got.items():
            assert p == pytest.approx(want[i], abs=1e-5)
        want_ev = evsoftmax(row)  # threshold: the mean of the gated scores, not the linear formula
        got_ev = {lb.id: lb.prob for lb in ev[r].labels}
        assert set(got_ev) == set(np.flatnonzero(want_ev > 0).tolist()) and ev[r].exact
        for i, p in got_ev.items():
            assert p == pytest.approx(want_ev[i], abs=1e-5)
        np.testing.assert_allclose([lb.score for lb in none[r].labels], np.sort(row)[::-1][:5], atol=1e-4)
