"""Fuzz the whole OpenAPI schema with schemathesis against a live server: no 5xx, responses conform.

Bounded (a few examples per operation) so it stays well under a minute. Driven through schemathesis'
Python API with hypothesis directly (its pytest plugin does not load under this pytest version).
"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.service.conftest import Server

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_whole_schema_conforms(server: Server) -> None:
    schema = schemathesis.openapi.from_url(server.base + "/openapi.json")
    seen = []
    for result in schema.get_all_operations():
        op = result.ok()  # type: ignore[union-attr]
        seen.append(f"{op.method.upper()} {op.path}")

        @given(case=op.as_strategy())
        @settings(
            max_examples=10,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case: Any) -> None:
            case.call_and_validate(base_url=server.base, checks=CHECKS)

        run()
    assert "POST /v1/models/{name}/predict" in seen and "POST /v1/predict" in seen
