"""The job budget counts a run's tables as the trainer's capacity check does: one formula, so a job the
API accepts is not refused by its own trainer for the same tables, nor the other way round."""

from __future__ import annotations

import pytest

from service.training import budget
from trainer.capacity import run_bytes
from trainer.params import TrainParams

CASES = [  # (optimizer, dim, labels, features, ranks, loss, valid_fraction)
    ("adam", 32, 1000, 500, 1, "ove", 0.0),
    ("adagrad", 32, 1000, 500, 1, "ove", 0.0),
    ("adam", 256, 10**6, 10**5, 1, "ove", 0.0),
    ("adagrad", 256, 10**6, 10**5, 4, "ove", 0.0),
    ("adagrad", 8, 7, 3, 2, "dropmax", 0.0),  # a loss-owned head, an uneven shard
    ("adam", 64, 50_001, 20_000, 3, "dropmax", 0.1),  # and the kept best epoch's copy
]


@pytest.mark.parametrize(("optimizer", "dim", "labels", "features", "ranks", "loss", "valid"), CASES)
def test_the_budget_counts_the_tables_as_the_trainer_does(
    optimizer: str, dim: int, labels: int, features: int, ranks: int, loss: str, valid: float
) -> None:
    params = TrainParams(dim=dim, loss=loss, nproc_per_node=ranks, valid_fraction=valid)
    params = params.model_copy(update={"optimizer": optimizer})
    est = budget.estimate(params, labels, features)
    extra = 1 if loss == "dropmax" else 0
    trainer = run_bytes(labels, features, params, extra_heads=extra, ranks=ranks)
    assert est.head_bytes + est.projection_bytes == trainer.tables
    assert est.hidden_bytes == 0 and est.tables == trainer.tables


def test_adagrad_keeps_one_float_a_row_not_a_weight() -> None:
    """K=1000, D=500, d=32, one rank: weights plus one float32 accumulator per row of each table."""
    params = TrainParams(dim=32).model_copy(update={"optimizer": "adagrad"})
    est = budget.estimate(params, 1000, 500)
    assert est.tables == 4 * (1000 * 33 + 500 * 32) + 4 * (1000 + 500)
    adam = budget.estimate(params.model_copy(update={"optimizer": "adam"}), 1000, 500)
    assert adam.tables == 4 * 3 * (1000 * 33 + 500 * 32) + 8 * (1000 + 500)
