"""Model pieces: the sparse projection's gradient, row-wise optimizers, samplers, encoders."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from trainer.errors import ParamsError
from trainer.model import ModelShape, XCModel, csr_to_tensors, project_rows
from trainer.negatives import NegativeSampler
from trainer.optim import RowAdagrad, RowAdam


def test_project_rows_gradient_matches_embedding_bag_autograd() -> None:
    dense = sp.random(7, 30, density=0.3, dtype=np.float32, random_state=1).toarray()
    dense[3] = 0  # an empty row
    x = sp.csr_matrix(dense)
    ind, off, val = csr_to_tensors(x)
    table = torch.randn(30, 5, dtype=torch.float32)
    t1 = table.clone().requires_grad_()
    t2 = table.clone().requires_grad_()
    g = torch.randn(7, 5)
    h1 = project_rows(t1, ind, off, val)
    h2 = F.embedding_bag(ind, t2, off, mode="sum", per_sample_weights=val)
    torch.testing.assert_close(h1, h2)
    torch.testing.assert_close(h1, torch.from_numpy(x.toarray()) @ table)
    h1.backward(g)
    h2.backward(g)
    assert t1.grad is not None and t2.grad is not None
    torch.testing.assert_close(t1.grad, t2.grad)


def test_row_adam_on_all_rows_matches_torch_adam() -> None:
    torch.manual_seed(0)
    p1 = torch.randn(6, 4)
    p2 = torch.nn.Parameter(p1.clone())
    ref = torch.optim.Adam([p2], lr=0.05)
    opt = RowAdam()
    for _ in range(5):
        g = torch.randn(6, 4)
        opt.step("w", p1, g, 0.05, rows=None)
        p2.grad = g.clone()
        ref.step()
    torch.testing.assert_close(p1, p2.detach(), rtol=1e-4, atol=1e-5)


def test_row_adam_updates_only_touched_rows_with_their_own_step_count() -> None:
    torch.manual_seed(0)
    p = torch.randn(10, 3)
    before = p.clone()
    opt = RowAdam()
    rows = torch.tensor([2, 7])
    g = torch.ones(2, 3)
    opt.step("w", p, g, 0.1, rows=rows)
    untouched = [i for i in range(10) if i not in (2, 7)]
    torch.testing.assert_close(p[untouched], before[untouched])
    # first Adam step of a row is -lr * sign(g) (bias-corrected), whatever the global step
    torch.testing.assert_close(p[rows], before[rows] - 0.1, rtol=0, atol=1e-6)
    opt.step("w", p, torch.ones(1, 3), 0.1, rows=torch.tensor([5]))
    torch.testing.assert_close(p[5], before[5] - 0.1, rtol=0, atol=1e-6)


def test_row_adagrad_first_step_is_normalised() -> None:
    p = torch.zeros(4, 2)
    opt = RowAdagrad()
    opt.step("w", p, torch.tensor([[3.0, 4.0]]), 0.5, rows=torch.tensor([1]))
    rms = float(np.sqrt((9 + 16) / 2))
    torch.testing.assert_close(p[1], torch.tensor([-0.5 * 3 / rms, -0.5 * 4 / rms]))
    assert float(p[[0, 2, 3]].abs().sum()) == 0.0


@pytest.mark.parametrize("kind", ["uniform", "unigram"])
def test_sampler_frequencies_and_weights(kind: str) -> None:
    k = 20
    counts = np.arange(k) ** 2
    s = NegativeSampler(k, kind, 0.75, counts, seed=0)
    raw = s.draw_raw(200_000).numpy()
    freq = np.bincount(raw, minlength=k) / raw.size
    q = np.exp(s.log_q(torch.arange(k)).numpy())
    np.testing.assert_allclose(q.sum(), 1.0, rtol=1e-5)
    np.testing.assert_allclose(freq, q, atol=0.005)
    draw = s.draw(64)
    assert torch.equal(draw.ids, torch.unique(draw.ids))
    # Σ_j weight_j = Σ_j count_j / (M q_j): an unbiased estimate of K (checked on average)
    est = np.mean([float(torch.exp(s.draw(8).log_weight).sum()) for _ in range(3000)])
    assert abs(est - k) < 0.1 * k


def test_encoders_and_shapes() -> None:
    x = sp.random(5, 12, density=0.5, format="csr", dtype=np.float32, random_state=2)
    for encoder, hidden in [("linear", 0), ("mlp", 2)]:
        m = XCModel(ModelShape(12, 9, 6, encoder=encoder, hidden=hidden, dropout=0.5))
        h = m.encode(x)
        assert h.shape == (5, 6)
        torch.testing.assert_close(m.encode(x), h)  # eval mode: dropout off, deterministic
        assert m.score(h).shape == (5, 9)
        ids, vals = m.topk(x, 3, budget=9)  # one row per block
        torch.testing.assert_close(torch.from_numpy(vals), torch.topk(m.score(h), 3).values)
        assert ids.shape == (5, 3)
    with pytest.raises(ParamsError):
        XCModel(ModelShape(12, 9, 6, encoder="linear", hidden=1))
