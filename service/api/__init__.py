"""HTTP surface: one router per resource, pydantic schemas, errors mapped to status codes in one place."""
