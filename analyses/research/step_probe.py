"""Per-step instruments around a moment of a run: replay it from a kept training state (its
states/, `train.keep_state` or an event snapshot) for a few steps, each recorded:

    python -m analyses.research.step_probe RUN@STEP [--steps 20] [--set train.loss_dtype=float64 ...]

One JSON line per step, printed, with:
- `train_loss`: the step's training loss (in the loss's dtype);
- `zero_loss_share`: the share of the batch's supervised labels whose cross-entropy is exactly 0
  in the loss's dtype (at a mean float32 loss near 1e-7 most are: their gradient is 0 too);
- `grad_norm`: the total gradient norm before clipping, and `grad_norms`: per tensor;
- `unembed_bias_grad_sum`: the sum of the unembedding bias's gradient (0 up to rounding: the
  softmax gradient sums to zero over the vocabulary, so a sum far from 0 means the loss absorbed it);
- `update_rms`, `update_max`: the root mean square and the largest absolute change of the weights
  this step, over the step's learning rate: Adam's preconditioned step (weight decay included).

The replay is the run's own step (models/step.py, eager, on the CPU unless --device says otherwise),
in a temporary folder; nothing is written to RUN. With nothing changed the steps are RUN's own.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from models.run_folder import RunFolder, fork_run
from models.runs import read_config
from models.step import Stack, label_losses
from models.train import Trainer
from tasks import logits_at_labels


def probe_steps(run: Path, step: int, n_steps: int, overrides: list[str] | None = None) -> list[dict[str, Any]]:
    """The instruments of the `n_steps` steps after `step` of `run` (module docstring)."""
    cfg = read_config(run).with_overrides(list(overrides or []))
    with tempfile.TemporaryDirectory() as tmp:
        folder = RunFolder(Path(tmp) / "probe")
        fork_run(run, step, folder, cfg)
        trainer = Trainer(cfg, folder, resume=True, progress=False)
        trainer._restore()
        train = cfg.train
        stack = Stack([trainer.member()], compile=False, precision=train.precision, device=trainer.device,
                      adam=(train.adam_beta2, train.adam_eps), loss=(train.loss_dtype, train.softmax))
        records = []
        for _ in range(min(n_steps, train.steps - trainer.step)):
            batch, lr = trainer._next_batch(), trainer.learning_rate()
            before = {n: p.detach().clone() for n, p in stack.params.items()}
            record = _gradient_record(trainer, batch.to(trainer.device), train.loss_dtype, train.softmax)
            loss = stack.step([batch], [lr], trainer.draw_depth())
            changes = torch.cat([(stack.params[n] - before[n]).flatten() for n in before]) / lr
            stack.copy_out(0)  # the model holds the new weights, for the next step's gradients
            trainer.step += 1
            records.append({"step": trainer.step, "lr": lr, "train_loss": float(loss[0]), **record,
                            "update_rms": changes.pow(2).mean().sqrt().item(),
                            "update_max": changes.abs().max().item()})
        return records


def _gradient_record(trainer: Trainer, batch, dtype: str, softmax: str) -> dict[str, Any]:
    """Per-label losses and the gradients of one batch on the run's current weights (in its model),
    at full depth, with the training loss's dtype and softmax."""
    model = trainer.model
    model.zero_grad(set_to_none=True)
    picked = logits_at_labels(model(batch.tokens), batch.label_pos)
    picked = picked.double() if dtype == "float64" else picked.float()
    mask = batch.loss_mask
    losses = label_losses(picked[mask], batch.labels[mask], softmax)
    losses.mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    norms = {n: g.norm().item() for n, g in grads.items()}
    bias = grads.get("unembed.b_U")
    return {"zero_loss_share": (losses == 0).float().mean().item(),
            "grad_norm": float(torch.tensor(list(norms.values())).norm()), "grad_norms": norms,
            "unembed_bias_grad_sum": None if bias is None else bias.sum().item()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analyses.research.step_probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("moment", metavar="RUN@STEP", help="a run folder and a step it kept the state of")
    parser.add_argument("--steps", type=int, default=20, help="how many steps to record (default 20)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting changed for the replay, e.g. train.loss_dtype=float64 (repeatable)")
    args = parser.parse_args(argv)
    run, _, step = args.moment.rpartition("@")
    if not run or not step.isdigit():
        parser.error(f"{args.moment!r}: write RUN@STEP, e.g. runs/c1@2000")
    for record in probe_steps(Path(run), int(step), args.steps, args.overrides):
        print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
