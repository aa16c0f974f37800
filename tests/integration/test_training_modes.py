"""`train.compile`, `train.precision` and `train.identity_lr_scale`: every model variant trains
under compile to the same function as eager, resume still ends where an uninterrupted run does,
and bf16 is refused where the CPU has no bf16 kernels."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from models.device import bf16_supported
from models.train import Trainer
from tasks import ConfigError
from tests.helpers import kill_then_resume, tiny_lego_run
from tests.processes import start

needs_compiler = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                                    reason="torch.compile on CPU needs a C++ compiler (g++)")
VARIANTS = {
    "plain": [],
    "tied": ["model.tie_layers=true"],
    "stochastic depth": ["model.n_layers=3", "model.min_depth=1"],
    "planted": ['model.planted={"1.0": "association"}'],
    "identity attention": ["model.identity_attention=true"],
}


def _in_a_fresh_interpreter(script: str) -> str:
    """`script`'s output, run in a process without the runtime type checkers this suite installs
    (conftest.py): dynamo mis-traces their wrappers; users run without them."""
    command = start(exec, script, {}, cwd=Path(__file__).parents[2])
    assert command.wait(timeout=600) == 0, command.stderr()[-3000:]
    return command.stdout()


STEP_SCRIPT = """
import tempfile
import torch
from models.step import Stack, train_step
from models.train import Trainer
from tests.helpers import tiny_lego_run
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

def train(cfgs, compile, backend, steps=4):
    runs = [Trainer(cfg, tempfile.mkdtemp(), progress=False) for cfg in cfgs]  # nothing is written there
    stack = Stack([r.member() for r in runs], compile=False, precision="fp32", device=torch.device("cpu"))
    if compile:
        torch._dynamo.reset()
        stack.fn = torch.compile(train_step, fullgraph=True, backend=backend)
    for _ in range(steps):
        depth = runs[0].draw_depth()
        stack.step([r._next_batch() for r in runs], [r.learning_rate() for r in runs], depth)
        for r in runs:
            r.step += 1
    for k in range(len(runs)):
        stack.copy_out(k)
    return [dict(r.model.named_parameters()) for r in runs]

for name, overrides in {variants!r}.items():
    base = tiny_lego_run().with_overrides(overrides)
    cfgs = [base] if base.model.min_depth else [base, base.with_overrides(["train.seed=1", "train.lr=0.003"])]
    eager = train(cfgs, False, None)
    compiled = train(cfgs, True, {backend!r})
    worst = max((a[n] - b[n]).abs().max().item() for a, b in zip(eager, compiled) for n in a)
    print(name, len(cfgs), worst)
"""


def _compiled_step_differences(backend: str, variants: dict[str, list[str]] = VARIANTS) -> list[float]:
    out = _in_a_fresh_interpreter(STEP_SCRIPT.format(variants=variants, backend=backend))
    return [float(line.rsplit(" ", 1)[1]) for line in out.splitlines()]


def test_the_stacked_step_compiles_as_one_graph():
    """fullgraph=True: dynamo raises at the first graph break (a host sync, a data-dependent shape,
    an untraceable call), so tracing at all is the check; the eager backend runs the traced graph
    with eager kernels, so the weights also match. Two members of the plain model: the vmapped
    step, which a compiled lone run shares but for the vmap. Every variant (the lone step with a
    block skipped among them): the slow test below."""
    differences = _compiled_step_differences("aot_eager", {"plain": VARIANTS["plain"]})
    assert len(differences) == 1 and max(differences) < 1e-6, differences


@pytest.mark.slow  # about a minute a variant on 2 loaded cores
def test_the_whole_step_compiles_as_one_graph_for_every_variant():
    differences = _compiled_step_differences("aot_eager")
    assert len(differences) == len(VARIANTS) and max(differences) < 1e-6, differences


@needs_compiler
@pytest.mark.slow  # minutes of compilation
def test_the_inductor_compiled_step_equals_the_eager_step_for_every_variant():
    differences = _compiled_step_differences("inductor")
    assert len(differences) == len(VARIANTS) and max(differences) < 1e-5, differences


@needs_compiler
@pytest.mark.slow  # two inductor compilations, minutes on 2 cores
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
    scales = {name: scale for name, (scale, _) in trainer.groups.items()}
    assert set(scales.values()) == {1.0, 50.0}
    assert {n for n, scale in scales.items() if scale == 50.0} == {
        n for n, _ in trainer.model.named_parameters() if "identity" in n}
    trainer.fit()
    a = torch.stack([b.attn.identity_a for b in trainer.model.blocks]).abs().max()
    assert a > 10 * cfg.train.lr  # Adam moves a scalar about lr per step: 3 steps at 50 x lr reach far more
