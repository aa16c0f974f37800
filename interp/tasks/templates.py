"""The templates task's analysis: the verdict (accuracy on strings of training symbols and of
symbols never seen in training: generalises, memorises or unlearned), the report's curves, and
`templates-cpu` as the task's default preset. No probe map. `TemplatesAnalysis` is listed in
interp/tasks/__init__.py; the preset is registered at the end of the file.
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
from models.shapes import ANY, Keyed
from tasks import TemplatesConfig, TemplatesTask, seeded_generator

LEARNED_ACCURACY = 0.95  # the accuracy from which a split counts as learned (as a LEGO variable)


@dataclass
class TemplatesVerdict:
    verdict: str  # generalises | memorises | unlearned
    accuracy: dict[str, float]  # per split of the symbol alphabet: train, val, test
    chance: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def templates_verdict(model: HookedTransformer, task: TemplatesTask, n: int = 2000, seed: int = 0,
                      threshold: float = LEARNED_ACCURACY) -> TemplatesVerdict:
    """Accuracy on strings of training symbols and of symbols never seen in training. A model
    that reaches `threshold` on both generalises; on training symbols only, it memorises."""
    gen = seeded_generator(seed)
    accuracy = {}
    for split in ("train", "val", "test"):
        batch = task.sample(n, gen, split=split)
        accuracy[split] = round((predictions(model, batch) == batch.labels).float().mean().item(), 4)
    if accuracy["train"] < threshold:
        verdict = "unlearned"
    else:
        verdict = "generalises" if accuracy["test"] >= threshold else "memorises"
    return TemplatesVerdict(verdict, accuracy, round(task.chance_accuracy(), 4))


def templates_curves(metrics: list[dict[str, Any]]) -> plt.Figure:
    """Test accuracy (symbols never seen in training) over steps, per class where there are
    classes, and loss."""
    return plots.rates_and_loss(metrics, [("acc", "all"), ("acc_same", "same"), ("acc_different", "different")],
                                ylabel="test accuracy", title="accuracy on unseen symbols")


def templates_cpu() -> RunConfig:
    """Same-different on unseen symbols: 256 training symbols, 2 layers, identity-augmented
    attention, fixed random embeddings (as a templates-efficiency cpu cell); test = unseen symbols."""
    return RunConfig(
        task=TemplatesConfig(template="same_different", n_train_symbols=256, n_val_symbols=16, n_test_symbols=512),
        model=ModelConfig(n_layers=2, d_model=64, n_heads=4, identity_attention=True, fixed_embeddings=True),
        train=TrainConfig(steps=600, batch_size=256, lr=3e-3, warmup_steps=50, eval_every=150, eval_size=1000,
                          checkpoint_every=600),
    )


class TemplatesAnalysis(TaskAnalysis):
    curves_caption = "Accuracy on strings of test symbols, never seen in training."
    verdict_shape = {"verdict": ANY, "accuracy": Keyed(float)}

    def findings(self, run: LoadedRun, seed: int) -> tuple[None, TemplatesVerdict]:
        return None, templates_verdict(run.model, run.task, seed=seed)

    def headline(self, verdict: TemplatesVerdict) -> str:
        return f"{verdict.verdict} (accuracy per symbol split {verdict.accuracy})"

    def verdict_html(self, verdict: dict[str, Any]) -> str:
        return table_verdict_html(verdict)

    def curves(self, run: LoadedRun) -> plt.Figure:
        return templates_curves(run.metrics)

    def metric_words(self) -> dict[str, str]:
        return {"acc": "accuracy on strings of unseen symbols (fraction)",
                "error": "error on strings of unseen symbols (fraction)"}

    def timeline_panels(self, verdict: dict[str, Any]) -> dict[str, dict[str, float]]:
        return {"error per symbol split": {f"{split} error": round(1 - acc, 4)
                                           for split, acc in verdict["accuracy"].items()}}


register_preset("templates-cpu", templates_cpu, default_for="templates")
