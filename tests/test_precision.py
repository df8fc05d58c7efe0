"""The `precision` training parameter (fp32, or bf16 score products): its values, what bf16 computes, that
a bf16 run learns what an fp32 run learns, and the option through `ovex train`, the jobs API and
continual runs (where it is how a run computes, not what the model is)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from service.cli import main
from tests.jobs.conftest import Server, sqlite_server
from trainer import step as step_module
from trainer.continual import continual_params
from trainer.data import Dataset, write_xc
from trainer.hooks import QuietHooks
from trainer.params import TrainParams
from trainer.step import _product, low_precision, native_bf16
from trainer.synth import synth_dataset
from trainer.train import train

K, D = 60, 400


@pytest.fixture(scope="module")
def data() -> tuple[Dataset, Dataset]:
    return synth_dataset(K, D, 1500, seed=4), synth_dataset(K, D, 300, seed=4, part=1)


def test_params_default_values_and_json_round_trip() -> None:
    assert TrainParams().precision == "auto"
    with pytest.raises(ValidationError, match="precision") as refused:
        TrainParams(precision="fp16")  # type: ignore[arg-type]
    assert [e["loc"] for e in refused.value.errors()] == [("precision",)]
    for value in ("auto", "fp32", "bf16"):
        back = TrainParams.from_json_dict(json.loads(json.dumps(TrainParams(precision=value).to_json_dict())))
        assert back.precision == value
    old = TrainParams().to_json_dict()
    del old["precision"]  # params saved before the field: float32, which is all there was
    assert TrainParams.from_json_dict(old).precision == "fp32"


def test_auto_takes_bf16_products_only_on_a_cpu_that_multiplies_them(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    for native in (True, False):
        monkeypatch.setattr(step_module, "native_bf16", lambda n=native: n)
        assert low_precision("auto", cpu) is native
        assert low_precision("auto", gpu) is False  # on a GPU the casts cost more than the products save
        assert (low_precision("fp32", cpu), low_precision("bf16", cpu)) == (False, True)
        assert (low_precision("fp32", gpu), low_precision("bf16", gpu)) == (False, True)


def test_native_bf16_agrees_with_the_cpu_flags_linux_reports() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo: the CPU's flags are not readable here")
    flags = {f for line in cpuinfo.read_text().splitlines() if line.startswith("flags")
             for f in line.split(":", 1)[1].split()}
    has = flags & {"avx512_bf16", "amx_tile"}
    assert native_bf16() == bool(has), sorted(has)


def test_bf16_products_take_bfloat16_inputs_and_give_float32() -> None:
    """The product of the inputs rounded to bfloat16 (not of the float32 inputs), as float32; its
    gradients reach both inputs as float32."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(64, 33, generator=gen).requires_grad_()
    b = torch.randn(200, 33, generator=gen).requires_grad_()
    low = _product(a, b, True)
    assert low.dtype == torch.float32
    rounded = a.detach().bfloat16().float() @ b.detach().bfloat16().float().T
    exact = a.detach() @ b.detach().T
    torch.testing.assert_close(low.detach(), rounded, rtol=1e-2, atol=2e-2)  # its output is bf16-rounded
    assert float((low.detach() - exact).abs().max()) > 1e-3  # and not the float32 product
    assert torch.equal(_product(a, b, False).detach(), exact)
    low.sum().backward()
    assert a.grad is not None and b.grad is not None
    assert a.grad.dtype == b.grad.dtype == torch.float32
    torch.testing.assert_close(a.grad, b.detach().sum(0).expand_as(a), rtol=2e-2, atol=5e-2)


def test_a_bf16_run_learns_what_an_fp32_run_learns(data: tuple[Dataset, Dataset]) -> None:
    train_ds, test_ds = data
    base = {"dim": 32, "epochs": 3, "batch_size": 100, "negatives": 32, "seed": 1}
    results = {p: train(TrainParams(**base, precision=p), train_ds, test_ds, out_dir=None,  # type: ignore[arg-type]
                        hooks=QuietHooks()) for p in ("fp32", "bf16")}
    p32, p16 = results["fp32"].metrics["p@1"], results["bf16"].metrics["p@1"]
    assert p32 > 0.3 and abs(p32 - p16) < 0.05, (p32, p16)
    assert results["fp32"].final_loss != results["bf16"].final_loss  # the option changed the computation


def test_a_continual_run_computes_as_told_not_as_its_base_did() -> None:
    base = TrainParams(precision="bf16", dim=16)
    assert continual_params(base, TrainParams(), "m").precision == "auto"
    assert continual_params(base, TrainParams(precision="bf16"), "m").precision == "bf16"
    grown = continual_params(TrainParams(dim=16), TrainParams(precision="bf16"), "m")
    assert (grown.precision, grown.dim) == ("bf16", 16)  # the base's shape, the caller's precision


# ------------------------------------------------------------------------------------ ovex train, the API

FAST = ["--dim", "8", "--batch-size", "50", "--negatives", "16", "--group-size", "8", "--epochs", "1",
        "--quiet"]


@pytest.fixture(scope="module")
def xc_file(tmp_path_factory: pytest.TempPathFactory, data: tuple[Dataset, Dataset]) -> Path:
    path = tmp_path_factory.mktemp("precision") / "train.txt"
    write_xc(path, data[0].X, data[0].Y)
    return path


def test_cli_precision_reaches_the_saved_params(xc_file: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--train", str(xc_file), "--out", str(tmp_path / "m"), "--precision", "bf16",
                 *FAST]) == 0
    assert json.loads((tmp_path / "m" / "config.json").read_text())["params"]["precision"] == "bf16"
    with pytest.raises(SystemExit) as refused:  # argparse's choices: usage and the error, exit 2
        main(["train", "--train", str(xc_file), "--out", str(tmp_path / "n"), "--precision", "fp16", *FAST])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "argument --precision: invalid choice: 'fp16'" in err, err
    assert "Traceback" not in err and not (tmp_path / "n").exists()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with sqlite_server(tmp_path_factory.mktemp("precision_srv")) as server:
        yield server


def test_a_job_trains_in_the_precision_it_was_given(srv: Server, xc_file: Path) -> None:
    data = srv.upload(xc_file)["id"]
    tiny: dict[str, Any] = {"dim": 8, "epochs": 1, "batch_size": 50, "negatives": 16, "group_size": 8}
    job_id = srv.submit({"model": "low", "train_dataset": data, "params": {**tiny, "precision": "bf16"}})
    job = srv.wait(job_id, lambda j: j["state"] == "succeeded", 240, "the job to succeed")
    assert job["params"]["precision"] == "bf16"
    config = json.loads((srv.models_dir / "low" / str(job["model_version"]) / "config.json").read_text())
    assert config["params"]["precision"] == "bf16"
    n_jobs = len(srv.client.get("/v1/jobs").json()["jobs"])
    r = srv.client.post("/v1/jobs", json={"model": "m", "train_dataset": data,
                                          "params": {"precision": "fp16"}})
    assert r.status_code == 422, r.text
    errs = [e for e in r.json()["detail"] if e["loc"] == ["body", "params", "precision"]]
    assert errs and "'auto', 'fp32' or 'bf16'" in errs[0]["msg"], r.text
    assert len(srv.client.get("/v1/jobs").json()["jobs"]) == n_jobs
    progress = job["progress"]  # the last report: the final step, its loss read back from the step
    assert progress["step"] == progress["steps_total"] and math.isfinite(progress["loss"]), progress
