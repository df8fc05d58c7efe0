"""bench/gpu.py stays runnable without a GPU: a tiny CPU run writes its rows and step anatomy, and the
report compares a GPU run with the CPU's rate for the same settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from trainer.step import low_precision

ROOT = Path(__file__).resolve().parent.parent


def test_a_tiny_cpu_run_and_its_report(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--device", "cpu", "--labels", "20000",
         "--rows", "1500", "--extra-batch", "512", "--inline-at", "20000", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cpu = json.loads(out.read_text())
    assert cpu["errors"] == [] and cpu["commit"] and cpu["machine"]["cores"] >= 1
    inline = [s for s in cpu["speed"] if s["inline"]]
    assert sorted(s["batch_size"] for s in inline) == [256, 512] and not any(s["default"] for s in inline)
    rows = {(s["batch_size"], s["requested"]): s for s in cpu["speed"] if not s["inline"]}
    assert set(rows) == {(256, "auto"), (512, "auto"), (256, "bf16")}
    assert rows[(256, "auto")]["default"] and not rows[(512, "auto")]["default"]
    auto = "bf16" if low_precision("auto", torch.device("cpu")) else "fp32"  # what `auto` runs here
    assert [rows[k]["precision"] for k in sorted(rows)] == [auto, "bf16", auto]
    assert all(s["examples_per_s"] > 0 and s["steps"] == 2 * -(-1500 // s["batch_size"])
               for s in rows.values())
    anatomy = cpu["anatomy"]
    assert anatomy["step_ms"] > 0 and anatomy["learn_ms"] > 0 and anatomy["top_ops"]

    # a GPU run of the same settings (its figures made up here) is set against the CPU's rate
    gpu = {**cpu, "machine": {**cpu["machine"], "gpu": "Test GPU"},
           "errors": [{"what": "speed 10", "error": "e"}],
           "speed": [{**rows[(256, "auto")], "precision": "fp32",
                      "examples_per_s": rows[(256, "auto")]["examples_per_s"] * 3,
                      "peak_device_bytes": 2**30, "peak_bytes_per_label": 2**30 / 20000}],
           "anatomy": None}
    (tmp_path / "gpu.json").write_text(json.dumps(gpu))
    script = str(ROOT / "bench" / "gpu.py")
    render = [sys.executable, script, "--render", str(tmp_path / "gpu.json"), str(out)]
    done = subprocess.run(render, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    md = (tmp_path / "gpu.md").read_text()
    assert "| Test GPU | 20,000 | 256 | fp32 |" in md and "| 3.0 | 1.0 | 53,687 |" in md, md
    assert f"CPU (extra) | 20,000 | 512 | {auto} |" in md
    assert "not measured on the Test GPU (speed 10): e" in md
