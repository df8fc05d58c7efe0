"""Registers the extra objectives (sparsemax, ev-softmax, DropMax) with the loss registry
(imported by `trainer.losses.load_plugins`)."""

from __future__ import annotations

from trainer.dropmax import HEAD as DROPMAX_HEAD
from trainer.dropmax import dropmax_loss
from trainer.losses import LossSpec, register_loss
from trainer.sparse_losses import evsoftmax_loss, sparsemax_loss, sparsemax_pairs_loss

register_loss(
    "sparsemax",
    LossSpec(sparsemax_loss, doc="sparsemax loss on the candidate set (Martins & Astudillo 2016)"),
)
register_loss(
    "sparsemax-pairs",
    LossSpec(sparsemax_pairs_loss, doc="sparsemax loss per positive pair, other positives removed"),
)
register_loss(
    "evsoftmax",
    LossSpec(evsoftmax_loss, doc="NLL of epsilon-ev-softmax on the candidate set (Chen et al. 2021)"),
)
register_loss(
    "dropmax",
    LossSpec(
        dropmax_loss,
        extra_heads=(DROPMAX_HEAD,),
        doc="DropMax: learned retain probabilities, concrete masks (Lee et al. 2018)",
    ),
)
