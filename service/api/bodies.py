"""The base of every request body model: unknown keys refused, and many of them in one error."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from trainer.params import refuse_many_unknown


class ClientBody(BaseModel):
    """What a client sends (or a part of it): its keys are the fields, nothing else."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _few_unknown(cls, data: Any) -> Any:
        return refuse_many_unknown(cls, data)
