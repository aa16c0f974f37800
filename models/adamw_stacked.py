"""AdamW over stacked parameters: K members' copies of one parameter in one tensor [K, ...], each
member with its own learning rate and weight decay, and gradient-norm clipping per member.

It does, per member, what `torch.optim.AdamW` does as the trainer builds it (models/train.py:
betas 0.9 / 0.999, eps 1e-8, decoupled weight decay, no amsgrad; on the CPU its single-tensor
algorithm) and what `torch.nn.utils.clip_grad_norm_` does, with the same floating-point
operations in the same order, so that a member's weights equal a lone run's bit for bit where the
gradients are (tests/integration/test_ensemble.py). Per-member scalars (lr, bias corrections,
weight decay factors) are computed in Python doubles as torch does, rounded to float32 once, and
broadcast over the member's slice: `x * s` with `s` a float32 tensor is `x.mul_(s)` with `s` a
Python float. Only the CUDA clipping norm differs: one batched reduction per parameter (a loop
over members costs K launches each), equal to the lone norm within float rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

BETAS = (0.9, 0.999)  # torch.optim.AdamW's defaults, which the trainer uses
EPS = 1e-8


def per_member(values: list[float], like: Tensor, cache: dict | None = None) -> Tensor:
    """A float32 column [K, 1, ...] of per-member scalars, to broadcast over `like` [K, ...]. With
    `cache` (one step's), equal columns are made once: on a GPU each is a copy from the host."""
    key = (tuple(values), like.dim())
    if cache is not None and key in cache:
        return cache[key]
    column = torch.tensor(values, dtype=like.dtype, device=like.device).reshape(-1, *[1] * (like.dim() - 1))
    if cache is not None:
        cache[key] = column
    return column


class StackedAdamW:
    """AdamW's state and step for stacked parameters (`params`: name -> [K, ...] leaf tensors).

    lr_scale, weight_decay: per parameter name, one value per member (its param group's in the
    lone trainer's optimizer). `state`: per name, `exp_avg`, `exp_avg_sq` [K, ...] and `steps`
    (one count per member), as `state_of` returns it; fresh (zeros, step 0) where missing."""

    def __init__(self, params: dict[str, Tensor], lr_scale: dict[str, list[float]],
                 weight_decay: dict[str, list[float]], state: dict[str, dict] | None = None):
        self.params, self.lr_scale, self.weight_decay = params, lr_scale, weight_decay
        self.state = state or {}
        for name, p in params.items():
            if name not in self.state:
                self.state[name] = {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p),
                                    "steps": [0] * p.shape[0]}

    @torch.no_grad()
    def step(self, grads: dict[str, Tensor | None], lrs: list[float]) -> None:
        """One AdamW step with each member's learning rate `lrs[k]` (the schedule's, before its
        param group's lr_scale). A parameter without a gradient (unused by the forward) is left
        alone, state included, as torch's AdamW leaves it."""
        beta1, beta2 = BETAS
        cache: dict = {}
        for name, p in self.params.items():
            grad = grads.get(name)
            if grad is None:
                continue
            state = self.state[name]
            state["steps"] = steps = [s + 1 for s in state["steps"]]
            lr = [lrs[k] * scale for k, scale in enumerate(self.lr_scale[name])]
            decay = self.weight_decay[name]
            if any(w != 0 for w in decay):  # x * 1.0 is x, so a member without decay is unchanged
                p.mul_(per_member([1 - lr[k] * w for k, w in enumerate(decay)], p, cache))
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step_size = [lr[k] / (1 - beta1**s) for k, s in enumerate(steps)]
            bias_correction2_sqrt = [(1 - beta2**s) ** 0.5 for s in steps]
            denom = (exp_avg_sq.sqrt() / per_member(bias_correction2_sqrt, p, cache)).add_(EPS)
            # addcdiv_(exp_avg, denom, value=-step_size) computes self + value * t1 / t2, in that order
            p.add_(per_member([-s for s in step_size], p, cache) * exp_avg / denom)


@torch.no_grad()
def clip_per_member(grads: list[Tensor], max_norms: list[float | None]) -> None:
    """`clip_grad_norm_` for each member whose `max_norms[k]` is set: its gradients scaled by
    min(1, max_norm / (total norm + 1e-6)), the total norm being the 2-norm of the per-parameter
    norms of its slices. In place."""
    if not grads or all(m is None for m in max_norms):
        return
    k_members = grads[0].shape[0]
    if grads[0].device.type == "cpu":  # the lone run's norms exactly: one reduction per slice, as it does them
        totals = [torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g[k]) for g in grads]))
                  if max_norms[k] is not None else None for k in range(k_members)]
    else:
        norms = torch.stack([torch.linalg.vector_norm(g.reshape(k_members, -1), dim=1) for g in grads])
        totals = list(torch.linalg.vector_norm(norms, dim=0))
    one = torch.ones((), dtype=grads[0].dtype, device=grads[0].device)
    coef = torch.stack([torch.clamp(max_norm / (total + 1e-6), max=1.0) if max_norm is not None else one
                        for total, max_norm in zip(totals, max_norms)])
    for g in grads:
        g.mul_(coef.reshape(-1, *[1] * (g.dim() - 1)))


def state_of(optimizer: torch.optim.Optimizer, param: Tensor) -> tuple[Tensor, Tensor, int] | None:
    """A torch AdamW's moments and step count for `param`, or None before its first step."""
    entry = optimizer.state.get(param)
    if not entry:
        return None
    return entry["exp_avg"], entry["exp_avg_sq"], int(entry["step"].item())

