"""The OpenAPI document describes the whole contract: every operation, parameter and field has a
description, the job `params` are the trainer's options, and the examples are requests that work."""

from __future__ import annotations

from typing import Any

import pytest

from service.api.schemas import DEMO_TEXT, PredictRequest
from service.app import create_app
from service.settings import Settings
from trainer.params import TrainParams


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("openapi")
    app = create_app(Settings(models_dir=root / "models", data_dir=root / "data"))
    out: dict[str, Any] = app.openapi()
    return out


def test_every_operation_parameter_and_field_is_described(spec: dict[str, Any]) -> None:
    missing = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if not op.get("description"):
                missing.append(f"{method.upper()} {path}")
            for param in op.get("parameters", []):
                if not (param.get("description") or param.get("schema", {}).get("description")):
                    missing.append(f"{method.upper()} {path} parameter {param['name']}")
    for name, schema in spec["components"]["schemas"].items():
        if not schema.get("description"):
            missing.append(f"schema {name}")
        for field, prop in schema.get("properties", {}).items():
            if not prop.get("description"):
                missing.append(f"{name}.{field}")
    assert missing == []


def test_job_params_are_the_trainer_options(spec: dict[str, Any]) -> None:
    ref = spec["components"]["schemas"]["JobCreate"]["properties"]["params"]["$ref"]
    params = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(params["properties"]) == set(TrainParams.model_fields)
    assert params["additionalProperties"] is False
    assert {"ove", "softmax", "sparsemax"} <= set(params["properties"]["loss"]["enum"])
    for name, field in TrainParams.model_fields.items():
        assert params["properties"][name].get("default") == field.default, name  # a None default is left out
    assert params["properties"]["epochs"]["minimum"] == 1


def test_examples_are_valid_requests(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    for example in schemas["PredictRequest"]["examples"]:
        PredictRequest.model_validate(example)
    assert schemas["PredictRequest"]["examples"][0]["inputs"][0]["text"] == DEMO_TEXT
    job = schemas["JobCreate"]["examples"][0]
    TrainParams.model_validate(job["params"])
    assert job["train_dataset"].startswith("ds_")
