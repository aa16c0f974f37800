"""Do the attention-pattern labels agree with causal evidence on learned LEGO models?

    python -m analyses.classifier_check RUN_DIR [RUN_DIR ...] [--n-pairs 64]

For each run, every head's *hop share*: exact head patching (`patch_head_out`, clean ->
corrupted, normalised so 1 = the whole clean-corrupted difference) for a change that reaches
variable #v only through hops: flip the group element at chain depth d (1 <= d < v) and read #v,
over every such pair of supervised variables; the share is the largest. A head that carries
>= CARRIES of a hop should get a hop label (association, parent or manipulation); a head with a hop
label should not carry < IDLE of every hop. The labels are compared before (the classifier of
14852a7: every query averaged, its five kinds and thresholds, the best-scoring kind if it passes)
and after (`classify_heads` as it is: scored by role, with parent).

Prints one line per head that matters and, per run and over all runs, recall (heads carrying
>= CARRIES that got a hop label) and the idle labelled heads (hop label, carrying < IDLE).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from torch import Tensor

from interp.attention import HEAD_KINDS, HOP_KINDS, classify_heads
from interp.patching import logit_diff_metric, patch_head_out
from models.runs import load_run
from tasks import seeded_generator

CARRIES, IDLE = 0.3, 0.05
# the classifier before roles and parent (14852a7): its kinds and calibrated thresholds
OLD_THRESHOLDS = {"association": 0.24, "manipulation": 0.39, "broadcast": 0.5, "previous": 0.5, "self": 0.5}


def hop_effects(run, depth: int, variable: int, n_pairs: int = 64, seed: int = 1) -> Tensor:
    """[layer, head]: exact head patching, normalised, for flipping the group element at chain
    depth `depth` and reading `variable` (aligned test sentences)."""
    gen = seeded_generator(seed)
    clean = run.task.sample(n_pairs, gen, split="test", aligned=True)
    corrupted, _ = run.task.corrupt(clean, gen, depth=depth)
    metric = logit_diff_metric(clean, corrupted, label_index=variable)
    return patch_head_out(run.model, clean.tokens, corrupted.tokens, metric).values


def hop_shares(run, n_pairs: int = 64, seed: int = 1) -> Tensor:
    """[layer, head]: the largest `hop_effects` over (depth d, variable #v),
    1 <= d < v <= the last supervised variable."""
    supervised = [slot for slot, kept in enumerate(run.task.supervised_slots()) if kept]
    last = max(supervised)
    effects = [hop_effects(run, depth, variable, n_pairs, seed)
               for depth in range(1, last) for variable in range(depth + 1, last + 1)]
    if not effects:
        raise ValueError(f"{run.path} supervises fewer than three variables: no hop to patch")
    return torch.stack(effects).amax(0)


@dataclass
class Agreement:
    carriers: int  # heads carrying >= CARRIES of a hop
    found: int  # of those, with a hop label
    labelled: int  # heads with a hop label
    idle: int  # of those, carrying < IDLE

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(*(a + b for a, b in zip(vars(self).values(), vars(other).values(), strict=True)))

    def __str__(self) -> str:
        recall = f"{self.found}/{self.carriers}" + (f" = {self.found / self.carriers:.2f}" if self.carriers else "")
        return f"recall {recall}, idle labelled heads {self.idle} of {self.labelled}"


def agreement(shares: Tensor, labels: list[list[str]]) -> Agreement:
    hop = torch.tensor([[label in HOP_KINDS for label in row] for row in labels])
    return Agreement(int((shares >= CARRIES).sum()), int(((shares >= CARRIES) & hop).sum()),
                     int(hop.sum()), int(((shares < IDLE) & hop).sum()))


def old_labels(scores: Tensor) -> list[list[str]]:
    """The labels of 14852a7's classifier from all-query scores: the best-scoring of its five
    kinds if that reaches the kind's threshold, else mixed."""
    kinds = list(OLD_THRESHOLDS)
    old = scores[[HEAD_KINDS.index(kind) for kind in kinds]]
    best = old.argmax(0)
    return [[kinds[k] if old[k, layer, head] >= OLD_THRESHOLDS[kinds[k]] else "mixed"
             for head, k in enumerate(row.tolist())] for layer, row in enumerate(best)]


def check_run(run_dir: str, n_pairs: int) -> tuple[Agreement, Agreement]:
    run = load_run(run_dir)
    tokens = run.task.sample(256, seeded_generator(0), split="test").tokens
    after = classify_heads(run.model, run.task, tokens)
    plain = classify_heads(run.model, run.task, tokens, by_role=False)
    before = old_labels(plain.scores)
    shares = hop_shares(run, n_pairs)
    print(f"== {run_dir} ({run.config.heads_origin}); heads carrying >= {CARRIES} or labelled for a hop:")
    for layer, row in enumerate(after.labels):
        for head, label in enumerate(row):
            share = float(shares[layer, head])
            if share >= CARRIES or label in HOP_KINDS or before[layer][head] in HOP_KINDS:
                scores = ", ".join(f"{kind} {float(after.score(kind)[layer, head]):.2f}" for kind in HOP_KINDS)
                print(f"  L{layer}H{head}  hop {share:.2f}  before {before[layer][head]:<12} after {label:<12} ({scores})")
    old, new = agreement(shares, before), agreement(shares, after.labels)
    print(f"  before: {old}\n  after:  {new}")
    return old, new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LEGO run folders (e.g. zoo/lego-three-hops)")
    parser.add_argument("--n-pairs", type=int, default=64, help="clean/corrupted pairs per depth (default 64)")
    args = parser.parse_args(argv)
    totals = [check_run(run_dir, args.n_pairs) for run_dir in args.runs]
    old, new = (sum(column[1:], column[0]) for column in zip(*totals, strict=True))
    print(f"== all {len(args.runs)} runs\n  before: {old}\n  after:  {new}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
