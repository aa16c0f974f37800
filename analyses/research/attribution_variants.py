"""Which cheap estimate of head-output patching agrees with exact patching, across trained runs:
the evidence behind "attribution is a screen" (analyses/RESULTS.md, issue 3).

    python -m analyses.research.attribution_variants RUN_DIR [RUN_DIR ...] [--slots 0,1,2] [--n-pairs 32]

For each run and label slot, the Spearman correlation with exact patching (clean -> corrupted,
the benchmark's pairs) of four estimates, by position (layer x pos x head) / per head (layer x
head):
- atp: one-step attribution patching (`attribute_head_out*`), the gradient at the corrupted run;
- ln-frozen: the same with every LayerNorm scale held at its value in the corrupted run, so the
  gradient does not see the norm's response (the linearisation used by LRP for transformers);
- secant: ln-frozen, and each MLP's GELU passes back the secant slope between its corrupted and
  clean pre-activations instead of its local derivative (DeepLIFT's rescale rule), so a neuron
  that the patch switches on is seen;
- ig2: integrated gradients with two steps (`steps=2`), about twice the work.
atp, ln-frozen and secant cost one forward pass of each input and one backward pass; forward
values are unchanged, only the gradient differs. ln-frozen and secant are experiments, not part
of `interp.patching`: none of them agrees robustly enough across runs to offer.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor

from analyses.bench.patching import attribution_agreement, exact_head_patching, unaligned_pairs
from interp.patching import logit_diff_metric
from models.runs import load_run


def _ln_scale_names(model: Any) -> list[str]:
    return [name for name in model.hook_dict if name.endswith("hook_scale")]


@contextmanager
def frozen_norms(model: Any) -> Iterator[None]:
    """Every LayerNorm scale is a constant for autograd (same forward values)."""
    with model.hooks(fwd_hooks=[(name, lambda scale, hook: scale.detach()) for name in _ln_scale_names(model)]):
        yield


@contextmanager
def secant_gelu(model: Any) -> Iterator[dict[str, dict[int, Tensor]]]:
    """In a pass with autograd on, each MLP's activation passes back the secant slope between this
    pass's pre-activation and the one of the latest pass without autograd, instead of its local
    derivative. Forward values unchanged. One-step attribution runs the source input without
    autograd and then the target with it, so the slope spans source -> target; integrated
    gradients (steps > 1) runs both without autograd and is not supported. Yields the recorded
    pre-activations by pass ("source", "target") and layer."""
    recorded: dict[str, dict[int, Tensor]] = {"source": {}, "target": {}}

    def record(pre: Tensor, hook: Any) -> Tensor:
        recorded["target" if torch.is_grad_enabled() else "source"][hook.layer()] = pre
        return pre

    def rescale(post: Tensor, hook: Any) -> Tensor:
        if not torch.is_grad_enabled():
            return post
        layer = hook.layer()
        pre, other = recorded["target"][layer], recorded["source"].get(layer)
        if other is None or other.shape != pre.shape:
            raise ValueError(f"secant_gelu: layer {layer}'s pre-activation {tuple(pre.shape)} has no source pass of "
                             "the same shape; run the source input without autograd first (one-step attribution)")
        slope = _secant_slope(model.blocks[layer].mlp.act_fn, pre.detach(), other)
        return post.detach() + slope * (pre - pre.detach())

    hooks = [(f"blocks.{layer}.mlp.hook_{kind}", fn) for layer in range(model.cfg.n_layers)
             for kind, fn in (("pre", record), ("post", rescale))]
    with model.hooks(fwd_hooks=hooks):
        yield recorded


def _secant_slope(act_fn: Callable[[Tensor], Tensor], a: Tensor, b: Tensor, eps: float = 1e-4) -> Tensor:
    """(f(b) - f(a)) / (b - a), and the derivative at the midpoint where |b - a| < eps."""
    with torch.enable_grad():
        mid = ((a + b) / 2).detach().requires_grad_(True)
        local = torch.autograd.grad(act_fn(mid).sum(), mid)[0]
    gap = b - a
    close = gap.abs() < eps
    return torch.where(close, local, (act_fn(b) - act_fn(a)) / torch.where(close, torch.ones_like(gap), gap))


@contextmanager
def secant_and_frozen_norms(model: Any) -> Iterator[None]:
    with frozen_norms(model), secant_gelu(model):
        yield


VARIANTS: dict[str, tuple[Callable[[Any], Any], int]] = {  # name: (gradient context, integrated-gradient steps);
    # secant_gelu supports one step only
    "atp": (nullcontext, 1), "ln-frozen": (frozen_norms, 1), "secant": (secant_and_frozen_norms,
                                                                        1), "ig2": (nullcontext, 2),
}


def variant_agreement(model: Any, task: Any, slot: int, n_pairs: int = 32, seed: int = 0) -> dict[str, tuple[float,
                                                                                                             float]]:
    """Spearman with exact patching, (by position, per head), for every estimate in VARIANTS."""
    device = next(model.parameters()).device
    clean, corrupted = (batch.to(device) for batch in unaligned_pairs(task, n_pairs, seed))
    metric = logit_diff_metric(clean, corrupted, slot)
    exact = exact_head_patching(model, clean, corrupted, metric)
    agreement = {}
    for name, (context, steps) in VARIANTS.items():
        with context(model):
            found = attribution_agreement(model, clean, corrupted, metric, steps, exact)
        agreement[name] = (found["spearman_head_out_by_pos"], found["spearman_head_out"])
    return agreement


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", help="trained run folders")
    parser.add_argument("--slots", default="0,1,2", help="comma-separated label slots (LEGO: variables)")
    parser.add_argument("--n-pairs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    slots = [int(s) for s in args.slots.split(",")]
    print(f"Spearman with exact patching, by position / per head; slots {slots}")
    for run_dir in args.run_dirs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            run = load_run(run_dir)
        rows: dict[str, list[str]] = {name: [] for name in VARIANTS}
        for slot in slots:
            for name, (by_pos, per_head) in variant_agreement(run.model, run.task, slot, args.n_pairs,
                                                              args.seed).items():
                rows[name].append(f"#{slot} {by_pos:5.2f} / {per_head:5.2f}")
        for name, cells in rows.items():
            print(f"{run_dir:40s} {name:10s} " + "   ".join(cells), flush=True)


if __name__ == "__main__":
    main()
