"""Memory a training job will need, estimated before it is queued, so an impossible job fails at once.

Two kinds of terms. Tables that live for the whole run: the label head (labels × (dim + 1), and the heads
a loss owns), the input projection (features × dim) and the hidden layers, each with its optimizer state,
counted by the trainer's own formula (`trainer.capacity.run_bytes`: Adam keeps two floats per weight and
a step count per row, row-wise Adagrad one float per row), so a job is refused here exactly when its
tables would be refused by the trainer. And what one step allocates: the batch's scores against its
candidate labels (batch × (negatives + batch positives), with their gradient and the loss's working copies),
the gathered candidate rows of the head and the encoder's activations, each with its gradient. The gathered
input rows are bounded by the whole projection, which is how they are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.capacity import run_bytes
from trainer.losses import get_loss
from trainer.params import AUTO_BATCHES, TrainParams

BYTES_PER_FLOAT = 4
# B × C float tensors alive at once in a step: scores, their gradient, the loss's exp/softmax and weights
SCORE_COPIES = 4
# a tensor and its gradient
WITH_GRAD = 2


@dataclass(frozen=True)
class MemoryEstimate:
    labels: int
    features: int
    dim: int
    optimizer: str
    head: int  # weights (floats) of each table
    projection: int
    hidden: int
    head_bytes: int  # each table with its optimizer state, as the trainer counts it
    projection_bytes: int
    hidden_bytes: int
    scores: int  # floats, each term below
    candidate_rows: int
    activations: int
    input_rows: int
    input_param: str | None = None  # the param that sets the input width (None: the dataset does)
    ranks: int = 1  # processes the head is sharded across; every figure is one rank's
    labels_per_rank: int = 0  # the largest shard (0: all labels, one rank)

    @property
    def tables(self) -> int:
        """Bytes of the tables and their optimizer state."""
        return self.head_bytes + self.projection_bytes + self.hidden_bytes

    @property
    def step(self) -> int:
        """Floats one step allocates."""
        return self.scores + self.candidate_rows + self.activations + self.input_rows

    @property
    def bytes(self) -> int:
        return self.tables + self.step * BYTES_PER_FLOAT

    def culprit(self) -> str:
        """The parameter to lower first: the one behind the largest term."""
        terms: dict[str, int] = {}
        # without hidden layers the activations are batch × dim: lowering `hidden` (already 0) frees nothing
        layers = self.hidden > 0
        f = BYTES_PER_FLOAT
        for name, nbytes in (
            ("dim", self.head_bytes + self.candidate_rows * f),
            (self.input_param or "dim", self.projection_bytes + self.input_rows * f),
            ("hidden", self.hidden_bytes + (self.activations * f if layers else 0)),
            ("batch_size", (self.scores + (0 if layers else self.activations)) * f),
        ):
            terms[name] = terms.get(name, 0) + nbytes
        return max(terms, key=lambda k: terms[k])

    def explain(self) -> str:
        b = BYTES_PER_FLOAT
        where = ""
        if self.ranks > 1:
            where = (f" per rank ({self.ranks} ranks, the largest holding {self.labels_per_rank} of the "
                     f"{self.labels} labels)")
        return (
            f"about {human_bytes(self.bytes)}{where}: {self.labels_per_rank or self.labels} labels × "
            f"{self.dim} dims for the label head "
            f"({human_bytes(self.head * b)}), {self.features} features × {self.dim} dims for the input "
            f"projection ({human_bytes(self.projection * b)}), hidden layers "
            f"({human_bytes(self.hidden * b)}), {human_bytes(self.tables)} with their {self.optimizer} "
            f"state; per step {human_bytes(self.scores * b)} of batch × candidate scores, "
            f"{human_bytes(self.candidate_rows * b)} of candidate head rows, "
            f"{human_bytes(self.activations * b)} of activations and {human_bytes(self.input_rows * b)} "
            "of gathered input rows"
        )


def input_features(params: TrainParams, features: int | None) -> int:
    """Model input width: the file's D for sparse data; for text, the hashing size or the vocabulary cap."""
    if features is not None:
        return features
    return params.hash_size if params.hash_size > 0 else params.max_vocab


def estimate(params: TrainParams, labels: int, features: int | None) -> MemoryEstimate:
    """The memory of one process: the whole run with one rank, the largest rank's with several."""
    # batch_size 0 takes its batch from the epoch's rows (`auto_batch_size`), never more than the largest
    d, batch, ranks = params.dim, params.batch_size or max(AUTO_BATCHES), params.nproc_per_node
    n_in = input_features(params, features)
    width = d * (params.pieces if params.encoder == "maxout" else 1)
    hidden = params.hidden * (d * width + width)
    shard = -(-labels // ranks)  # the first shards hold one row more (trainer.label_shards.shard_bounds)
    # the shard's share of the negatives (LabelShard.negatives), all of its rows when M >= K
    negatives = shard if params.negatives >= labels else -(-params.negatives * shard // labels)
    # candidate columns: the sampled negatives plus at least one positive per row, never more than K_r
    candidates = min(shard, negatives + batch)
    heads = 1 + len(get_loss(params.loss).extra_heads)
    return MemoryEstimate(
        labels=labels,
        features=n_in,
        dim=d,
        optimizer=params.optimizer,
        head=shard * (d + 1) * heads,
        projection=n_in * d,
        hidden=hidden,
        # the trainer's formula, one table at a time (it is a sum over tables); a hidden layer is
        # `width` rows of d weights and a bias, on every rank
        head_bytes=run_bytes(labels, 0, params, extra_heads=heads - 1, ranks=ranks).tables,
        projection_bytes=run_bytes(0, n_in, params).tables,
        hidden_bytes=run_bytes(params.hidden * width, 0, params).tables,
        scores=batch * candidates * SCORE_COPIES,
        candidate_rows=candidates * (d + 1) * WITH_GRAD,
        activations=batch * (d + width * params.hidden) * WITH_GRAD,
        input_rows=n_in * d * WITH_GRAD,
        input_param=None if features is not None else ("hash_size" if params.hash_size > 0 else "max_vocab"),
        ranks=ranks,
        labels_per_rank=shard if ranks > 1 else 0,
    )


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
