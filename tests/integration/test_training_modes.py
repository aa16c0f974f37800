"""`train.compile`, `train.precision` and `train.identity_lr_scale`: every model variant trains
under compile to the same function as eager, resume still ends where an uninterrupted run does,
and bf16 is refused where the CPU has no bf16 kernels."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from models.train import Trainer, bf16_supported
from tasks import ConfigError
from tests.helpers import kill_then_resume, tiny_lego_run

needs_compiler = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                                    reason="torch.compile on CPU needs a C++ compiler (g++)")
VARIANTS = {
    "plain": [],
    "tied": ["model.tie_layers=true"],
    "stochastic depth": ["model.n_layers=3", "model.min_depth=1"],
    "planted": ['model.planted={"1.0": "association"}'],
    "identity attention": ["model.identity_attention=true"],
}


@needs_compiler
@pytest.mark.slow  # about two minutes of compilation
def test_compiled_forward_equals_eager_for_every_variant():
    # in a fresh interpreter: the runtime type checkers this suite installs (conftest.py) wrap the
    # planted heads' functions, and dynamo mis-traces those wrappers; users run without them
    script = f"""
import torch
from models.factory import build_model, forward
from models.train import compiled_forward
from tasks import make_task, seeded_generator
from tests.helpers import kill_then_resume, tiny_lego_run
torch.set_num_threads(1)
for name, overrides in {VARIANTS!r}.items():
    cfg = tiny_lego_run().with_overrides(overrides)
    task = make_task(cfg.task)
    model, compiled = build_model(cfg.model, task, seed=1), compiled_forward()
    for param_name, param in model.named_parameters():
        if "identity" in param_name:  # a_h, b_h start at 0: make the identity terms count
            param.data.fill_(1.5)
    tokens = task.sample(8, seeded_generator(0)).tokens
    for depth in ([1, 2] if cfg.model.min_depth else [None]):
        print(name, depth, (compiled(model, tokens, depth) - forward(model, tokens, depth)).abs().max().item())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2]).stdout
    differences = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines()]
    assert len(differences) == len(VARIANTS) + 1 and max(differences) < 1e-5, out


@needs_compiler
def test_a_compiled_run_resumes_to_the_weights_of_an_uninterrupted_compiled_run(tmp_path, monkeypatch):
    cfg = tiny_lego_run(steps=20, compile=True).with_overrides(["model.tie_layers=true", "model.min_depth=1"])
    Trainer(cfg, tmp_path / "whole", progress=False).fit()
    kill_then_resume(cfg, tmp_path / "killed", monkeypatch, at_step=15)  # after the checkpoint at step 10
    whole = load_file(str(tmp_path / "whole/model.safetensors"))
    resumed = load_file(str(tmp_path / "killed/model.safetensors"))
    # measured equal on this CPU; compiled kernels are not promised bit-reproducible (README), so
    # allow float noise, far below the ~lr per step (1e-3) a lost optimizer or RNG state would give
    assert max((whole[k] - resumed[k]).abs().max().item() for k in whole) < 1e-5


@pytest.mark.skipif(bf16_supported(torch.device("cpu")), reason="this CPU has bf16 kernels, so bf16 is not refused")
def test_bf16_is_refused_where_the_cpu_has_no_bf16_kernels(tmp_path):
    with pytest.raises(ConfigError, match="train.precision='bf16'"):
        Trainer(tiny_lego_run(precision="bf16", device="cpu"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not bf16_supported(torch.device("cpu")), reason="this CPU has no bf16 kernels (AVX512-BF16 or AMX)")
def test_bf16_training_learns_like_fp32(tmp_path):
    records = {}
    for precision in ("fp32", "bf16"):
        Trainer(tiny_lego_run(steps=60, precision=precision), tmp_path / precision, progress=False).fit()
        records[precision] = load_file(str(tmp_path / precision / "model.safetensors"))
    assert all(torch.allclose(records["fp32"][k], records["bf16"][k], atol=0.05) for k in records["fp32"])


def test_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="train.precision='fp16'"):
        tiny_lego_run(precision="fp16")


def test_identity_scalars_train_at_their_own_learning_rate(tmp_path):
    cfg = tiny_lego_run(steps=3, identity_lr_scale=50.0,
                        warmup_steps=0).with_overrides(["model.identity_attention=true"])
    trainer = Trainer(cfg, tmp_path / "run", progress=False)
    groups = {g["lr_scale"]: g for g in trainer.optimizer.param_groups}
    assert set(groups) == {1.0, 50.0}
    assert {id(p) for p in groups[50.0]["params"]} == {
        id(p) for n, p in trainer.model.named_parameters() if "identity" in n}
    trainer.fit()
    assert groups[50.0]["lr"] == pytest.approx(50 * groups[1.0]["lr"])
    a = torch.stack([b.attn.identity_a for b in trainer.model.blocks]).abs().max()
    assert a > 10 * cfg.train.lr  # Adam moves a scalar about lr per step: 3 steps at 50 x lr reach far more
