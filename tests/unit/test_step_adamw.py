"""The step's AdamW and clipping (models/step.py) do per member what torch's AdamW and
clip_grad_norm_ do to one model, given the same gradients: bit for bit for a member without
clipping, within float rounding with it (a member's norm is one row of a batched reduction)."""

from __future__ import annotations

import torch

from models.step import adamw, adamw_scalars, clip_per_member

# per member: lr, weight decay, clip (None: no clipping); lr 0 and decay 0 included
MEMBERS = [(1e-3, 0.01, 1.0), (3e-2, 0.0, None), (1e-4, 0.5, 0.01), (0.0, 0.1, 0.5)]
SHAPES = {"W": (5, 7), "b": (7,), "scalar": ()}


def test_the_steps_adamw_and_clipping_equal_torch_per_member():
    gen = torch.Generator().manual_seed(0)
    k_members = len(MEMBERS)
    lone = [{n: torch.randn(s, generator=gen).requires_grad_() for n, s in SHAPES.items()} for _ in MEMBERS]
    optimizers = [torch.optim.AdamW([{"params": [p["W"]], "weight_decay": wd}, {"params": [p["b"], p["scalar"]],
                                                                                "weight_decay": 0.0}], lr=lr)
                  for p, (lr, wd, _) in zip(lone, MEMBERS)]
    stacked = {n: torch.stack([p[n].detach() for p in lone]) for n in SHAPES}
    exp_avg = {n: torch.zeros_like(p) for n, p in stacked.items()}
    exp_avg_sq = {n: torch.zeros_like(p) for n, p in stacked.items()}
    decay = torch.tensor([[wd for _, wd, _ in MEMBERS], [0.0] * k_members, [0.0] * k_members], dtype=torch.float64)
    max_norm = torch.tensor([c if c is not None else float("inf") for _, _, c in MEMBERS])
    steps = torch.zeros(len(SHAPES), k_members, dtype=torch.int64)
    update = torch.ones_like(steps, dtype=torch.bool)
    for step in range(5):
        grads = {n: torch.randn(k_members, *s, generator=gen) * 10 ** (step - 2) for n, s in SHAPES.items()}
        for k, (params, optimizer, (_, _, clip)) in enumerate(zip(lone, optimizers, MEMBERS)):
            for name, p in params.items():
                p.grad = grads[name][k].clone()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
            optimizer.step()
        clip_per_member(list(grads.values()), max_norm)
        steps += 1
        hyper = adamw_scalars(steps, update, [lr for lr, _, _ in MEMBERS], torch.ones_like(decay), decay)
        adamw(stacked, grads, exp_avg, exp_avg_sq, hyper, masked=False)
        for k, params in enumerate(lone):
            for name, p in params.items():
                theirs, avg = p.detach(), optimizers[k].state[p]["exp_avg"]
                if MEMBERS[k][2] is None:
                    assert torch.equal(stacked[name][k], theirs) and torch.equal(exp_avg[name][k], avg), (step, k, name)
                else:
                    assert torch.allclose(stacked[name][k], theirs, rtol=0, atol=1e-6), (step, k, name)


def test_a_masked_pair_keeps_its_weights_and_moments():
    params = {"W": torch.ones(2, 3)}
    grads = {"W": torch.full((2, 3), 0.5)}
    exp_avg, exp_avg_sq = {"W": torch.zeros(2, 3)}, {"W": torch.zeros(2, 3)}
    update = torch.tensor([[True, False]])
    hyper = adamw_scalars(update.long(), update, [1e-2, 1e-2], torch.ones(1, 2, dtype=torch.float64),
                          torch.full((1, 2), 0.1, dtype=torch.float64))
    adamw(params, grads, exp_avg, exp_avg_sq, hyper, masked=True)
    assert torch.equal(params["W"][1], torch.ones(3)) and torch.equal(exp_avg["W"][1], torch.zeros(3))
    assert (params["W"][0] < 1).all() and (exp_avg["W"][0] > 0).all()
