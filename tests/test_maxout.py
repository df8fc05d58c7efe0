"""Maxout layer: each unit is the max of its pieces; dropout on the input only while training."""

from __future__ import annotations

import pytest
import torch

from trainer.maxout import Maxout
from trainer.model import ModelShape, XCModel, make_hidden_layer


def test_each_unit_is_the_max_of_its_affine_pieces() -> None:
    torch.manual_seed(0)
    layer = Maxout(5, 3, pieces=4)
    x = torch.randn(7, 5)
    z = x @ layer.linear.weight.T + layer.linear.bias  # [7, 12], unit u owns columns 4u..4u+3
    want = torch.stack([z[:, 4 * u : 4 * u + 4].max(dim=1).values for u in range(3)], dim=1)
    torch.testing.assert_close(layer(x), want)


def test_gradient_flows_only_to_the_winning_piece() -> None:
    torch.manual_seed(1)
    layer = Maxout(4, 2, pieces=3)
    x = torch.randn(1, 4)
    layer(x).sum().backward()
    assert layer.linear.bias.grad is not None
    grad = layer.linear.bias.grad.view(2, 3)
    assert torch.equal((grad != 0).sum(dim=1), torch.tensor([1, 1]))


def test_dropout_only_in_training_mode() -> None:
    torch.manual_seed(2)
    layer = Maxout(50, 8, pieces=2, dropout=0.5)
    x = torch.randn(4, 50)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))
    layer.train()
    assert not torch.equal(layer(x), layer(x))


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="pieces"):
        Maxout(3, 3, pieces=0)
    with pytest.raises(ValueError, match="dropout"):
        Maxout(3, 3, pieces=2, dropout=1.0)


def test_encoder_switch_builds_maxout_hidden_layers() -> None:
    assert isinstance(make_hidden_layer("maxout", 8, 3, 0.1), Maxout)
    model = XCModel(ModelShape(n_features=10, n_labels=5, dim=8, encoder="maxout", hidden=2, pieces=3))
    assert sum(isinstance(m, Maxout) for m in model.hidden) == 2
    import scipy.sparse as sp

    h = model.encode(sp.random(3, 10, density=0.5, format="csr", dtype="float32", random_state=0))
    assert h.shape == (3, 8) and torch.isfinite(h).all()
