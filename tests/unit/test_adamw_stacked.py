"""StackedAdamW and clip_per_member do per member what torch's AdamW and clip_grad_norm_ do to one
model, bit for bit, given the same gradients (models/adamw_stacked.py)."""

from __future__ import annotations

import torch

from models.adamw_stacked import StackedAdamW, clip_per_member

# per member: lr, weight decay, clip (None: no clipping); lr 0 and decay 0 included
MEMBERS = [(1e-3, 0.01, 1.0), (3e-2, 0.0, None), (1e-4, 0.5, 0.01), (0.0, 0.1, 0.5)]
SHAPES = {"W": (5, 7), "b": (7,), "scalar": ()}


def test_stacked_adamw_and_clipping_equal_torch_per_member():
    gen = torch.Generator().manual_seed(0)
    lone = [{n: torch.randn(s, generator=gen).requires_grad_() for n, s in SHAPES.items()} for _ in MEMBERS]
    optimizers = [torch.optim.AdamW([{"params": [p["W"]], "weight_decay": wd}, {"params": [p["b"], p["scalar"]],
                                                                                "weight_decay": 0.0}], lr=lr)
                  for p, (lr, wd, _) in zip(lone, MEMBERS)]
    stacked = {n: torch.stack([p[n].detach() for p in lone]).requires_grad_() for n in SHAPES}
    adamw = StackedAdamW(stacked, {n: [1.0] * len(MEMBERS) for n in SHAPES},
                         {"W": [wd for _, wd, _ in MEMBERS], "b": [0.0] * len(MEMBERS), "scalar": [0.0] * len(MEMBERS)})
    for step in range(5):
        grads = {n: torch.randn(len(MEMBERS), *s, generator=gen) * 10 ** (step - 2) for n, s in SHAPES.items()}
        for k, (params, optimizer, (_, _, clip)) in enumerate(zip(lone, optimizers, MEMBERS)):
            for name, p in params.items():
                p.grad = grads[name][k].clone()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
            optimizer.step()
        clip_per_member(list(grads.values()), [clip for _, _, clip in MEMBERS])
        adamw.step(grads, [lr for lr, _, _ in MEMBERS])
        for k, params in enumerate(lone):
            for name, p in params.items():
                assert torch.equal(stacked[name][k], p.detach()), (step, k, name)
                assert torch.equal(adamw.state[name]["exp_avg"][k], optimizers[k].state[p]["exp_avg"]), (step, k, name)
