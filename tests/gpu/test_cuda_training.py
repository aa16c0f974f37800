"""Training, resume, patching and analysis on a CUDA device. Every test here is marked `gpu`: where
there is no CUDA it is reported as skipped, with the reason (tests/conftest.py). Run them with
`pytest -m gpu` or `make gpu-check`.

Tolerances: a CUDA run samples its batches on the CPU from the same generators as a CPU run and
starts from the same weights, so the two differ only by float rounding. cuBLAS is bit-for-bit
deterministic only when CUBLAS_WORKSPACE_CONFIG is set before the process starts; resume is
checked within a tolerance without it and bit for bit with it (in a subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from analyses.cli import main
from interp.patching import logit_diff_metric
from models.factory import forward
from models.runs import load_run, read_metrics, read_tensors
from models.train import Trainer
from tasks import logits_at_labels, seeded_generator
from tests.helpers import kill_then_resume, tiny_composite_run, tiny_lego_run
from tests.integration.test_cli import TINY

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def losses(run_dir: Path) -> list[float]:
    return [r["eval_loss"] for r in read_metrics(run_dir) if "eval_loss" in r]


def test_a_cuda_run_learns_and_follows_the_cpu_run_of_its_seed(tmp_path):
    runs = {}
    for device in ("cpu", "cuda"):
        Trainer(tiny_composite_run(steps=60, eval_every=10, lr=3e-3, device=device), tmp_path / device,
                progress=False).fit()
        runs[device] = losses(tmp_path / device)
    assert runs["cuda"][-1] < runs["cuda"][0] - 0.2  # it learns (the CPU run: 5.02 -> 4.71)
    assert runs["cuda"] == pytest.approx(runs["cpu"], abs=1e-3)


@pytest.mark.parametrize("compile, precision", [(False, "bf16"), (True, "fp32"), (True, "bf16")])
def test_bf16_and_compiled_cuda_training_learn_like_eager_fp32(tmp_path, compile, precision):
    base = tiny_composite_run(steps=60, eval_every=10, lr=3e-3, device="cuda")
    Trainer(base, tmp_path / "eager", progress=False).fit()
    mode = base.with_overrides([f"train.compile={str(compile).lower()}", f"train.precision={precision}"])
    Trainer(mode, tmp_path / "mode", progress=False).fit()
    assert losses(tmp_path / "mode") == pytest.approx(losses(tmp_path / "eager"), abs=0.05)


def test_resume_on_cuda_ends_within_float_tolerance_of_an_uninterrupted_run(tmp_path, monkeypatch):
    cfg = tiny_lego_run(steps=30, device="cuda")
    Trainer(cfg, tmp_path / "whole", progress=False).fit()
    kill_then_resume(cfg, tmp_path / "resumed", monkeypatch)
    whole, _ = read_tensors(tmp_path / "whole" / "model.safetensors")
    resumed, _ = read_tensors(tmp_path / "resumed" / "model.safetensors")
    assert whole.keys() == resumed.keys()
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], atol=1e-5, rtol=1e-4)


RESUME_SCRIPT = """
import sys
from pathlib import Path
import pytest, torch
from models.runs import read_tensors
from models.train import Trainer
from tasks import logits_at_labels, seeded_generator
from tests.helpers import kill_then_resume, tiny_lego_run
root, cfg = Path(sys.argv[1]), tiny_lego_run(steps=30, device="cuda")
Trainer(cfg, root / "whole", progress=False).fit()
with pytest.MonkeyPatch.context() as mp:
    kill_then_resume(cfg, root / "resumed", mp)
a, _ = read_tensors(root / "whole" / "model.safetensors")
b, _ = read_tensors(root / "resumed" / "model.safetensors")
print("equal" if all(torch.equal(a[k], b[k]) for k in a) else "differ")
"""


def test_resume_on_cuda_is_bit_exact_with_a_cublas_workspace_config(tmp_path):
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", RESUME_SCRIPT, str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "equal"


def test_exact_patching_equals_transformer_lens_on_cuda():
    """The CPU test's comparison (tests/unit/test_patching.py), with the model and batches on CUDA, fp32."""
    from tests.unit.test_patching import COMPOSITE, LEGO, SWEEPS, counterfactual_setup

    for task in (LEGO, COMPOSITE):
        model, clean, corrupted, _ = counterfactual_setup(task)
        model, clean, corrupted = model.to("cuda"), clean.to("cuda"), corrupted.to("cuda")
        metric = logit_diff_metric(clean, corrupted, 2 if task is LEGO else 0)
        with torch.no_grad():
            _, clean_cache = model.run_with_cache(clean.tokens)
        for ours, theirs in SWEEPS:
            with torch.no_grad():
                expected = theirs(model, corrupted.tokens, clean_cache,
                                  lambda logits, metric=metric: metric(logits).mean())
            result = ours(model, clean.tokens, corrupted.tokens, metric, direction="clean_to_corrupted", max_batch=24)
            assert (result.raw.to(expected.device) - expected).abs().max() <= 1e-4, ours.__name__
            assert expected.std() > 1e-3


def test_a_cuda_trained_run_loads_and_is_analyzed_on_the_cpu(tmp_path, capsys):
    """`workbench analyze` runs on the CPU whatever trained the run: the weights a CUDA run
    saved load there, and the analysis reads the same model as the trainer evaluated."""
    out = tmp_path / "run"
    assert main(["train", "--task", "lego", "--out", str(out), *TINY, "--device", "cuda"]) == 0
    run = load_run(out)
    assert {p.device.type for p in run.model.parameters()} == {"cpu"}
    assert main(["analyze", str(out), "--samples", "64"]) == 0
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["task"] == "lego" and len(analysis["heads"]["labels"]) == 2
    # the CPU copy of the weights gives the eval loss the CUDA trainer recorded
    batch = run.task.sample(run.config.train.eval_size, seeded_generator(run.config.train.seed + 1_000_003),
                            split="test")
    with torch.no_grad():
        picked = logits_at_labels(forward(run.model, batch.tokens), batch.label_pos)
    scored = batch.label_mask & batch.loss_mask
    assert F.cross_entropy(picked[scored], batch.labels[scored]).item() == pytest.approx(losses(out)[-1], abs=1e-4)


def test_a_cpu_trained_run_is_analyzed_on_cuda_like_on_the_cpu(tmp_path, capsys):
    """`workbench analyze --device cuda` moves the model and every batch it samples to the GPU;
    what it measures agrees with the CPU analysis of the same run within fp32 rounding: head
    scores (written to 4 decimals) within 1e-3, exact patching's raw logit differences within 1e-4."""
    out = tmp_path / "run"
    assert main(["train", "--task", "lego", "--out", str(out), *TINY, "--device", "cpu"]) == 0
    analyses = {}
    for device in ("cpu", "cuda"):
        assert main(["analyze", str(out), "--samples", "64", "--device", device]) == 0
        assert capsys.readouterr().out.rstrip().endswith(f"on {device}")
        analyses[device] = json.loads((out / "analysis.json").read_text())
    cpu, cuda = analyses["cpu"], analyses["cuda"]
    assert cuda["heads"]["scores"].keys() == cpu["heads"]["scores"].keys()
    for kind, scores in cpu["heads"]["scores"].items():
        torch.testing.assert_close(torch.tensor(cuda["heads"]["scores"][kind]), torch.tensor(scores), atol=1e-3, rtol=0)
    for sweep in ("residual", "heads"):
        ours, theirs = cuda["patching"][sweep], cpu["patching"][sweep]
        assert ours["method"] == theirs["method"] == "exact"
        torch.testing.assert_close(torch.tensor(ours["raw"]), torch.tensor(theirs["raw"]), atol=1e-4, rtol=0)
        assert ours["clean_metric"] == pytest.approx(theirs["clean_metric"], abs=1e-4)
        assert ours["corrupted_metric"] == pytest.approx(theirs["corrupted_metric"], abs=1e-4)
    assert cuda["patching"]["paths"]["refused"] is None and cuda["patching"]["paths"]["strongest"]
    assert len(cuda["probes"]["accuracy"]) == 3 and cuda["verdict"]["parity_rules"]  # probes and verdict ran there too
