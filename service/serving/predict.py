"""The one prediction path of every protocol (/v1, /v2): checks against the limits and the model, the
micro-batcher, the pinned version's predictor, and the explanation when asked.

A router finds the model (`serving`) and calls `predict` in one line; what only the model can tell (an
index past its features, text sent to a features model) is checked here, not in the router.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from starlette.concurrency import run_in_threadpool

from service.errors import MAX_FIELD_ERRORS, Field, InputError, Malformed, NotFound, Unavailable
from service.metrics import Metrics
from service.serving.batching import MicroBatcher
from service.serving.catalog import some_versions
from service.serving.explain import explain
from service.serving.predictor import InputRow, Normalization, Options, Query, RowPrediction
from service.serving.registry import ModelRegistry, ServedModel
from service.settings import Settings


class SparseInput(Protocol):
    @property
    def indices(self) -> Sequence[int]: ...
    @property
    def values(self) -> Sequence[float]: ...


class InputLike(Protocol):
    """One input as a protocol parsed it: text, or sparse features."""

    @property
    def text(self) -> str | None: ...
    @property
    def features(self) -> SparseInput | None: ...


class PredictCall(Protocol):
    """What a predict request asks, whichever protocol carried it."""

    @property
    def inputs(self) -> Sequence[InputLike]: ...
    @property
    def top_k(self) -> int: ...
    @property
    def normalization(self) -> Normalization: ...
    @property
    def exact(self) -> bool: ...  # the request option (`Options.exact_scan` inside)
    @property
    def explain(self) -> bool: ...


@dataclass(frozen=True)
class Answer:
    """One prediction per input, how many of its features the model knows, and (when asked) why."""

    served: ServedModel
    rows: list[RowPrediction]
    known: list[int]
    why: list[list[dict[str, Any]]] | None = None


class PredictService:
    """Predictions for the routers: each finds its model and predicts in one call."""

    def __init__(
        self, registry: ModelRegistry, batcher: MicroBatcher, settings: Settings, metrics: Metrics
    ) -> None:
        self.registry, self.batcher, self.settings, self.metrics = registry, batcher, settings, metrics

    def model(self, name: str | None) -> ServedModel:
        """The active version of `name`, or of the default model when no name is given."""
        return self.registry.default() if name is None else self.registry.get(name)

    def serving(self, name: str, version: str | None) -> ServedModel:
        """The version serving `name`; a named version must be that one (only the active version serves).
        A request for what serves reads no directory: only a miss lists the disk to say what is wrong."""
        served = self.registry.serving(name)
        if served is not None and version in (None, served.version):
            return served
        versions = self.registry.scan().get(name)
        if versions is None:
            raise NotFound(f"unknown model {name!r}")
        if version is not None and version not in versions:
            raise NotFound(f"model {name!r} has no version {version!r} (versions: {some_versions(versions)})")
        served = self.registry.get(name)
        if version is not None and served.version != version:
            raise Malformed(
                f"version {version!r} of model {name!r} is not loaded: only the active version "
                f"({served.version!r}) serves; activate it first, or leave the version out"
            )
        return served

    async def predict(self, served: ServedModel, call: PredictCall) -> Answer:
        """Check `call` against the limits and the model, then through the micro-batcher to the pinned
        version's predictor; explained in a thread when the call asks."""
        settings, metrics = self.settings, self.metrics
        start = time.perf_counter()
        try:
            query = to_query(call, served, settings)
            try:
                preds = await self.batcher.submit(served.predictor, query, settings.request_timeout_s)
            except TimeoutError:
                raise Unavailable(f"prediction took over {settings.request_timeout_s}s; retry later",
                                  retry_after=1) from None
        except Exception:
            metrics.predict_errors.labels(served.name).inc()
            raise
        metrics.predict_latency.labels(served.name).observe(time.perf_counter() - start)
        metrics.predicted_rows.labels(served.name, served.version).inc(len(preds))
        why = None
        if call.explain:
            why = await run_in_threadpool(
                explain, served.predictor, query.rows, preds, settings.max_explain_terms
            )
        return Answer(served, preds, known_features(served, query.rows), why)


def to_query(call: PredictCall, served: ServedModel, settings: Settings) -> Query:
    """Check what only the limits and the model can tell, then build plain predictor inputs. The index
    checks are numpy's, so a body full of numbers costs the event loop a few milliseconds at most."""
    errors: list[tuple[Field, str]] = []
    if len(call.inputs) > settings.max_batch:
        errors.append(
            (("inputs",), f"at most {settings.max_batch} inputs per request, got {len(call.inputs)}")
        )
    if call.top_k > settings.max_top_k:
        errors.append((("top_k",), f"top_k must be at most {settings.max_top_k}, got {call.top_k}"))
    elif call.explain and call.top_k > settings.max_explain_top_k:
        errors.append((("top_k",), f"with explain, top_k must be at most "
                       f"{settings.max_explain_top_k}, got {call.top_k}: ask for fewer labels, or leave "
                       "explain out"))
    rows: list[InputRow] = []
    nf = served.n_features
    kind = served.predictor.input_kind
    for i, inp in enumerate(call.inputs[: settings.max_batch]):
        features = inp.features
        if features is None:
            if kind != "text":
                errors.append(
                    (("inputs", i, "text"), f"model {served.name!r} takes sparse `features`, not text")
                )
            rows.append(InputRow(text=inp.text))
            continue
        if kind == "text":
            errors.append((("inputs", i, "features"), f"model {served.name!r} takes `text`, not features"))
            continue
        try:
            indices = np.asarray(features.indices, dtype=np.int64)
        except OverflowError:  # an index past int64 is out of range like any other
            indices = np.asarray([min(v, nf) for v in features.indices], dtype=np.int64)
        over = np.flatnonzero(indices >= nf)
        for j in over[:5].tolist():
            errors.append((
                ("inputs", i, "features", "indices", j),
                f"index {features.indices[j]} is out of range: model {served.name!r} has {nf} features "
                f"(0..{nf - 1})",
            ))
        if over.size:
            continue
        values = np.asarray(features.values, dtype=np.float64).astype(np.float32)
        rows.append(InputRow(indices=indices, values=values))
    if errors:
        raise InputError(_bounded(errors))
    return Query(rows, Options(top_k=call.top_k, normalization=call.normalization, exact_scan=call.exact))


def _bounded(errors: list[tuple[Field, str]]) -> list[tuple[Field, str]]:
    """The first `MAX_FIELD_ERRORS`, then one counting the rest: what to fix first, in a small answer."""
    if len(errors) <= MAX_FIELD_ERRORS:
        return errors
    return [*errors[:MAX_FIELD_ERRORS], ((), f"and {len(errors) - MAX_FIELD_ERRORS} more errors")]


def known_features(served: ServedModel, rows: Sequence[InputRow]) -> list[int]:
    """Per input, the features the model recognises (0: an answer from the label biases alone)."""
    counts = [0 if r.values is None else int(np.count_nonzero(r.values)) for r in rows]
    text_pos = [i for i, r in enumerate(rows) if r.text is not None]
    if text_pos:
        x = served.predictor.model.featurizer.transform_texts([rows[i].text for i in text_pos])
        for i, n in zip(text_pos, np.diff(x.indptr), strict=True):
            counts[i] = int(n)
    return counts
