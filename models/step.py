"""One training step for K runs of one shape, trained together: the step function and the stack
of parameters and optimizer state it updates. K = 1 is a lone run.

Shapes: K members, B batch, T positions, L labels per sample, P trained parameters.

`train_step` is one function of tensors: the stacked parameters [K, ...], AdamW's moments, the
members' batches [K, B, ...] and their hyperparameters as device tensors in; the parameters and
moments updated in place, the members' losses [K] out. Forward, loss (masks as weights),
backward (`torch.func.grad_and_value`, vmapped over the members), per-member gradient clipping
and AdamW are tensor operations: no host sync and no Python loop over members, so
`torch.compile(fullgraph=True)` takes the whole step as one graph and on CUDA it is captured
and replayed as a CUDA graph.

The arithmetic is torch's own, operation for operation: `clip_grad_norm_`, then
`torch.optim.AdamW` (betas 0.9/0.999, eps 1e-8, decoupled weight decay, its single-tensor
algorithm). The per-member scalars (lr times bias corrections, decay factors) are computed on the
host in Python doubles as torch computes them and rounded to float32 once, so a lone CPU run's
weights equal those of `loss.backward(); clip_grad_norm_(); AdamW.step()` bit for bit. torch's
fused/foreach AdamW cannot serve here: its learning rate is one number per parameter tensor, and a
stacked tensor holds K members with K learning rates.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import no_type_check

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from models.factory import forward
from tasks import Batch

BETA1 = 0.9  # torch.optim.AdamW's default; beta2 and eps are settings (train.adam_beta2, train.adam_eps)
HYPER_ROWS = ("decay", "neg_step_size", "bias_correction2_sqrt", "update")  # hyper[row, p, k]


# @no_type_check on what torch.compile traces: the test suite's runtime type checker (jaxtyping's
# import hook) wraps every other function, and dynamo cannot trace its wrappers
class ForwardAtDepth(nn.Module):
    """`models.factory.forward` as a module, so that `functional_call` can run it with stacked
    parameters: logits of the first `depth` blocks (all of them when None)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @no_type_check
    def forward(self, tokens: Tensor, depth: int | None = None) -> Tensor:
        return inspect.unwrap(forward)(self.model, tokens, depth)


@no_type_check
def masked_cross_entropy(logits: Tensor, label_pos: Tensor, labels: Tensor, weights: Tensor,
                         softmax: str = "standard") -> Tensor:
    """Mean cross-entropy over the supervised labels (weights 1, the rest 0) of one member's
    batch: logits [B, T, V], label_pos / labels / weights [B, L]. The mask is a weight, not a
    boolean index, so the shapes never depend on the data."""
    picked = logits.gather(1, label_pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # B L V
    safe = torch.where(weights > 0, labels, torch.zeros_like(labels))  # unsupervised slots may hold -1
    ce = label_losses(picked.flatten(0, 1), safe.flatten(), softmax)
    w = weights.flatten()
    return (ce * w).sum() / w.sum()


@no_type_check
def label_losses(picked: Tensor, labels: Tensor, softmax: str = "standard") -> Tensor:
    """The cross-entropy of each label, in `picked`'s dtype: picked [N, V] logits, labels [N].
    softmax "stablemax" (train.softmax) normalises s(x) = x + 1 (x >= 0), 1 / (1 - x) (x < 0)
    in place of exp(x)."""
    if softmax == "standard":
        return F.cross_entropy(picked, labels, reduction="none")
    s = torch.where(picked >= 0, picked.clamp(min=0) + 1, 1 / (1 - picked.clamp(max=0)))
    return s.sum(-1).log() - s.gather(-1, labels.unsqueeze(-1)).squeeze(-1).log()


@dataclass(frozen=True)
class StepOptions:
    """What one compiled graph of the step is specialised on."""

    members: int
    depth: int | None  # stochastic depth's draw for this step (K = 1 only)
    masked: bool  # some (parameter, member) pairs are not updated this step
    bf16: bool
    device_type: str
    adam: tuple[float, float] = (0.999, 1e-8)  # AdamW's beta2 and eps
    loss: tuple[str, str] = ("float32", "standard")  # the training loss's dtype and softmax


@no_type_check
def train_step(module: ForwardAtDepth, params: dict[str, Tensor], constants: dict[str, Tensor],
               exp_avg: dict[str, Tensor], exp_avg_sq: dict[str, Tensor], loss_sum: Tensor,
               tokens: Tensor, label_pos: Tensor, labels: Tensor, weights: Tensor,
               hyper: Tensor, max_norm: Tensor, options: StepOptions) -> Tensor:
    """One step of K members; `params`, `exp_avg`, `exp_avg_sq` ([K, ...] each) and `loss_sum`
    [K] float64 are updated in place. hyper [4, P, K]: HYPER_ROWS per trained parameter (in
    `params` order) and member; max_norm [K]: each member's gradient clip (inf: none). Returns
    the members' losses [K]."""

    def member_loss(own: dict[str, Tensor], tokens, label_pos, labels, weights):
        with torch.autocast(options.device_type, dtype=torch.bfloat16, enabled=options.bf16):
            weights_ = {**{f"model.{n}": t for n, t in own.items()}, **constants}
            logits = functional_call(module, weights_, (tokens,), {"depth": options.depth})
        dtype, softmax = options.loss
        return masked_cross_entropy(logits.double() if dtype == "float64" else logits.float(), label_pos,
                                    labels, weights, softmax)

    step = grad_and_value(member_loss)
    if options.members == 1 and not torch.compiler.is_compiling():
        # eager, lone: plain autograd, as loss.backward() does it (torch.func's wrapped tensors
        # cost a tiny model's eager step about a third more); the same kernels, the same numbers
        own = {n: p[0].detach().requires_grad_() for n, p in params.items()}
        with torch.enable_grad():
            loss = member_loss(own, tokens[0], label_pos[0], labels[0], weights[0])
            found = torch.autograd.grad(loss, list(own.values()), allow_unused=True)  # None: a skipped block
        grads = {n: g if g is not None else torch.zeros_like(own[n]) for n, g in zip(own, found)}
        grads, losses = {n: g.unsqueeze(0) for n, g in grads.items()}, loss.detach().unsqueeze(0)
    elif options.members == 1:  # the lone run's kernels exactly (vmap would batch its matmuls)
        grads, loss = step({n: p[0] for n, p in params.items()}, tokens[0], label_pos[0], labels[0], weights[0])
        grads, losses = {n: g.unsqueeze(0) for n, g in grads.items()}, loss.unsqueeze(0)
    else:
        grads, losses = vmap(step)(params, tokens, label_pos, labels, weights)
    # in the parameters' own layout (torch.func may hand back a transposed one): the norms reduce in their order
    grads = {n: g.contiguous() for n, g in grads.items()}
    # a block stochastic depth skipped has no gradient in torch (not a zero one): left out of the norm
    skipped = options.depth is not None
    used = [g for n, g in grads.items() if not (skipped and _in_block_at_or_above(n, options.depth))]
    clip_per_member(used, max_norm)
    adamw(params, grads, exp_avg, exp_avg_sq, hyper, options.masked, *options.adam)
    loss_sum.add_(losses.detach().double())
    return losses.detach().float()


@no_type_check
def clip_per_member(grads: list[Tensor], max_norm: Tensor) -> None:
    """`torch.nn.utils.clip_grad_norm_` per member, in place: member k's gradients scaled by
    min(1, max_norm[k] / (its total norm + 1e-6)), the total norm being the 2-norm of the
    per-parameter norms of its slices; members with max_norm inf are left alone."""
    k_members = grads[0].shape[0]
    if k_members == 1:  # the lone run's reductions: each parameter's norm over its whole tensor
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g[0]) for g in grads])).unsqueeze(0)
    else:
        norms = torch.stack([torch.linalg.vector_norm(g.reshape(k_members, -1), dim=1) for g in grads])  # P K
        total = torch.linalg.vector_norm(norms, dim=0)
    # max_norm / (total + 1e-6) as torch writes it: a Python number over a tensor is reciprocal * number
    coef = torch.clamp(torch.reciprocal(total + 1e-6) * max_norm, max=1.0)
    coef = torch.where(torch.isinf(max_norm), torch.ones_like(coef), coef)
    for g in grads:
        g.mul_(coef.reshape(-1, *[1] * (g.dim() - 1)))


@no_type_check
def adamw(params: dict[str, Tensor], grads: dict[str, Tensor], exp_avg: dict[str, Tensor],
          exp_avg_sq: dict[str, Tensor], hyper: Tensor, masked: bool, beta2: float = 0.999, eps: float = 1e-8) -> None:
    """torch.optim.AdamW's single-tensor step for every member, in place. With `masked`, a
    (parameter, member) whose hyper `update` is 0 keeps its weights and moments, as torch's
    AdamW leaves a parameter that got no gradient."""
    beta1 = BETA1
    with torch.no_grad():
        for p_index, (name, p) in enumerate(params.items()):
            grad = grads[name]
            column = hyper[:, p_index].reshape(len(HYPER_ROWS), -1, *[1] * (p.dim() - 1))  # 4 K 1 ...
            decay, neg_step_size, bias_correction2_sqrt, update = column
            # eager: in place, the same arithmetic with fewer tensors made. Not where compiled: traced
            # in-place updates of the stacked inputs gave other weights than eager (up to 7e-4 in 4 steps)
            if not masked and not torch.compiler.is_compiling():
                p.mul_(decay)
                exp_avg[name].lerp_(grad, 1 - beta1)
                exp_avg_sq[name].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (exp_avg_sq[name].sqrt() / bias_correction2_sqrt).add_(eps)
                p.add_(neg_step_size * exp_avg[name] / denom)
                continue
            new_p = p * decay
            new_avg = torch.lerp(exp_avg[name], grad, 1 - beta1)
            new_avg_sq = torch.addcmul(exp_avg_sq[name] * beta2, grad, grad, value=1 - beta2)
            denom = (new_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            # torch's addcdiv_(exp_avg, denom, value=-step_size): self + (value * t1) / t2
            new_p = new_p + neg_step_size * new_avg / denom
            keep = update == 0
            new_p = torch.where(keep, p, new_p)
            new_avg = torch.where(keep, exp_avg[name], new_avg)
            new_avg_sq = torch.where(keep, exp_avg_sq[name], new_avg_sq)
            p.copy_(new_p)
            exp_avg[name].copy_(new_avg)
            exp_avg_sq[name].copy_(new_avg_sq)


def adamw_scalars(steps: Tensor, update: Tensor, lrs: list[float], lr_scale: Tensor,
                  weight_decay: Tensor, beta2: float = 0.999) -> Tensor:
    """HYPER_ROWS [4, P, K] float32 for one AdamW step: steps [P, K] (each pair's step count, this
    step's included), update [P, K] bool, lrs [K] (the schedule's), lr_scale and weight_decay
    [P, K] float64. Computed as torch's AdamW computes them, in doubles (the powers by Python,
    once per distinct step count), rounded to float32 once. Host arithmetic on small tensors."""
    beta1 = BETA1
    counts, where = torch.unique(steps, return_inverse=True)
    bias_correction1 = torch.tensor([1 - beta1 ** float(s) if s else 1.0 for s in counts.tolist()],
                                    dtype=torch.float64)[where]
    bias_correction2_sqrt = torch.tensor([(1 - beta2 ** float(s)) ** 0.5 if s else 1.0 for s in counts.tolist()],
                                         dtype=torch.float64)[where]
    lr = torch.tensor(lrs, dtype=torch.float64)[None, :] * lr_scale
    rows = [1 - lr * weight_decay, -(lr / bias_correction1), bias_correction2_sqrt, update.double()]
    return torch.stack(rows).float()


def stack_batches(batches: list[Batch]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The members' batches as the step's inputs: tokens [K, B, T], label_pos, labels, and the
    loss weights (float32, 1 where supervised) [K, B, L]."""
    return (torch.stack([b.tokens for b in batches]), torch.stack([b.label_pos for b in batches]),
            torch.stack([b.labels for b in batches]), torch.stack([b.loss_mask for b in batches]).float())


@dataclass
class Moments:
    """One run's AdamW state for one parameter: the moments and how many steps updated it."""

    exp_avg: Tensor
    exp_avg_sq: Tensor
    steps: int


@dataclass(frozen=True)
class Member:
    """What the stack needs of one run: its model (the weights start there and are copied back
    there), its AdamW state by parameter name (missing before a parameter's first update), each
    trained parameter's (lr scale, weight decay), and its gradient clip."""

    model: nn.Module
    moments: dict[str, Moments]
    groups: dict[str, tuple[float, float]]
    grad_clip: float | None


class Stack:
    """K runs of one shape as one stacked model: their parameters [K, ...] (member 0's module
    runs them through `functional_call`), AdamW's moments, per-member loss sums, and the step
    (eager, compiled, or compiled and replayed as a CUDA graph). A member that has finished is
    frozen: it stays in the stack, its weights and moments unchanged, so nothing recompiles."""

    def __init__(self, members: list[Member], *, compile: bool, precision: str, device: torch.device,
                 adam: tuple[float, float] = (0.999, 1e-8), loss: tuple[str, str] = ("float32", "standard")):
        self.members, self.device, self.compile = members, device, compile
        self.adam, self.loss = adam, loss  # shared by the members (models/ensemble.py)
        self.module = ForwardAtDepth(members[0].model)
        own = [dict(m.model.named_parameters()) for m in members]
        self.names = [n for n, p in own[0].items() if p.requires_grad]
        with torch.no_grad():
            self.params = {n: torch.stack([o[n].detach() for o in own]).contiguous() for n in self.names}
            self.constants = {f"model.{n}": p.detach() for n, p in own[0].items() if not p.requires_grad}
            self.exp_avg = {n: self._stacked_moment(n, "exp_avg") for n in self.names}
            self.exp_avg_sq = {n: self._stacked_moment(n, "exp_avg_sq") for n in self.names}
        # per (parameter, member), on the host: AdamW's step counts, lr scales and weight decays
        self.steps = torch.tensor([[m.moments[n].steps if n in m.moments else 0 for m in members]
                                   for n in self.names], dtype=torch.int64)
        self.lr_scale = torch.tensor([[m.groups[n][0] for m in members] for n in self.names], dtype=torch.float64)
        self.weight_decay = torch.tensor([[m.groups[n][1] for m in members] for n in self.names], dtype=torch.float64)
        self.live = [True] * len(members)
        self.loss_sum = torch.zeros(len(members), dtype=torch.float64, device=device)
        self.max_norm = torch.tensor([m.grad_clip if m.grad_clip is not None else float("inf") for m in members],
                                     dtype=torch.float32, device=device)
        self.precision = precision
        self.last: list[Batch] | None = None
        self.fn = self._compiled() if compile else train_step
        self.graphs: dict[StepOptions, tuple] = {}

    def _stacked_moment(self, name: str, which: str) -> Tensor:
        like = self.params[name][0]
        return torch.stack([getattr(m.moments[name], which).to(self.device) if name in m.moments
                            else torch.zeros_like(like) for m in self.members])

    @staticmethod
    def _compiled():
        """The whole step through torch.compile, as one graph. Dynamo's caches are cleared first:
        a graph compiled for one model could otherwise be reused for another of the same shapes
        whose own forward differs (a planted model ran a plain model's graph), so one process
        trains one compiled stack at a time."""
        torch._dynamo.reset()
        return torch.compile(train_step, fullgraph=True, dynamic=False)

    @property
    def size(self) -> int:
        return len(self.members)

    def freeze(self, k: int) -> None:
        """Member k has finished: from the next step on it is not updated."""
        self.live[k] = False

    def step(self, batches: list[Batch | None], lrs: list[float], depth: int | None = None) -> Tensor:
        """One step: member k trains on `batches[k]` at learning rate `lrs[k]` (the schedule's,
        before its parameters' lr scales); a frozen member's entries are ignored. Returns the
        losses [K] (a frozen member's is meaningless)."""
        # a frozen member runs on its last batch again; its results are discarded
        self.last = [b if b is not None else old for b, old in zip(batches, self.last or batches)]
        hyper, masked = self._hyper(lrs, depth)
        options = StepOptions(self.size, depth, masked, self.precision == "bf16", self.device.type, self.adam,
                              self.loss)
        inputs = stack_batches(self.last)  # the members' batches, sampled on the CPU
        if self.device.type == "cuda":  # pinned, so that the copies to the device below do not wait
            inputs = tuple(t.pin_memory() if t.device.type == "cpu" else t for t in inputs)
        if self.compile and self.device.type == "cuda":
            return self._replay(options, inputs, hyper)
        args = [t.to(self.device, non_blocking=True) for t in (*inputs, hyper)]
        return self._call(*args[:4], args[4], options)

    def _call(self, tokens: Tensor, label_pos: Tensor, labels: Tensor, weights: Tensor, hyper: Tensor,
              options: StepOptions) -> Tensor:
        """`self.fn` on the stack's state; where this torch's dynamo cannot trace the step (seen:
        torch 2.11 stops at torch.func.grad), the step runs eager from then on, with a warning."""
        args = (self.module, self.params, self.constants, self.exp_avg, self.exp_avg_sq, self.loss_sum,
                tokens, label_pos, labels, weights, hyper, self.max_norm, options)
        try:
            return self.fn(*args)
        except torch._dynamo.exc.Unsupported as err:
            if self.fn is train_step:
                raise
            warnings.warn(f"train.compile: torch {torch.__version__} cannot compile the training step as one graph "
                          f"({str(err).splitlines()[0]}); it runs eager", stacklevel=2)
            self.fn = train_step
            return self.fn(*args)

    def _hyper(self, lrs: list[float], depth: int | None) -> tuple[Tensor, bool]:
        """This step's `adamw_scalars` (pinned on CUDA, for a copy that does not wait), and
        whether any (parameter, member) is not updated: a frozen member, or a block stochastic
        depth skipped."""
        used = torch.tensor([depth is None or not _in_block_at_or_above(n, depth) for n in self.names])
        update = used[:, None] & torch.tensor(self.live)[None, :]  # P K
        self.steps += update
        rows = adamw_scalars(self.steps, update, lrs, self.lr_scale, self.weight_decay, self.adam[0])
        return (rows.pin_memory() if self.device.type == "cuda" else rows), not bool(update.all())

    def _replay(self, options: StepOptions, inputs: tuple[Tensor, ...], hyper: Tensor) -> Tensor:
        """The compiled step as a CUDA graph, one per `options`: the batch and the scalars are
        copied into the graph's static buffers, then the graph is replayed. Captured after two
        warm-up steps on a side stream (which compile it), whose updates are undone first."""
        if options not in self.graphs:
            self.graphs[options] = self._capture(options, inputs, hyper)
        graph, static, losses = self.graphs[options]
        for buffer, value in zip(static, (*inputs, hyper)):
            buffer.copy_(value, non_blocking=True)
        graph.replay()
        return losses

    def _capture(self, options: StepOptions, inputs: tuple[Tensor, ...], hyper: Tensor) -> tuple:
        static = [t.to(self.device) for t in (*inputs, hyper)]
        state = [*self.params.values(), *self.exp_avg.values(), *self.exp_avg_sq.values(), self.loss_sum]
        saved = [t.clone() for t in state]

        def run():
            return self._call(*static, options)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                run()
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():
            for t, value in zip(state, saved):
                t.copy_(value)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            losses = run()
        return graph, static, losses

    @torch.no_grad()
    def copy_out(self, k: int) -> float:
        """Member k's weights into its model and its AdamW state into its `moments`; returns the
        training loss summed since the last copy (and zeroes it in the stack)."""
        member = self.members[k]
        own = dict(member.model.named_parameters())
        for p_index, name in enumerate(self.names):
            own[name].copy_(self.params[name][k])
            steps = int(self.steps[p_index, k])
            if steps:
                member.moments[name] = Moments(self.exp_avg[name][k].clone(), self.exp_avg_sq[name][k].clone(), steps)
        drained = self.loss_sum[k].item()
        self.loss_sum[k] = 0.0
        return drained


@no_type_check
def _in_block_at_or_above(name: str, depth: int) -> bool:
    """Whether parameter `name` belongs to a block that a forward of `depth` blocks skips."""
    parts = name.split(".")
    return parts[0] == "blocks" and int(parts[1]) >= depth
