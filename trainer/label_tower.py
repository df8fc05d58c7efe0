"""The label tower: a label's head row from its text, beside the free part learned from its rows.

The tower maps a label's text to a row, γ · enc(φ(text_k)) · P, where φ is the model's input featurizer, enc
the model's own input encoder (projection and hidden layers, no dropout), P a learned d × d map (identity at
the start) and γ a learned gain; v_k (with the bias) is the free part, the ordinary head row the optimizer
updates from k's rows. Two ways of combining them (`label_tower_mode`):

* apart (the default): a label with rows is its free part alone; the tower is trained beside it on every
  `label_tower_every`-th step, scoring that step's candidates by ⟨h, γ·z·P⟩ + b with h and b held, so it
  learns to rank labels from their texts alone and gives the rows of labels without training rows.
* joint: w_k = v_k + γ·s_k·enc(φ(text_k))·P, s_k = fade / (fade + rows of k) (1 with fade 0).

With `label_tower_detach` (the default) the texts read the encoder without a gradient, so a step does not
back-propagate through its candidates' texts. What the encoder and the free parts learn from the texts,
they learn from text rows (`label_text_rows`, `with_text_rows`): each label with rows and a text also
trains on its text as one more row of that label, an example of it like any other, at the cost of a row.

A step embeds the texts of its candidate labels only (positives and sampled negatives), gathered from a
CSR of every label's featurized text and projected with the batch's rows, so its cost does not grow with
K. A joint step adds the tower's rows to the free parts and scores once. With `label_tower_live` M it
embeds M of its C candidates' texts, drawn afresh each step, and reads the others' z·P from a
cache of every label's, made at each epoch's start and taking each live row as it is embedded: the text
work and the d × d map then cost M, not C, rows a step, and the encoder learns from M texts a step. The
apart mode applies P on the inputs' side (⟨h, z·P⟩ = ⟨h·Pᵀ, z⟩: B·d², not C·d²). The whole head is
materialized for evaluation and saving only: serving reads an ordinary head.

A label with a text and no training rows has no free part (v_k = 0) and is kept out of the sampled
negatives: it would only ever be pushed down, while a label added later by its text (`label_rows`) never
is. Its row takes its direction from the text and its norm and bias from the rarest labels that have rows
(`zero_row_scale`), the norm times `label_tower_zero_scale` and the bias raised by `label_tower_zero_bias`:
how readily a label known by its text alone is answered, against labels that trained on a row or two.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from trainer.errors import ArtifactError, ParamsError
from trainer.model import XCModel
from trainer.negatives import NegativeSampler, SampledNegatives
from trainer.twins import (
    TEXT_ONLY,
    TEXTS_FILE,
    TOWER_CONFIG,
    TOWER_WEIGHTS,
    Twins,
    has_label_tower,
)

TOWER_VERSION = 1
RARE_MAX = 2  # the rarest labels with rows: at most this many rows (or the fewest any label has)


@dataclass
class TextRows:
    """Every label's featurized text as host CSR tensors, and which labels have one (a text whose words
    the featurizer does not know counts as none: its row would be the encoder's bias alone)."""

    indptr: torch.Tensor  # int64 [K+1]
    indices: torch.Tensor  # int64 [nnz]
    values: torch.Tensor  # float32 [nnz]
    has_text: torch.Tensor  # bool [K]

    @classmethod
    def from_csr(cls, x: sp.csr_matrix) -> TextRows:
        x = sp.csr_matrix(x, dtype=np.float32)
        indptr = np.asarray(x.indptr, dtype=np.int64)
        return cls(torch.from_numpy(indptr), torch.from_numpy(np.asarray(x.indices, dtype=np.int64)),
                   torch.from_numpy(np.asarray(x.data, dtype=np.float32)),
                   torch.from_numpy(np.diff(indptr) > 0))

    def csr(self, n_features: int) -> sp.csr_matrix:
        k = self.indptr.numel() - 1
        return sp.csr_matrix((self.values.numpy(), self.indices.numpy(), self.indptr.numpy()),
                             shape=(k, n_features))

    def gather(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(feature ids, bag offsets, values) of the given labels' texts, in EmbeddingBag form."""
        labels = labels.cpu()
        starts = self.indptr.index_select(0, labels)
        counts = self.indptr.index_select(0, labels + 1) - starts
        offsets = torch.cumsum(counts, 0) - counts
        total = int(counts.sum())
        pos = torch.arange(total) - torch.repeat_interleave(offsets - starts, counts, output_size=total)
        return self.indices.index_select(0, pos), offsets, self.values.index_select(0, pos)


class LabelTower(nn.Module):
    """The learned part of the tower (γ) and the label texts it embeds; attached as `model.tower`."""

    def __init__(self, texts: TextRows, gain: float, text_only: np.ndarray, dim: int,
                 weight: np.ndarray | None = None, detach: bool = False, apart: bool = False,
                 every: int = 1, zero_bias: float = 0.0, live: int = 0, zero_scale: float = 1.0) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.tensor([float(gain)]))
        # a learned map from a text's encoding to a row: without it ⟨h(x), enc(text)⟩ is symmetric and peaks
        # where an input's text is the label's own, while a label's text need not read like its inputs
        self.proj = nn.Parameter(torch.eye(dim))
        self.texts = texts
        self.text_only = np.asarray(text_only, dtype=bool)  # [K]: a text and no training rows
        self.embedded = 0  # labels embedded by the last step (the step cost is flat in K)
        self.detach = detach
        # [K]: the share of the tower's row each label gets (0 without a text; `fade_weights`)
        has = texts.has_text.numpy()
        w = np.ones(has.shape, np.float32) if weight is None else np.asarray(weight, np.float32)
        self.weight = torch.from_numpy(np.where(has, w, 0.0).astype(np.float32))
        # apart: labels with rows are their free part alone; a step trains the tower as a scorer of its own
        self.apart = apart
        self.every = every
        self.zero_bias = zero_bias  # added to the bias of the labels without rows (`zero_row_scale`)
        self.zero_scale = zero_scale  # times the row norm of the labels without rows
        self.twins = Twins(0, 0)  # the training rows' twins, counted by the run
        # joint, not detached: a step embeds this many of its candidates' texts with a gradient (0: all of
        # them); the others' rows read `cache`, every label's enc(text)·P as it was last embedded
        self.live = live if not (apart or detach) else 0
        self.cache: torch.Tensor | None = None  # [K, d]
        self.step_weight = self.weight
        if apart:
            self.step_weight = self.weight.clone()
            self.weight = torch.from_numpy(np.where(self.text_only, w, 0.0).astype(np.float32))

    def embeds_at(self, step: int) -> bool:
        """Whether the step at this position of its epoch embeds its candidates' texts: every step when
        joint (the texts are part of the rows it scores), every `every`-th when apart (they only train the
        tower, a d × d map, which needs few steps and ranks unseen labels better for not fitting the
        seen ones' rows too closely)."""
        return not self.apart or step % self.every == 0

    def live_columns(self, n: int, seed: int, epoch: int, start: int) -> torch.Tensor | None:
        """The columns (of a step's n candidates) whose texts the step at row `start` of `epoch` embeds with
        a gradient: a uniform draw, the same on a resumed run (sorted); None: all of them. Drawing from the
        step's positives first lost: the negatives' texts teach the encoder as much as the positives'."""
        if self.live <= 0 or n <= self.live:
            return None
        picked = np.random.default_rng([seed, epoch, start]).choice(n, self.live, replace=False)
        return torch.from_numpy(np.sort(picked).astype(np.int64))

    @torch.no_grad()
    def refresh(self, model: XCModel) -> None:
        """Every label's enc(text)·P afresh into `cache` (eval mode): at each epoch's start, when live."""
        if self.live > 0:
            self.cache = model.encode(self.texts.csr(model.shape.n_features)) @ self.proj

    def embed(self, model: XCModel, projected: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The apart mode's enc(text) times each label's share for a step's candidates ([C, d]), before the
        map and gain (`scorer` applies those to the inputs' side); `projected`: their texts' projection."""
        z = self._encoded(model, projected)
        return z * weight.unsqueeze(1).to(z.dtype)

    def rows(self, model: XCModel, projected: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
             live: torch.Tensor | None) -> torch.Tensor:
        """The joint mode's tower rows γ·s_k·enc(text_k)·P of a step's candidates `labels` ([C, d]) from the
        texts projected: every candidate's, or with `live` those of these columns alone, the other columns
        read from the cache (which takes the live ones' new rows)."""
        y = self._encoded(model, projected) @ self.proj
        if live is not None:
            if self.cache is None:  # a checkpoint written before the cache was kept
                self.refresh(model)
            assert self.cache is not None
            stale = self.cache.index_select(0, labels)
            self.cache.index_copy_(0, labels.index_select(0, live), y.detach())
            y = stale.index_copy_(0, live, y)
        return y * (self.gain * weight.to(y.dtype)).unsqueeze(1)

    def _encoded(self, model: XCModel, projected: torch.Tensor) -> torch.Tensor:
        """enc(text) from the texts' projection (read without a gradient when detached)."""
        self.embedded = int(projected.shape[0])
        with torch.no_grad() if self.detach else contextlib.nullcontext():
            return model.layers(projected.detach() if self.detach else projected)

    def scorer(self, h: torch.Tensor) -> torch.Tensor:
        """γ·h·Pᵀ ([B, d]) for the apart mode's loss: ⟨h, γ·z·P⟩ = ⟨γ·h·Pᵀ, z⟩ costs B·d², not C·d²."""
        return self.gain * (h @ self.proj.T)

    @torch.no_grad()
    def all_rows(self, model: XCModel) -> torch.Tensor:
        """γ·enc(text) of every label ([K, d], eval mode), as `label_rows` computes them."""
        x = self.texts.csr(model.shape.n_features)
        z = model.encode(x) @ self.proj.detach()
        return self.gain.detach() * z * self.weight.to(z.device).unsqueeze(1).to(z.dtype)


def fade_weights(counts: np.ndarray, fade: float) -> np.ndarray:
    """float32 [K]: each label's share of its tower row, fade / (fade + rows) (1 for all when fade is 0):
    a label's rows teach its free part what its text would, so the text matters most where rows are few."""
    n = np.maximum(np.asarray(counts, np.float64), 0.0)
    if fade <= 0:
        return np.ones(n.shape, np.float32)
    return (fade / (fade + n)).astype(np.float32)


def rare_labels(counts: np.ndarray) -> np.ndarray:
    """bool [K]: the rarest labels with rows (at most `RARE_MAX` rows, or the fewest any label has)."""
    counts = np.asarray(counts)
    has = counts > 0
    if not has.any():
        return has
    return has & (counts <= max(RARE_MAX, int(counts[has].min())))


def zero_row_scale(head: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """(norm, bias) a label without rows gets: the median row norm and median bias of the rarest labels
    with rows. Its text gives the direction; labels of the lowest frequency seen give the scale, since the
    free parts of trained labels grow with training and a text-only row of the tower's scale alone would
    lose to every trained label. (0, 0) when no label has rows."""
    rare = rare_labels(counts)
    if not rare.any():
        return 0.0, 0.0
    rows = np.asarray(head[rare], dtype=np.float64)
    return float(np.median(np.linalg.norm(rows[:, :-1], axis=1))), float(np.median(rows[:, -1]))


def scaled_rows(rows: torch.Tensor, norm: float) -> torch.Tensor:
    """Rows rescaled to `norm` (empty rows stay empty)."""
    length = rows.norm(dim=1, keepdim=True)
    return torch.where(length > 0, rows * (norm / length.clamp_min(1e-30)), rows)


def with_text_rows(x: sp.csr_matrix, y: sp.csr_matrix,
                   tower: LabelTower) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """The training rows, then one row per label with a text and training rows: its text, labelled with it
    alone. A label's text is an example of it that the free part and the encoder learn from like any
    other row; labels without rows get none, so they are served from the tower as a label added later
    by its text is."""
    labels = np.flatnonzero(tower.texts.has_text.numpy() & ~tower.text_only)
    texts = tower.texts.csr(x.shape[1])[labels]
    y_texts = sp.csr_matrix((np.ones(labels.size, np.float32), labels, np.arange(labels.size + 1)),
                            shape=(labels.size, y.shape[1]))
    return (sp.vstack([x, texts.astype(x.dtype)], format="csr"),
            sp.vstack([y, y_texts.astype(y.dtype)], format="csr"))


def tower_of(model: XCModel) -> LabelTower | None:
    tower = getattr(model, "tower", None)
    return tower if isinstance(tower, LabelTower) else None


@torch.no_grad()
def materialized_head(model: XCModel, counts: np.ndarray) -> tuple[torch.Tensor, tuple[float, float]]:
    """The head serving reads (free part + tower rows; text-only labels get the scale of the rarest
    labels with rows, `zero_row_scale`), and that (norm, bias)."""
    tower = tower_of(model)
    assert tower is not None
    d = model.shape.dim
    head = model.head.detach().clone()
    head[:, :d] += tower.all_rows(model).to(head.dtype)
    norm, b0 = zero_row_scale(head.cpu().numpy(), counts)
    norm *= tower.zero_scale
    b0 += tower.zero_bias
    only = torch.from_numpy(tower.text_only).to(head.device)
    head[only, :d] = scaled_rows(head[only, :d], norm)
    head[only, d] = b0
    return head, (norm, b0)


@contextlib.contextmanager
def materialized(model: XCModel, counts: np.ndarray) -> Iterator[tuple[float, float] | None]:
    """Within the block `model.head` is the materialized head (evaluation, saving); the free part after.
    Yields the text-only labels' (norm, bias) (None without a tower)."""
    if tower_of(model) is None:
        yield None
        return
    free = model.head.data
    head, scale = materialized_head(model, counts)
    model.head.data = head
    try:
        yield scale
    finally:
        model.head.data = free


class SubsetSampler:
    """A sampler over some of the labels (`ids`, sorted), drawing as `inner` does over range(len(ids))."""

    def __init__(self, inner: NegativeSampler, ids: np.ndarray) -> None:
        self.inner = inner
        self.ids = torch.from_numpy(np.asarray(ids, dtype=np.int64))
        self.kind = inner.kind
        self.generator = inner.generator
        self.n_labels = inner.n_labels

    def draw(self, m: int, device: torch.device | str = "cpu") -> SampledNegatives:
        neg = self.inner.draw(m)
        return SampledNegatives(self.ids.index_select(0, neg.ids).to(device), neg.log_weight.to(device),
                                neg.n_draws)

    def log_q(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner.log_q(torch.searchsorted(self.ids, ids))

    def get_state(self) -> torch.Tensor:
        return self.inner.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.inner.set_state(state)


# ------------------------------------------------------------------------------------ the artifact


def save_tower(directory: Path, *, tower: LabelTower, scale: tuple[float, float], names: Sequence[str],
               texts: dict[str, str]) -> None:
    """Write the tower's files into a model directory being assembled (before it is published)."""
    config = {"version": TOWER_VERSION, "gain": float(tower.gain.detach()[0]), "zero_row_norm": scale[0],
              "zero_row_bias": scale[1],
              "mode": "apart" if tower.apart else "joint",
              # the training rows' twins: when `excluded`, an input's twins are left out of its answers
              "twins": {"rows": tower.twins.rows, "labelled": tower.twins.labelled,
                        "excluded": tower.twins.excluded},
              "combine": ("a label with rows: its free row" if tower.apart else
                          "free + gain * share * encoder(featurizer(text)) @ proj")
                         + "; a label without rows: zero_row_norm * unit(encoder(featurizer(text)) @ proj), "
                           "bias zero_row_bias"}
    (directory / TOWER_CONFIG).write_text(json.dumps(config, indent=2))
    from safetensors.torch import save_file

    tensors = {"gain": tower.gain.detach().cpu().reshape(1).contiguous(),
               "proj": tower.proj.detach().cpu().contiguous(),
               TEXT_ONLY: torch.from_numpy(tower.text_only.astype(np.uint8))}
    save_file(tensors, str(directory / TOWER_WEIGHTS))
    with open(directory / TEXTS_FILE, "w", encoding="utf-8") as fh:
        for name in names:
            text = texts.get(name)
            fh.write(json.dumps({"name": name, "text": text} if text is not None else {"name": name},
                                ensure_ascii=False) + "\n")


@dataclass
class StoredTower:
    """A saved model's tower, enough to give a new label its row from its text."""

    loaded: Any  # trainer.artifact.LoadedModel
    proj: torch.Tensor  # [d, d]
    norm: float
    zero_bias: float

    def zero_rows(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        model = self.loaded.model
        x = self.loaded.featurizer.transform_texts(texts) if texts else None
        d = model.shape.dim
        if x is None:
            return np.zeros((0, d), np.float32), np.zeros(0, np.float32)
        with torch.no_grad():
            z = model.encode(x) @ self.proj.to(model.head.device)
            has = torch.from_numpy(np.diff(x.indptr) > 0).to(z.device)
            rows = scaled_rows(z * has.unsqueeze(1).to(z.dtype), self.norm)
        return (np.ascontiguousarray(rows.cpu().numpy(), dtype=np.float32),
                np.full(len(texts), self.zero_bias, dtype=np.float32))


def _tower_config(directory: Path) -> tuple[float, float, float]:
    try:
        config = json.loads((directory / TOWER_CONFIG).read_text())
        return float(config["gain"]), float(config["zero_row_norm"]), float(config["zero_row_bias"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(str(directory), f"unreadable label tower settings: {exc}") from None


def load_tower_gain(directory: Path) -> float:
    """The tower gain γ a saved model was trained to."""
    return _tower_config(directory)[0]


def load_tower(directory: Path) -> StoredTower:
    from trainer.artifact import load_artifact

    _, norm, b0 = _tower_config(directory)
    loaded = load_artifact(directory)
    if loaded.featurizer.kind != "text":
        raise ArtifactError(str(directory), "the model's input is not text, so a label text cannot be read")
    return StoredTower(loaded, load_tower_tensors(directory)["proj"], norm, b0)


def load_tower_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """The tower's saved tensors (gain, proj, text_only)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(directory / TOWER_WEIGHTS))
    except (OSError, SafetensorError) as exc:
        raise ArtifactError(str(directory), f"unreadable label tower weights: {exc}") from None


def check_usable(is_text: bool, exhaustive: bool, ranks: int) -> None:
    """Refuse the runs a label tower does not support, saying why."""
    if not is_text:
        raise ParamsError("label texts need a text training set (JSONL): a label's text is featurized as "
                          "the input texts are, and a feature file has no words to match it with")
    if exhaustive:
        raise ParamsError("label texts need a sampled loss: an exact loss over all labels would embed every "
                          "label's text at every step")
    if ranks > 1:
        raise ParamsError("label texts train in one process; set nproc_per_node 1")


def label_rows(artifact_dir: Path | str, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Head rows (float32 [n, dim]) and biases (float32 [n]) of labels with these texts and no training
    rows, as training materializes them; ArtifactError for a model without a label tower."""
    d = Path(artifact_dir)
    if not has_label_tower(d):
        raise ArtifactError(str(d), "this model was trained without label texts, so it cannot compute a "
                            "label's row from its text; train it with --label-texts (or a job's label_texts)")
    tower = load_tower(d)
    return tower.zero_rows(list(texts))
