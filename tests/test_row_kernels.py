"""The fused CPU optimizer kernels against the eager torch update they replace (same maths, one pass)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer import row_kernels
from trainer.optim import RowAdagrad, RowAdam

pytestmark = pytest.mark.skipif(not row_kernels.available(), reason="numba is not installed")


def _run(
    opt_cls: type[RowAdam] | type[RowAdagrad], fused: bool, seed: int, n: int, w: int, wd: float, dense: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    param = torch.randn(n, w, generator=gen)
    opt = opt_cls()
    mp = pytest.MonkeyPatch()
    mp.setattr(row_kernels, "available", lambda: fused)
    try:
        for step in range(4):
            if dense:
                rows = None
                grad = torch.randn(n, w, generator=gen)
            else:
                k = int(torch.randint(1, n + 1, (1,), generator=gen))
                rows = torch.randperm(n, generator=gen)[:k]
                grad = torch.randn(k, w, generator=gen) * (step + 1)
            opt.step("w", param, grad, 0.05, rows=rows, weight_decay=wd)
    finally:
        mp.undo()
    return param, opt.state_tensors()


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 40),
    w=st.integers(1, 9),
    wd=st.sampled_from([0.0, 0.1]),
    dense=st.booleans(),
    adam=st.booleans(),
)
def test_fused_update_matches_eager_update(
    seed: int, n: int, w: int, wd: float, dense: bool, adam: bool
) -> None:
    cls: type[RowAdam] | type[RowAdagrad] = RowAdam if adam else RowAdagrad
    p_fused, s_fused = _run(cls, True, seed, n, w, wd, dense)
    p_eager, s_eager = _run(cls, False, seed, n, w, wd, dense)
    torch.testing.assert_close(p_fused, p_eager, rtol=1e-4, atol=1e-5)  # float64 inside the kernel
    assert s_fused.keys() == s_eager.keys()
    for key in s_fused:
        torch.testing.assert_close(s_fused[key], s_eager[key], rtol=1e-4, atol=1e-6)


def test_non_cpu_float32_tensors_take_the_eager_path() -> None:
    assert not row_kernels.usable(torch.zeros(2, 2, dtype=torch.float64))
    assert not row_kernels.usable(torch.zeros(4, 4)[:, :2])  # a strided view
    assert row_kernels.usable(torch.zeros(2, 2)) == row_kernels.available()


def test_threads_updating_different_tables_at_once_get_the_serial_result() -> None:
    """Two trainings in one process (worker threads) may step at the same moment: no crash, same maths."""
    import threading

    before = torch.get_num_threads()
    torch.set_num_threads(2)  # big updates take the parallel kernels
    try:
        tables = [torch.zeros(3000, 128) for _ in range(4)]
        opts = [RowAdam() for _ in range(4)]
        grads = [torch.full((3000, 128), float(i + 1)) for i in range(4)]
        rows = torch.arange(3000)

        def work(i: int) -> None:
            for _ in range(5):
                opts[i].step("w", tables[i], grads[i], 0.1, rows=rows)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        torch.set_num_threads(before)
    for table in tables:  # a constant positive gradient: Adam moves every entry by -lr per step
        torch.testing.assert_close(table, torch.full_like(table, -0.5), rtol=0, atol=1e-4)


def test_a_kernel_launch_leaves_the_torch_thread_count_alone() -> None:
    """numba's OpenMP pool shares libgomp with torch: a big (parallel) update must not undo a pin."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        RowAdam().step("w", torch.zeros(4000, 128), torch.ones(4000, 128), 0.1, rows=torch.arange(4000))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
