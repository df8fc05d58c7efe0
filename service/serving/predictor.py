"""Inputs → featurize → encode → top-k retrieval → sparse map → labels with probabilities.

Knows nothing about HTTP: it takes plain dataclasses and returns plain dataclasses, so the micro-batcher
can hand it many requests at once and tests can call it directly. One `Predictor` wraps one loaded model
version and never changes; hot swap replaces the whole object.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from service.errors import Invalid
from service.serving.input_kind import InputKind
from service.serving.retrieval import ExactScorer, Retriever, TopK
from trainer.sparse_maps import evsoftmax_threshold_linear, f32_score_tol, linear_head_means, normalize_topk
from trainer.twins import drop_excluded, most_excluded

log = logging.getLogger("ovex.predictor")

Normalization = Literal["sparsemax", "evsoftmax", "softmax", "none"]

# Sparse maps look at more labels than they list: the threshold needs the scores around it, and a wider
# look certifies more answers. Retrieval fetches at least this many.
MIN_FETCH = 32
# The index path widens an uncertified sparsemax answer up to this many labels (the exact path: all K).
MAX_INDEX_FETCH = 2048
# sparsemax's threshold τ is at least the best score minus 1: nothing further below can be in the support
SPARSEMAX_REACH = 1.0


class Featurizer(Protocol):
    n_features: int

    def transform_texts(self, texts: list[str]) -> sp.csr_matrix: ...

    def transform_sparse(self, x: sp.csr_matrix) -> sp.csr_matrix: ...


class ServableModel(Protocol):
    """What the predictor needs from `trainer.artifact.LoadedModel`."""

    label_names: list[str]
    featurizer: Any

    @property
    def n_features(self) -> int: ...

    @property
    def n_labels(self) -> int: ...

    @property
    def dim(self) -> int: ...

    @property
    def head_weight(self) -> npt.NDArray[np.float32]: ...

    @property
    def head_bias(self) -> npt.NDArray[np.float32]: ...

    def encode(self, x: sp.csr_matrix) -> npt.NDArray[np.float32]: ...


@dataclass(frozen=True)
class InputRow:
    """One input: text, or a sparse vector in the model's raw feature space (validated upstream)."""

    text: str | None = None
    indices: npt.NDArray[np.int64] | None = None
    values: npt.NDArray[np.float32] | None = None


@dataclass(frozen=True)
class Options:
    """What a request asks for. `exact_scan` is the request's `exact` option: score every label instead of
    using the index (what the answer then certifies is `RowPrediction.certified`)."""

    top_k: int = 10
    normalization: Normalization = "sparsemax"
    exact_scan: bool = False


@dataclass(frozen=True)
class LabelScore:
    id: int
    name: str
    score: float
    prob: float | None
    from_text: bool = False  # known by its text alone: no training rows yet (`LoadedModel.text_only`)


@dataclass(frozen=True)
class RowPrediction:
    """One input's answer. `certified`: the answer provably equals the one from scoring every label (the
    `exact` flag of the answer a client reads), whichever path produced it."""

    labels: list[LabelScore]
    certified: bool


class InputRowError(Invalid):
    """One input of a request cannot be answered (e.g. its values overflow float32 in the encoder): a
    value the client sent is wrong, as only the model can tell (422 like every invalid input)."""

    def __init__(self, row: int, input_field: str, message: str) -> None:
        super().__init__(f"inputs[{row}].{input_field}: {message}", field=("inputs", row, input_field))
        self.message = message


@dataclass(frozen=True)
class Query:
    """A request's inputs with its options; the batcher concatenates queries for one predictor call."""

    rows: Sequence[InputRow]
    options: Options


class Predictor:
    """Serves one model version. Thread-compatible: the batcher calls it from one compute thread."""

    def __init__(self, model: ServableModel, retriever: Retriever, exact_scorer: ExactScorer) -> None:
        self.model = model
        self.retriever = retriever
        self.exact_scorer = exact_scorer
        self.n_labels = int(model.n_labels)
        self.n_features = int(model.n_features)
        self.label_names = list(model.label_names)
        # with label texts: which labels are known by their text alone (a model without them has none)
        self.text_only: npt.NDArray[np.bool_] | None = getattr(model, "text_only", None)
        self.w_mean, self.b_mean = linear_head_means(model.head_weight, model.head_bias)
        # "text" or "sparse": what the fitted featurizer accepts (the API refuses the other kind)
        self.input_kind: InputKind = "text" if getattr(model.featurizer, "kind", None) == "text" else "sparse"

    # -- featurize + encode -------------------------------------------------------------------------
    def featurize(self, rows: Sequence[InputRow]) -> sp.csr_matrix:
        """Rows in order; text and sparse rows go through the model's own featurizer."""
        text_pos = [i for i, r in enumerate(rows) if r.text is not None]
        sparse_pos = [i for i, r in enumerate(rows) if r.text is None]
        parts: list[tuple[list[int], sp.csr_matrix]] = []
        fz = self.model.featurizer
        if text_pos:
            texts = [rows[i].text or "" for i in text_pos]
            parts.append((text_pos, sp.csr_matrix(fz.transform_texts(texts))))
        if sparse_pos:
            indptr = [0]
            idx: list[npt.NDArray[np.int64]] = []
            val: list[npt.NDArray[np.float32]] = []
            for i in sparse_pos:
                r = rows[i]
                assert r.indices is not None and r.values is not None
                idx.append(r.indices)
                val.append(r.values)
                indptr.append(indptr[-1] + len(r.indices))
            raw = sp.csr_matrix(
                (
                    np.concatenate(val) if val else np.zeros(0, np.float32),
                    np.concatenate(idx) if idx else np.zeros(0, np.int64),
                    np.asarray(indptr),
                ),
                shape=(len(sparse_pos), self.n_features),
                dtype=np.float32,
            )
            raw.sum_duplicates()
            parts.append((sparse_pos, sp.csr_matrix(fz.transform_sparse(raw))))
        if len(parts) == 1:
            return parts[0][1]
        order = np.argsort(np.concatenate([np.asarray(p, dtype=np.int64) for p, _ in parts]), kind="stable")
        stacked = sp.vstack([m for _, m in parts], format="csr")
        return sp.csr_matrix(stacked[order])

    def encode(self, rows: Sequence[InputRow]) -> npt.NDArray[np.float32]:
        h = self.model.encode(self.featurize(rows))
        return np.ascontiguousarray(h, dtype=np.float32)

    # -- the whole pipeline ---------------------------------------------------------------------------
    def predict_queries(self, queries: Sequence[Query]) -> list[list[RowPrediction]]:
        """Every query's rows in one encode; retrieval grouped by (path, fetch size)."""
        rows = [r for j in queries for r in j.rows]
        opts = [j.options for j in queries for _ in j.rows]
        h = self.encode(rows)
        preds = self.predict_encoded(h, opts, self.excluded(rows))
        out: list[list[RowPrediction]] = []
        pos = 0
        for j in queries:
            out.append(preds[pos : pos + len(j.rows)])
            pos += len(j.rows)
        return out

    def predict_queries_safe(self, queries: Sequence[Query]) -> list[list[RowPrediction] | Exception]:
        """Like `predict_queries`, but one bad request gets its own error instead of failing the batch:
        inputs whose encoding is not finite are refused, and a failing batch is retried query by query."""
        try:
            rows = [r for j in queries for r in j.rows]
            h = self.encode(rows)
        except Exception as exc:
            if len(queries) == 1:
                return [exc]
            return [res for j in queries for res in self.predict_queries_safe([j])]
        out: list[list[RowPrediction] | Exception] = [[] for _ in queries]
        keep: list[int] = []
        pos = 0
        finite = np.isfinite(h).all(axis=1) & (np.abs(h).max(axis=1, initial=0.0) < 1e18)
        for ji, j in enumerate(queries):
            bad = [r for r in range(len(j.rows)) if not finite[pos + r]]
            if bad:
                out[ji] = InputRowError(
                    bad[0],
                    "features" if j.rows[bad[0]].text is None else "text",
                    "the input overflows the model's float32 range: scale its values down",
                )
            else:
                keep.append(ji)
            pos += len(j.rows)
        if keep:
            starts = np.cumsum([0] + [len(j.rows) for j in queries])
            sel = np.concatenate([np.arange(starts[ji], starts[ji + 1]) for ji in keep])
            opts = [queries[ji].options for ji in keep for _ in queries[ji].rows]
            try:
                kept = [r for ji in keep for r in queries[ji].rows]
                preds = self.predict_encoded(h[sel], opts, self.excluded(kept))
            except Exception as exc:
                for ji in keep:
                    out[ji] = exc
                return out
            p = 0
            for ji in keep:
                n = len(queries[ji].rows)
                out[ji] = preds[p : p + n]
                p += n
        return out

    def predict(self, rows: Sequence[InputRow], options: Options) -> list[RowPrediction]:
        return self.predict_queries([Query(rows, options)])[0]

    def fetch_size(self, o: Options) -> int:
        want = o.top_k if o.normalization in ("none", "softmax") else max(o.top_k, MIN_FETCH)
        return min(want, self.n_labels)

    def excluded(self, rows: Sequence[InputRow]) -> list[list[int]] | None:
        """The labels left out of each row's answer (a text input's twins, `trainer.twins`), or None."""
        find = getattr(self.model, "excluded", None)
        if find is None:
            return None
        out: list[list[int]] = find([r.text for r in rows])
        return out if any(out) else None

    def predict_encoded(self, h: npt.NDArray[np.float32], opts: Sequence[Options],
                        exclude: Sequence[Sequence[int]] | None = None) -> list[RowPrediction]:
        """Answers for encoded rows; `exclude` names labels left out of each row's answer, as if the model
        did not hold them (an ev-softmax threshold stays the mean of all K scores)."""
        result: list[RowPrediction | None] = [None] * len(opts)
        groups: dict[tuple[bool, Normalization], list[int]] = {}
        for i, o in enumerate(opts):
            scan_all = o.exact_scan or self._scores_all(o.normalization)
            groups.setdefault((scan_all, o.normalization), []).append(i)
        for (scan_all, norm), idx in groups.items():
            sub = h[idx]
            k = max(self.fetch_size(opts[i]) for i in idx)
            ex = None if exclude is None else [exclude[i] for i in idx]
            preds = self._exact_rows(sub, k, norm, ex) if scan_all else self._index_rows(sub, k, norm, ex)
            for i, p in zip(idx, preds, strict=True):
                result[i] = self._truncate(p, opts[i].top_k)
        return [r for r in result if r is not None]

    # -- paths ----------------------------------------------------------------------------------------
    def _scores_all(self, norm: Normalization) -> bool:
        """Whether this normalization is answered by the exact pass over every label: always when that
        is the retriever; and (ev-)softmax behind the int8 scan: their support is every label (or every
        label above the mean), so no bound on a few scores makes them exact, while the exact pass does,
        and int8 was chosen to serve answers that are certified exact."""
        if self.retriever is self.exact_scorer:
            return True
        return self.retriever.kind == "int8" and norm in ("evsoftmax", "softmax")

    def _threshold(self, h: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        """ev-softmax threshold: mean of all K scores = ⟨mean w, h⟩ + mean b, in O(d) for a linear head;
        a gated (DropMax) head is not linear, so there it takes a pass over all labels."""
        if self.exact_scorer.gate_weight is not None:
            return self.exact_scorer.mean_scores(h)
        return evsoftmax_threshold_linear(h, self.w_mean, self.b_mean)

    def _index_rows(self, h: npt.NDArray[np.float32], k: int, norm: Normalization,
                    exclude: Sequence[Sequence[int]] | None = None) -> list[RowPrediction]:
        # the int8 scan answers sparsemax in one pass: every label that may score within 1 of the best
        reach = SPARSEMAX_REACH if norm == "sparsemax" else None
        more = most_excluded(exclude)
        top = _without(self.retriever.search(h, k + more, reach=reach), exclude, k)
        if norm == "sparsemax" and self.retriever.kind != "int8":
            # scans certify once the support fits; IVF's cell bound does not shrink with k: one step only
            scan = self.retriever.kind in ("exact", "flat")
            cap = MAX_INDEX_FETCH if scan else 4 * k
            top = self._widen_sparsemax(h, top, k, self.retriever, cap, exclude)
        return self._finish(top, norm, self._threshold(h) if norm == "evsoftmax" else None)

    def _widen_sparsemax(
        self, h: npt.NDArray[np.float32], top: TopK, k: int, retr: Retriever, cap: int,
        exclude: Sequence[Sequence[int]] | None = None,
    ) -> TopK:
        """Fetch 4× more labels while some row's sparsemax support may reach beyond what was fetched
        (its bound is finite but above τ); rows with no bound at all (HNSW) cannot be helped."""
        cap = min(cap, self.n_labels)
        while k < cap:
            dist = normalize_topk("sparsemax", top.scores.astype(np.float64), top.bound, self.n_labels)
            if not bool((~dist.exact & np.isfinite(top.bound)).any()):
                break
            k = min(cap, k * 4)
            top = _without(retr.search(h, k + most_excluded(exclude)), exclude, k)
        return top

    def _exact_rows(self, h: npt.NDArray[np.float32], k: int, norm: Normalization,
                    exclude: Sequence[Sequence[int]] | None = None) -> list[RowPrediction]:
        """Exact scoring: widen k until sparsemax's support fits (so the answer is always exact); for
        ev-softmax and softmax sum exp(score) over every label in the support in the same pass, so the
        listed probabilities are those of the full distribution (over the labels not excluded)."""
        if norm in ("evsoftmax", "softmax"):
            t = self._threshold(h) if norm == "evsoftmax" else np.full(h.shape[0], -np.inf)
            top, log_z = self.exact_scorer.search_with_mass(h, k, t, exclude)
            assert log_z is not None
            return self._from_log_z(top, t, log_z)
        top = _without(self.exact_scorer.search(h, k + most_excluded(exclude)), exclude, k)
        if norm == "sparsemax":
            top = self._widen_sparsemax(h, top, k, self.exact_scorer, self.n_labels, exclude)
        preds = self._finish(top, norm, None)
        # Every label was scored: for "none" the top-k is the answer itself.
        if norm == "none":
            preds = [RowPrediction(p.labels, True) for p in preds]
        return preds

    def _finish(
        self, top: TopK, norm: Normalization, thr: npt.NDArray[np.float64] | None
    ) -> list[RowPrediction]:
        n, k = top.ids.shape
        if norm == "none":
            kth = top.scores[:, -1].astype(np.float64) if k else np.full(n, np.inf)
            certified = (top.bound < kth) | np.isneginf(top.bound)
            probs: npt.NDArray[np.float64] | None = None
        else:
            # float32 scores against a threshold computed apart in float64: a score within rounding of
            # it is ambiguous, never certified on one side
            tol = f32_score_tol(top.scores, thr) if thr is not None else 0.0
            dist = normalize_topk(norm, top.scores.astype(np.float64), top.bound, self.n_labels, thr,
                                  score_tol=tol)
            probs, certified = dist.probs, dist.exact
        out = []
        for r in range(n):
            labels = []
            for c in range(k):
                lid = int(top.ids[r, c])
                if lid < 0:
                    break
                p = None if probs is None else float(probs[r, c])
                if p is not None and norm in ("sparsemax", "evsoftmax") and p <= 0.0:
                    continue
                labels.append(self._label(lid, float(top.scores[r, c]), p))
            out.append(RowPrediction(labels, bool(certified[r])))
        return out

    def _from_log_z(
        self, top: TopK, thr: npt.NDArray[np.float64], log_z: npt.NDArray[np.float64]
    ) -> list[RowPrediction]:
        out = []
        for r in range(top.ids.shape[0]):
            labels = []
            for c in range(top.ids.shape[1]):
                lid, s = int(top.ids[r, c]), float(top.scores[r, c])
                if lid < 0 or s < thr[r]:
                    continue
                labels.append(self._label(lid, s, float(np.exp(s - log_z[r]))))
            if not labels and top.ids.shape[1] and top.ids[r, 0] >= 0:
                # rounding put the threshold above the best score: the best label holds all the mass
                lid = int(top.ids[r, 0])
                labels.append(self._label(lid, float(top.scores[r, 0]), 1.0))
            out.append(RowPrediction(labels, True))
        return out

    def _label(self, lid: int, score: float, prob: float | None) -> LabelScore:
        from_text = self.text_only is not None and bool(self.text_only[lid])
        return LabelScore(lid, self.label_names[lid], score, prob, from_text)

    @staticmethod
    def _truncate(p: RowPrediction, top_k: int) -> RowPrediction:
        return p if len(p.labels) <= top_k else RowPrediction(p.labels[:top_k], p.certified)

    def warmup(self) -> None:
        """Touch every path once so the first real request pays no lazy-initialisation cost."""
        if self.input_kind == "text":
            rows = [InputRow(text="warm up")]
        else:
            rows = [InputRow(indices=np.zeros(1, np.int64), values=np.ones(1, np.float32))]
        norms: tuple[Normalization, ...] = ("sparsemax", "evsoftmax", "softmax", "none")
        for norm in norms:
            self.predict(rows, Options(top_k=5, normalization=norm))
        self.predict(rows, Options(top_k=5, normalization="sparsemax", exact_scan=True))


def _without(top: TopK, exclude: Sequence[Sequence[int]] | None, k: int) -> TopK:
    """`top` without each row's excluded labels, cut to k; a label cut off (not excluded) raises the row's
    bound to its score, so the bound still covers every label not returned."""
    if exclude is None:
        return top
    ids, scores, cut_best = drop_excluded(top.ids, top.scores, exclude, k)
    return TopK(ids, scores.astype(np.float32), np.maximum(top.bound, cut_best))
