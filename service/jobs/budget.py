"""Memory a training job will need, estimated before it is queued, so an impossible job fails at once.

The dominant terms are the label head (labels × (dim + 1) floats) and the input projection (features ×
dim); the optimizer keeps state per parameter (Adam two floats, row-wise Adagrad one), so each parameter
costs (1 + state) × 4 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.params import TrainParams

BYTES_PER_FLOAT = 4
# the weight itself + the optimizer's state per weight
OPTIMIZER_MULTIPLIER = {"adam": 3, "adagrad": 2, "sgd": 1}
DEFAULT_MULTIPLIER = 3  # an optimizer we do not know: assume Adam-sized state


@dataclass(frozen=True)
class MemoryEstimate:
    labels: int
    features: int
    dim: int
    parameters: int
    bytes: int
    multiplier: int = DEFAULT_MULTIPLIER
    optimizer: str = "adam"

    def explain(self) -> str:
        return (
            f"about {human_bytes(self.bytes)} ({self.labels} labels × {self.dim} dims for the label head, "
            f"{self.features} features × {self.dim} dims for the input projection, × {BYTES_PER_FLOAT} bytes "
            f"× {self.multiplier} for weights and {self.optimizer} state)"
        )


def input_features(params: TrainParams, features: int | None) -> int:
    """Model input width: the file's D for sparse data; for text, the hashing size or the vocabulary cap."""
    if features is not None:
        return features
    return params.hash_size if params.hash_size > 0 else params.max_vocab


def estimate(params: TrainParams, labels: int, features: int | None) -> MemoryEstimate:
    d = params.dim
    n_in = input_features(params, features)
    head = labels * (d + 1)
    projection = n_in * d
    width = d * (params.pieces if params.encoder == "maxout" else 1)
    hidden = params.hidden * (d * width + width) if params.encoder != "linear" or params.hidden else 0
    n_params = head + projection + hidden
    optimizer = str(getattr(params, "optimizer", "adam"))
    mult = OPTIMIZER_MULTIPLIER.get(optimizer, DEFAULT_MULTIPLIER)
    return MemoryEstimate(labels, n_in, d, n_params, n_params * BYTES_PER_FLOAT * mult, mult, optimizer)


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
