"""Trainer options checked against the schema the server publishes, so a typo is reported before an upload.

The server's `/openapi.json` names the job's `params` object (TrainParams): its fields, their JSON types,
enums and bounds. Checking a few flags here saves uploading a large file only to be told `epoch` is not
an option.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

JSON_TYPES = {"integer": "an integer", "number": "a number", "boolean": "true or false", "string": "a string"}


def train_params_schema(openapi: Any) -> dict[str, Any] | None:
    """The `params` object schema of a job request in an OpenAPI document (None: not found)."""
    if not isinstance(openapi, dict):
        return None
    schemas = openapi.get("components", {}).get("schemas", {})
    if not isinstance(schemas, dict):
        return None
    for schema in schemas.values():
        params = schema.get("properties", {}).get("params") if isinstance(schema, dict) else None
        ref = _ref(params, schemas)
        if ref is not None and isinstance(ref.get("properties"), dict) and "train_dataset" in schema.get(
                "properties", {}):
            return ref
    found = [s for s in schemas.values() if isinstance(s, dict) and s.get("title") == "TrainParams"]
    return found[0] if found and isinstance(found[0].get("properties"), dict) else None


def _ref(node: Any, schemas: Mapping[str, Any]) -> dict[str, Any] | None:
    """The object a `$ref` (possibly inside anyOf/allOf, next to null) points to."""
    if not isinstance(node, dict):
        return None
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        target = schemas.get(ref.rsplit("/", 1)[-1])
        return target if isinstance(target, dict) else None
    for key in ("anyOf", "allOf", "oneOf"):
        for sub in node.get(key, []) or []:
            found = _ref(sub, schemas)
            if found is not None:
                return found
    return None


def param_errors(params: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """What is wrong with each option, in words (empty: nothing the schema can tell)."""
    props: Mapping[str, Any] = schema.get("properties", {})
    errors = []
    for key, value in params.items():
        if key not in props:
            close = difflib.get_close_matches(key, list(props), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            errors.append(f"{key}: not a trainer option{hint}")
            continue
        problem = value_error(value, props[key])
        if problem:
            errors.append(f"{key}={_show(value)}: {problem}")
    return errors


def value_error(value: Any, prop: Mapping[str, Any]) -> str | None:
    """Why `value` does not fit one property's schema (None: it fits or the schema says too little)."""
    branches = prop.get("anyOf") or prop.get("oneOf")
    if isinstance(branches, list) and branches:
        problems = [value_error(value, b) for b in branches if isinstance(b, dict)]
        return None if any(p is None for p in problems) else next(p for p in problems if p)
    enum = prop.get("enum")
    if isinstance(enum, list):
        return None if value in enum else f"must be one of {', '.join(map(str, enum))}"
    kind = prop.get("type")
    if kind == "null":
        return None if value is None else "must be null"
    if kind in JSON_TYPES and not _is_type(value, kind):
        return f"must be {JSON_TYPES[kind]}"
    return _bound_error(value, prop) if kind in ("integer", "number") else None


def _is_type(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, int | float)
    return isinstance(value, str) if kind == "string" else False


def _bound_error(value: float, prop: Mapping[str, Any]) -> str | None:
    checks = (
        ("minimum", lambda b: value >= b, "at least"),
        ("exclusiveMinimum", lambda b: value > b, "more than"),
        ("maximum", lambda b: value <= b, "at most"),
        ("exclusiveMaximum", lambda b: value < b, "less than"),
    )
    for key, ok, words in checks:
        bound = prop.get(key)
        if isinstance(bound, int | float) and not ok(bound):
            return f"must be {words} {_show(bound)}"
    return None


def _show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).lower() if isinstance(value, bool) else str(value)
