"""Model pieces: the sparse projection's gradient, row-wise optimizers, samplers, encoders."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trainer import optim, row_kernels
from trainer.errors import ParamsError
from trainer.model import ModelShape, RowDropout, XCModel, csr_to_tensors, project_rows, project_table
from trainer.negatives import NegativeSampler
from trainer.optim import RowAdagrad, RowAdam, catch_up_table


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


@settings(max_examples=40, deadline=None)
@given(bags=st.integers(1, 10), n_table=st.integers(1, 40), width=st.integers(1, 24),
       seed=st.integers(0, 2**31))
def test_projecting_straight_from_the_table_equals_projecting_the_gathered_rows(
    bags: int, n_table: int, width: int, seed: int
) -> None:
    """What a training step projects without gathering its input rows: the same sums, and the same
    gradient of the gathered rows (empty bags, a row read twice by one bag)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 6, size=bags)
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
    x_ind = torch.from_numpy(rng.integers(0, n_table, size=int(lengths.sum())).astype(np.int64))
    values = torch.from_numpy(rng.standard_normal(x_ind.numel()).astype(np.float32))
    table = torch.from_numpy(rng.standard_normal((n_table, width)).astype(np.float32))
    g = torch.from_numpy(rng.standard_normal((bags, width)).astype(np.float32))
    ids, inverse = torch.unique(x_ind, return_inverse=True)
    gathered = table.index_select(0, ids).requires_grad_()
    want = project_rows(gathered, inverse, offsets, values)
    got, rows = project_table(table, ids, inverse, offsets, values)
    torch.testing.assert_close(got, want)
    want.backward(g)
    got.backward(g)
    assert rows.grad is not None and gathered.grad is not None and rows.shape == gathered.shape
    torch.testing.assert_close(rows.grad, gathered.grad)
    assert table.grad is None  # the table itself is never differentiated


@pytest.mark.parametrize("make", [RowAdam, RowAdagrad])
def test_a_step_whose_rows_read_no_feature_updates_no_row(make: type[RowAdam] | type[RowAdagrad]) -> None:
    """A batch whose texts hold no known term touches no input row: the table stays as it was."""
    table = torch.randn(5, 3)
    before = table.clone()
    make().step("input", table, torch.zeros(0, 3), 0.1, rows=torch.zeros(0, dtype=torch.int64))
    assert torch.equal(table, before)


@settings(max_examples=40, deadline=None)
@given(bags=st.integers(1, 12), n_rows=st.integers(1, 20), width=st.integers(1, 40),
       seed=st.integers(0, 2**31))
def test_project_rows_gradient_kernel_matches_the_sparse_product(bags: int, n_rows: int, width: int,
                                                                 seed: int) -> None:
    """The fused CPU backward (non-zeros regrouped by table row) is Aᵀ·g, as scipy computes it, with empty
    bags and a row read twice by one bag."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 7, size=bags)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = rng.integers(0, n_rows, size=int(indptr[-1]))
    values = rng.standard_normal(indices.size).astype(np.float32)
    g = torch.from_numpy(rng.standard_normal((bags, width)).astype(np.float32))
    a = sp.csr_matrix((values, indices, indptr), shape=(bags, n_rows))  # duplicates kept, summed by Aᵀ·g
    got = row_kernels.project_rows_grad(torch.from_numpy(indptr[:-1]), torch.from_numpy(indices),
                                        torch.from_numpy(values), g, n_rows)
    torch.testing.assert_close(got, torch.from_numpy(np.asarray(a.T @ g.numpy(), dtype=np.float32)))


@settings(max_examples=30, deadline=None)
@given(p=st.floats(0.0, 0.95), seed=st.integers(0, 2**31))
@example(p=1e-6, seed=0)  # below the mask's grid: rounds to no dropout
def test_row_dropout_keeps_h_in_expectation(p: float, seed: int) -> None:
    """Each element kept with the mask's probability q and scaled by exactly 1/q; every one of the four
    16-bit draws a random word gives keeps at that rate; the gradient is the mask; off in eval mode."""
    drop = RowDropout(p)
    torch.manual_seed(seed)
    h = torch.randn(128, 256).requires_grad_()
    out = drop(h)
    q = 1.0 - drop.cut / RowDropout.LEVELS
    assert abs(q - (1.0 - p)) <= 1.0 / RowDropout.LEVELS
    kept = out.detach() != 0
    torch.testing.assert_close(out.detach()[kept], h.detach()[kept] * (1.0 / q))
    lanes = kept.view(-1, 4).float().mean(0)  # the four 16-bit lanes of each 64-bit draw, apart
    sd = math.sqrt(q * (1 - q) / (h.numel() / 4))
    assert bool(((lanes - q).abs() <= 5 * sd + 1e-9).all()), (lanes, q)
    out.backward(torch.ones_like(out))
    assert h.grad is not None
    torch.testing.assert_close(h.grad, kept.float() * (1.0 / q) if q > 0 else torch.zeros_like(h))
    drop.eval()
    assert torch.equal(drop(h), h)


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


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_row_adam_on_some_rows_follows_dense_adam(
    fused: bool, weight_decay: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows skipped for s steps are caught up on their next touch: the same weights as torch's AdamW
    stepping the whole table with zero gradient rows, after long gaps and early ones alike."""
    if fused and not row_kernels.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(row_kernels, "available", lambda: fused)
    gen = torch.Generator().manual_seed(0)
    k, w, lr = 30, 5, 0.01
    p1 = torch.randn(k, w, generator=gen)
    p2 = torch.nn.Parameter(p1.clone())
    before_rare = p1[29].clone()
    ref = torch.optim.AdamW([p2], lr=lr, weight_decay=weight_decay)
    opt = RowAdam()
    rare = torch.tensor([29])  # touched at step 1 and then once more after 300 steps
    for step in range(1, 402):
        if step in (1, 301):
            rows = rare
        else:
            n = int(torch.randint(1, 8, (1,), generator=gen))
            rows = torch.randperm(k - 1, generator=gen)[:n].sort().values
        g = torch.randn(rows.numel(), w, generator=gen)
        opt.step("w", p1, g, lr, rows=rows, weight_decay=weight_decay)
        full = torch.zeros(k, w)
        full[rows] = g
        p2.grad = full
        ref.step()
    # rows not touched since some step have pending moves; one last step over all rows settles them
    g = torch.randn(k, w, generator=gen)
    opt.step("w", p1, g, lr, rows=torch.arange(k), weight_decay=weight_decay)
    p2.grad = g
    ref.step()
    # with decay, the caught-up moves are decayed over the whole gap (dense: from when each was made),
    # a relative error of about (steps into the gap) · lr · weight_decay on the moves
    tol = 2e-5 if weight_decay == 0.0 else 1e-3
    torch.testing.assert_close(p1, p2.detach(), rtol=0, atol=tol)
    # the rare row moved like dense Adam moves it: far more than the 2 · lr of its own two steps
    assert float((p1[29] - before_rare).abs().max()) > 10 * lr


def test_row_adam_leaves_untouched_rows_until_their_next_touch() -> None:
    p = torch.randn(10, 3)
    before = p.clone()
    opt = RowAdam()
    rows = torch.tensor([2, 7])
    opt.step("w", p, torch.ones(2, 3), 0.1, rows=rows)
    untouched = [i for i in range(10) if i not in (2, 7)]
    torch.testing.assert_close(p[untouched], before[untouched])
    torch.testing.assert_close(p[rows], before[rows] - 0.1, rtol=0, atol=1e-6)  # step 1: -lr · sign(g)


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_row_adam_moments_start_at_zero_whatever_their_memory_held(
    monkeypatch: pytest.MonkeyPatch, kernel: bool, weight_decay: float
) -> None:
    """Moments are allocated unzeroed and zeroed at each row's first update: with memory full of NaN the
    steps (rows first updated at step 1 and late, after missed steps) and the checkpointed state are
    those of zeroed moments."""
    if kernel and not row_kernels.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(row_kernels, "available", lambda: kernel)
    rng = np.random.default_rng(4)
    start = torch.randn(12, 5)
    steps = [(torch.tensor(r), torch.from_numpy(rng.standard_normal((len(r), 5)).astype(np.float32)))
             for r in ([0, 3], [3, 7], [1], [7, 11, 0], [5, 3])]

    def run(fill: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        monkeypatch.setattr(optim, "_unzeroed", lambda shape, like: torch.full(shape, fill))
        p, opt = start.clone(), RowAdam()
        for rows, g in steps:
            opt.step("w", p, g, 0.05, rows=rows, weight_decay=weight_decay)
        return p, opt.state_tensors()

    p_zero, s_zero = run(0.0)
    p_nan, s_nan = run(float("nan"))
    torch.testing.assert_close(p_nan, p_zero, rtol=0, atol=0)
    assert s_nan.keys() == s_zero.keys()
    for key in s_zero:
        torch.testing.assert_close(s_nan[key], s_zero[key], rtol=0, atol=0)
    assert not torch.equal(p_zero, start)


def test_row_adam_reads_checkpoints_of_the_per_row_count_format() -> None:
    """Earlier checkpoints kept per-row update counts (`.t`); resuming from one must not fail."""
    opt = RowAdam()
    mv = torch.zeros(4, 2, 3)
    mv[1, 0] = 0.5
    mv[1, 1] = 0.25
    opt.load_state_tensors({"w.mv": mv, "w.t": torch.tensor([0.0, 7.0, 0.0, 3.0])})
    state = opt.state_tensors()
    assert "w.t" not in state
    torch.testing.assert_close(state["w.last"], torch.tensor([0.0, 7.0, 0.0, 7.0], dtype=torch.float64))
    assert float(state["w.step"]) == 7.0
    p = torch.zeros(4, 3)
    opt.step("w", p, torch.zeros(1, 3), 0.1, rows=torch.tensor([1]))
    assert float(p[1].abs().min()) > 0.0  # its momentum still moves it


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
        want = torch.topk(m.score(h), 3)
        torch.testing.assert_close(torch.from_numpy(vals), want.values)
        assert ids.shape == (5, 3) and ids.tolist() == want.indices.tolist()
    with pytest.raises(ParamsError):
        XCModel(ModelShape(12, 9, 6, encoder="linear", hidden=1))


@settings(max_examples=60, deadline=None)
@given(t0=st.integers(0, 40_000), missed=st.integers(1, 400))
def test_catch_up_table_gives_the_sum_of_dense_adams_missed_steps(t0: int, missed: int) -> None:
    """H[t0] − r^s H[t0 + s] = Σ_{i=1..s} r^i c(t0 + i): the factor of m/√v that dense Adam moves a row by
    over s steps without gradient, also past the table's end (where bias correction is 1)."""
    b1, b2 = 0.9, 0.999
    table = catch_up_table(b1, b2)
    top = len(table) - 1
    r = b1 / math.sqrt(b2)
    got = table[min(t0, top)] - r**missed * table[min(t0 + missed, top)]
    t = np.arange(t0 + 1, t0 + missed + 1, dtype=np.float64)
    want = float(np.sum(r ** (t - t0) * np.sqrt(1.0 - b2**t) / (1.0 - b1**t)))
    assert got == pytest.approx(want, rel=1e-9)
