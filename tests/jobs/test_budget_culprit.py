"""The memory-budget refusal names a parameter that lowering actually helps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.training import budget
from trainer.params import TrainParams


@settings(max_examples=200, deadline=None)
@given(
    dim=st.integers(1, 4096),
    batch=st.integers(1, 1 << 16),
    labels=st.integers(1, 1 << 24),
    features=st.integers(1, 1 << 22),
    negatives=st.integers(1, 1 << 16),
)
def test_never_hidden_without_hidden_layers(dim: int, batch: int, labels: int, features: int,
                                            negatives: int) -> None:
    params = TrainParams(dim=dim, batch_size=batch, negatives=negatives, hidden=0)
    assert budget.estimate(params, labels, features).culprit() != "hidden"


def test_hidden_named_when_its_layers_dominate() -> None:
    params = TrainParams(dim=4096, batch_size=8, negatives=8, encoder="mlp", hidden=8)
    assert budget.estimate(params, 10, 10).culprit() == "hidden"


def test_batch_named_for_large_activations() -> None:
    """Batch × dim activations with no hidden layer: the batch size is the one to lower."""
    params = TrainParams(dim=4096, batch_size=1 << 16, negatives=1, hidden=0)
    assert budget.estimate(params, 2, 2).culprit() == "batch_size"
