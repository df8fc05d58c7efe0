"""Many unknown keys in a body are one error, found before any field is checked; a few are one error
each, naming the key."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from service.api.jobs import JobCreate
from service.api.schemas import PredictRequest
from service.api.v2_protocol import InferRequest
from trainer.params import MAX_UNKNOWN_KEYS, TrainParams


@pytest.mark.parametrize("model", [PredictRequest, InferRequest, JobCreate, TrainParams])
def test_many_unknown_keys_are_one_error(model: type[BaseModel]) -> None:
    body = {f"made_up_{i}": i for i in range(50_000)}
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    [error] = caught.value.errors()
    assert error["type"] == "extra_forbidden"
    assert error["msg"].startswith("50000 unknown fields")
    assert "'made_up_0'" in error["msg"] and next(iter(model.model_fields)) in error["msg"]


@pytest.mark.parametrize("model", [PredictRequest, TrainParams])
def test_a_few_unknown_keys_are_named_one_by_one(model: type[BaseModel]) -> None:
    body = {f"made_up_{i}": i for i in range(MAX_UNKNOWN_KEYS)}
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    unknown = [e["loc"] for e in caught.value.errors() if e["type"] == "extra_forbidden"]
    assert unknown == [(f"made_up_{i}",) for i in range(MAX_UNKNOWN_KEYS)]


def test_nested_inputs_are_checked_alike() -> None:
    body = {"inputs": [{f"k{i}": i for i in range(1000)}, {"text": "a"}]}
    with pytest.raises(ValidationError) as caught:
        PredictRequest.model_validate(body)
    [error] = caught.value.errors()
    assert error["loc"] == ("inputs", 0) and "1000 unknown fields" in error["msg"]
