"""The trainer's GPU path. Everywhere: a step's tensors packed for the device come back whole, and the
pieces a GPU step moves to the host (the masked pairs) give the same loss. With a GPU: a GPU step equals
the CPU step, in float32 and in bfloat16 to that type's rounding; a GPU checkpoint resumes on the CPU,
where the run ends as it would have on the GPU, and its artifact loads on the CPU."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import trainer.train as train_module
from tests.test_train import Recorder
from trainer.artifact import load_artifact
from trainer.data import Dataset
from trainer.errors import TrainingCancelled
from trainer.label_shards import LabelShard
from trainer.losses import CandidateBatch, get_loss, masked_negative_pairs, ove_loss, sampled_candidates
from trainer.model import ModelShape, XCModel
from trainer.negatives import NegativeSampler
from trainer.params import TrainParams
from trainer.step import EpochData, Stepper, _as_csr32
from trainer.synth import synth_dataset
from trainer.train import train
from trainer.transfer import pack, to_device, unpack

NO_GPU = "no CUDA device (torch.cuda.is_available() is False): the GPU path cannot run here"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
K, D = 80, 300

DTYPES = [torch.int64, torch.float32, torch.bool, torch.float64]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(DTYPES))),
                          st.lists(st.integers(0, 5), min_size=0, max_size=3)), max_size=8))
def test_packed_tensors_come_back_whole(specs: list[tuple[int, list[int]]]) -> None:
    """Grouped by dtype into one buffer each and cut back: every tensor with its values, dtype and shape
    (empty ones, 0-d ones and several of a dtype included)."""
    gen = torch.Generator().manual_seed(len(specs))
    tensors = {}
    for n, (which, shape) in enumerate(specs):
        dtype = DTYPES[which]
        t = torch.randint(-50, 50, tuple(shape), generator=gen)
        tensors[f"t{n}"] = t.to(dtype) if dtype != torch.bool else t > 0
    packed = pack(tensors)
    assert len(packed) == len({t.dtype for t in tensors.values()})
    back = unpack(packed)
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name], t)


def test_tensors_already_on_the_device_are_not_copied() -> None:
    tensors = {"a": torch.arange(3), "b": torch.ones(2)}
    moved = to_device(tensors, torch.device("cpu"))
    assert all(moved[k] is tensors[k] for k in tensors)


def test_masked_pairs_worked_out_ahead_give_the_loss_worked_out_in_it() -> None:
    """A GPU step finds the (pair, sampled column) entries to leave out on the host; the loss must be the
    one it computes itself, value and gradients."""
    gen = torch.Generator().manual_seed(1)
    y_ptr = torch.tensor([0, 2, 3, 6, 7])
    y_ind = torch.tensor([1, 4, 2, 0, 5, 9, 4])
    for group_size in (1, 4):
        sampler = NegativeSampler(12, seed=3)
        cand = sampled_candidates(y_ptr, y_ind, sampler, 8, group_size)
        scores = torch.randn(4, cand.label_ids.numel(), generator=gen).requires_grad_()
        ahead = cand.with_tensors({"masked": torch.stack(masked_negative_pairs(cand))})
        assert ahead.masked is not None and ahead.masked.shape[1] > 0  # the case is exercised
        values: list[tuple[torch.Tensor, torch.Tensor]] = []
        for c in (cand, ahead):
            scores.grad = None
            loss = ove_loss(CandidateBatch(cand=c, scores=scores, h=torch.zeros(4, 2)))
            loss.backward()
            assert scores.grad is not None
            values.append((loss.detach(), scores.grad.clone()))
        torch.testing.assert_close(values[0][0], values[1][0], rtol=0, atol=0)
        torch.testing.assert_close(values[0][1], values[1][1], rtol=0, atol=0)


# ------------------------------------------------------------------------------------ with a GPU


def _toy() -> Dataset:
    return synth_dataset(K, D, 600, seed=2)


def _stepper(device: str, params: TrainParams, ds: Dataset) -> tuple[Stepper, EpochData]:
    shape = ModelShape(n_features=D, n_labels=K, dim=params.dim, dropout=0.0)
    model = XCModel(shape, seed=5).to(device)
    sampler = NegativeSampler(K, "uniform", seed=9)
    stepper = Stepper(model, get_loss(params.loss), params, sampler, shard=LabelShard(0, K, K))
    assert ds.X is not None
    ep = EpochData(_as_csr32(ds.X), _as_csr32(ds.Y), np.arange(ds.n_rows))
    return stepper, ep


@needs_gpu
@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_gpu_step_equals_the_cpu_step(optimizer: str, precision: str) -> None:
    """Five steps of the sampled, grouped OVE step from the same weights and draws: the same losses and
    the same touched rows, to float32 rounding (bfloat16's when the score products are in bfloat16)."""
    ds = _toy()
    params = TrainParams(dim=16, negatives=24, group_size=8, batch_size=64, dropout=0.0,
                         optimizer=optimizer, precision=precision)  # type: ignore[arg-type]
    runs = {}
    for device in ("cpu", "cuda"):
        stepper, ep = _stepper(device, params, ds)
        losses = [float(stepper.step(ep, s * 64, (s + 1) * 64, 0.02)) for s in range(5)]
        runs[device] = (losses, stepper.model.head.detach().cpu(), stepper.model.input_weight.detach().cpu())
    rtol, atol = (1e-4, 1e-5) if precision == "fp32" else (2e-2, 2e-3)
    np.testing.assert_allclose(runs["cpu"][0], runs["cuda"][0], rtol=rtol, atol=atol)
    for a, b in zip(runs["cpu"][1:], runs["cuda"][1:], strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    assert not torch.equal(runs["cpu"][1], _stepper("cpu", params, ds)[0].model.head)  # it moved


@needs_gpu
def test_a_gpu_checkpoint_resumes_on_the_cpu(tmp_path: Path) -> None:
    """Stopped on the GPU after a checkpoint, resumed with device cpu: the run ends where the GPU run
    ends (no dropout: the same rows and draws), and the artifact the CPU wrote predicts on the CPU."""
    ds, test = _toy(), synth_dataset(K, D, 200, seed=2, part=1)
    gpu = TrainParams(dim=16, epochs=2, batch_size=50, negatives=24, group_size=8, dropout=0.0, device="cuda")
    full = train(gpu, ds, test, out_dir=tmp_path / "full", hooks=Recorder())
    ckpt = tmp_path / "ckpt"
    with pytest.raises(TrainingCancelled):
        train(gpu, ds, None, out_dir=None, hooks=Recorder(stop_after=17), checkpoint_dir=ckpt,
              checkpoint_every=8)
    resumed = train(gpu.model_copy(update={"device": "cpu"}), ds, test, out_dir=tmp_path / "cpu",
                    hooks=Recorder(), checkpoint_dir=ckpt, checkpoint_every=8)
    assert resumed.resumed_from_step == 16 and resumed.steps == full.steps == 24
    a, b = load_artifact(tmp_path / "full"), load_artifact(tmp_path / "cpu")
    assert a.model.head.device.type == b.model.head.device.type == "cpu"
    np.testing.assert_allclose(a.head_weight, b.head_weight, rtol=1e-3, atol=1e-4)
    assert math.isclose(full.metrics["p@1"], resumed.metrics["p@1"], abs_tol=0.02)
    assert test.X is not None
    ids, _ = a.model.topk(_as_csr32(test.X), 3)
    assert ids.shape == (test.n_rows, 3)


@needs_gpu
def test_a_gpu_run_made_ahead_ends_where_one_made_inline_does(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's steps made ahead on a thread (`trainer.ahead`) are the steps made in turn: the same
    draws in the same order, so the same weights to the GPU's float rounding."""
    ds = _toy()
    gpu = TrainParams(dim=16, epochs=2, batch_size=50, negatives=24, group_size=8, dropout=0.0, device="cuda")
    train(gpu, ds, None, out_dir=tmp_path / "ahead", hooks=Recorder())
    monkeypatch.setattr(train_module, "steps_made_ahead", lambda device, group: False)
    train(gpu, ds, None, out_dir=tmp_path / "inline", hooks=Recorder())
    a, b = load_artifact(tmp_path / "ahead"), load_artifact(tmp_path / "inline")
    np.testing.assert_allclose(a.head_weight, b.head_weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a.model.input_weight, b.model.input_weight, rtol=1e-4, atol=1e-5)
