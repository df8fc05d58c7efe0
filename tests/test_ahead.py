"""Steps made ahead on a thread (the GPU path) are the very steps of a run made inline: same inputs in the
same order, the same trained weights, and a checkpoint that resumes to the same end."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import trainer.train as train_module
from tests.test_train import Recorder, _params
from trainer.ahead import DEPTH, made_ahead
from trainer.artifact import load_artifact
from trainer.data import Dataset
from trainer.errors import TrainingCancelled
from trainer.synth import synth_dataset
from trainer.train import train


class Counter:
    """A stand-in sampler: each make draws one number; its state is the count drawn so far."""

    def __init__(self) -> None:
        self.drawn = 0

    def make(self, pos: int) -> tuple[int, int]:
        self.drawn += 1
        return pos, self.drawn

    def state(self) -> torch.Tensor:
        return torch.tensor([self.drawn])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 5), st.integers(0, 40), st.booleans())
def test_made_ahead_yields_every_position_in_order_with_its_state(start: int, n: int, threaded: bool) -> None:
    c = Counter()
    with made_ahead(c.make, range(start, start + n), c.state, threaded=threaded) as steps:
        got = [(m.pos, m.inputs, m.sampler_state) for m in steps]
    assert [pos for pos, _, _ in got] == list(range(start, start + n))
    if not threaded:  # nothing made ahead: each step makes its own
        assert c.drawn == 0 and all(inputs is None and state is None for _, inputs, state in got)
        return
    assert [inputs for _, inputs, _ in got] == [(pos, k) for k, pos in enumerate(range(start, start + n), 1)]
    for k, (_, _, state) in enumerate(got, 1):  # the state right after its own make
        assert state is not None and int(state) == k


def test_a_failed_make_is_raised_where_the_steps_are_read() -> None:
    def make(pos: int) -> int:
        if pos == 3:
            raise ValueError("no inputs for step 3")
        return pos

    with pytest.raises(ValueError, match="step 3"), made_ahead(make, range(10), lambda: torch.zeros(1),
                                                                threaded=True) as steps:
        assert [m.inputs for m in steps] == [0, 1, 2]


def test_leaving_early_stops_the_thread_before_it_makes_the_rest() -> None:
    c = Counter()
    before = threading.active_count()
    with made_ahead(c.make, range(1000), c.state, threaded=True) as steps:
        first = next(iter(steps))
    assert first.pos == 0
    assert threading.active_count() == before  # joined
    assert c.drawn <= 2 + DEPTH  # the one read, the queue's worth, the one waiting to be put


@pytest.fixture(scope="module")
def data() -> Dataset:
    return synth_dataset(60, 400, 1500, seed=4)


@pytest.fixture
def ahead_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train_module, "steps_made_ahead", lambda device, group: True)


def _weights(path: Path) -> tuple[np.ndarray, np.ndarray]:
    a = load_artifact(path)
    return a.head_weight, a.model.input_weight.detach().numpy()


@pytest.mark.parametrize("negatives", [{"sampler": "unigram", "group_size": 1}, {"group_size": 8}])
def test_a_run_made_ahead_trains_the_same_weights(data: Dataset, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   negatives: dict[str, object]) -> None:
    params = _params(epochs=2, dropout=0.2, device="cpu", **negatives)  # a GPU's sums are not bit-stable
    train(params, data, None, out_dir=tmp_path / "inline", hooks=Recorder())
    monkeypatch.setattr(train_module, "steps_made_ahead", lambda device, group: True)
    train(params, data, None, out_dir=tmp_path / "ahead", hooks=Recorder())
    for inline, ahead in zip(_weights(tmp_path / "inline"), _weights(tmp_path / "ahead"), strict=True):
        np.testing.assert_array_equal(inline, ahead)


def test_a_checkpoint_made_ahead_resumes_to_the_same_end(data: Dataset, tmp_path: Path,
                                                        ahead_on_cpu: None) -> None:
    """The checkpoint records the sampler as it was after its own step, not after the steps drawn ahead:
    with the later state the resumed run would draw other negatives and end elsewhere."""
    params = _params(epochs=2, dropout=0.2, group_size=8, device="cpu")
    train(params, data, None, out_dir=tmp_path / "full", hooks=Recorder())
    ckpt = tmp_path / "ckpt"
    with pytest.raises(TrainingCancelled):
        train(params, data, None, out_dir=None, hooks=Recorder(stop_after=22), checkpoint_dir=ckpt,
              checkpoint_every=10)
    resumed = train(params, data, None, out_dir=tmp_path / "m", hooks=Recorder(), checkpoint_dir=ckpt,
                    checkpoint_every=10)
    assert resumed.resumed_from_step == 20
    for full, again in zip(_weights(tmp_path / "full"), _weights(tmp_path / "m"), strict=True):
        np.testing.assert_allclose(full, again, rtol=1e-4, atol=1e-5)
