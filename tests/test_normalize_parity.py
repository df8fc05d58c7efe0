"""`ovex predict --normalization` (trainer.normalize) and the service's predictor answer with the same map
and threshold: where the command line's answer over its k labels is flagged exact, the service's exact
pass gives the same labels and probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from service.serving.predictor import InputRow, Options, Predictor
from service.serving.retrieval import ExactScorer
from trainer.artifact import LoadedModel, load_artifact, save_artifact
from trainer.data import Dataset
from trainer.featurize import Featurizer, FeaturizerConfig
from trainer.model import ModelShape, XCModel
from trainer.normalize import evsoftmax_threshold_for, predict_topk
from trainer.params import TrainParams

N_FEATURES, N_LABELS, DIM, ROWS = 30, 40, 8, 25


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[LoadedModel, sp.csr_matrix]:
    x = sp.random(ROWS, N_FEATURES, density=0.3, format="csr", dtype=np.float32, random_state=1)
    y = sp.csr_matrix((np.ones(ROWS, dtype=np.float32), np.arange(ROWS) % N_LABELS, np.arange(ROWS + 1)),
                      shape=(ROWS, N_LABELS))
    featurizer = Featurizer(FeaturizerConfig(tfidf=False)).fit(
        Dataset(Y=y, n_features=N_FEATURES, n_labels=N_LABELS, X=x))
    model = XCModel(ModelShape(N_FEATURES, N_LABELS, DIM), seed=2)
    with torch.no_grad():  # peaked scores, so sparsemax keeps a few labels and certifies on k of them
        model.head.copy_(torch.randn(model.head.shape, generator=torch.Generator().manual_seed(0)) * 8.0)
    out = save_artifact(tmp_path_factory.mktemp("parity") / "m", model, featurizer,
                        [f"l{i}" for i in range(N_LABELS)], TrainParams(dim=DIM), {})
    return load_artifact(out), x


def _service(model: LoadedModel) -> Predictor:
    """A predictor whose retriever is its exact scorer: every answer takes the exact pass."""
    exact = ExactScorer(np.asarray(model.head_weight), np.asarray(model.head_bias), block_rows=16)
    return Predictor(model, exact, exact)


def _rows(x: sp.csr_matrix) -> list[InputRow]:
    return [InputRow(indices=x[i].indices.astype(np.int64), values=x[i].data.astype(np.float32))
            for i in range(x.shape[0])]


def test_the_evsoftmax_threshold_is_the_same_mean(loaded: tuple[LoadedModel, sp.csr_matrix]) -> None:
    model, x = loaded
    service = _service(model)
    h = service.encode(_rows(x))
    cli = evsoftmax_threshold_for(model, model.featurizer.transform_sparse(x))
    np.testing.assert_allclose(service._threshold(h), cli, rtol=1e-12, atol=1e-12)


# ev-softmax keeps every label above the mean score: k must hold about half of them to certify
@pytest.mark.parametrize(("normalization", "k"), [("sparsemax", 8), ("evsoftmax", 32)])
def test_an_exact_cli_answer_is_the_service_answer(
    loaded: tuple[LoadedModel, sp.csr_matrix], normalization: str, k: int
) -> None:
    model, x = loaded
    ids, scores, dist = predict_topk(model, model.featurizer.transform_sparse(x), k, normalization)
    options = Options(top_k=k, normalization=normalization)  # type: ignore[arg-type]
    answers = _service(model).predict(_rows(x), options)
    compared = 0
    for r, answer in enumerate(answers):
        if not dist.exact[r]:
            continue
        keep = dist.probs[r] > 0
        assert [label.id for label in answer.labels] == ids[r][keep].tolist(), r
        # float32 scores of two blocked products: equal up to their rounding
        np.testing.assert_allclose([label.prob for label in answer.labels], dist.probs[r][keep], atol=1e-5)
        np.testing.assert_allclose([label.score for label in answer.labels], scores[r][keep], rtol=1e-5)
        compared += 1
    assert compared >= ROWS // 2, compared  # most rows certify: the comparison is not vacuous

