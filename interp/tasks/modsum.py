"""Modular sum's analysis (the toy task of tasks/modsum.py; these two files are all there is of it):
a verdict from test accuracy, the training curves, and `modsum-cpu`, its default preset. No probe
map. `ModsumAnalysis` is listed in interp/tasks/__init__.py; the preset is registered at the end
of the file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import matplotlib.pyplot as plt
from transformer_lens import HookedTransformer

from interp import plots
from interp.report_format import table_verdict_html
from interp.task_analysis import TaskAnalysis, predictions
from models.config import ModelConfig, RunConfig, TrainConfig
from models.presets import register_preset
from models.runs import LoadedRun
from models.shapes import ANY
from tasks import seeded_generator
from tasks.modsum import ModsumConfig, ModsumTask

LEARNED_ACCURACY = 0.95  # test accuracy from which the model counts as having learned the sum


@dataclass
class ModsumVerdict:
    verdict: str  # learned | unlearned
    accuracy: float  # on fresh test sums
    chance: float  # 1 / p

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def modsum_verdict(model: HookedTransformer, task: ModsumTask, n: int = 2000, seed: int = 0,
                   threshold: float = LEARNED_ACCURACY) -> ModsumVerdict:
    """Test accuracy on `n` fresh sums: learned from `threshold` on."""
    batch = task.sample(n, seeded_generator(seed), split="test")
    accuracy = round((predictions(model, batch) == batch.labels).float().mean().item(), 4)
    return ModsumVerdict("learned" if accuracy >= threshold else "unlearned", accuracy, round(1 / task.cfg.p, 4))


def modsum_curves(metrics: list[dict[str, Any]]) -> plt.Figure:
    """Test accuracy over steps, and loss."""
    records = [m for m in metrics if "acc" in m]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax_acc.plot([m["step"] for m in records], [m["acc"] for m in records], label="test")
    ax_acc.set(xlabel="step", ylabel="accuracy", ylim=(0.0, 1.02), title="accuracy of (a + b) mod p")
    ax_acc.legend(fontsize=8)
    plots.loss_panel(ax_loss, records)
    fig.tight_layout()
    return fig


def modsum_cpu() -> RunConfig:
    """Modular sum, p = 7: one layer of 4 heads, 600 steps; what it reaches and how fast:
    docs/training.md, section "Presets"."""
    return RunConfig(
        task=ModsumConfig(p=7),
        model=ModelConfig(n_layers=1, d_model=64, n_heads=4),
        train=TrainConfig(steps=600, batch_size=128, lr=3e-3, warmup_steps=50, eval_every=100, eval_size=1000,
                          checkpoint_every=300),
    )


class ModsumAnalysis(TaskAnalysis):
    curves_caption = "Test accuracy on fresh sums, and loss."
    verdict_shape = {"verdict": ANY}

    def findings(self, run: LoadedRun, seed: int) -> tuple[None, ModsumVerdict]:
        return None, modsum_verdict(run.model, run.task, seed=seed)

    def headline(self, verdict: ModsumVerdict) -> str:
        return f"{verdict.verdict} (test accuracy {verdict.accuracy}, chance {verdict.chance})"

    def verdict_html(self, verdict: dict[str, Any]) -> str:
        return table_verdict_html(verdict)

    def curves(self, run: LoadedRun) -> plt.Figure:
        return modsum_curves(run.metrics)


register_preset("modsum-cpu", modsum_cpu, default_for="modsum")
