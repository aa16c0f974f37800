"""Do the head labels agree with exact patching on learned LEGO models? Before and after issue 41.

    python -m analyses.research.classifier_check RUN_DIR[@STEP] [RUN_DIR[@STEP] ...] [--n-pairs 64]

RUN_DIR@STEP reads the run's snapshot of that step (`models.snapshots`) instead of its last weights.
For each model, every head's *hop share* (`interp.tasks.lego_heads.hop_probe`: exact head patching
for flipping the element at chain depth d and reading #v, 1 <= d < v, the largest effect). A head
carrying >= CARRIES should get a label that names what it does; no head carrying < USED should be
shown as a *used* association, parent or manipulation head.

- before: the classifier of issue 28 (its six kinds, by role), labels alone: every hop label is
  shown as what the head does, used or not;
- after: with the depth and gathering kinds (`interp.attention`), and each label's status from
  its share (`interp.head_evidence`: used, used redundantly with a twin, or not used).

Prints, per model and over all: carriers (>= CARRIES) and how many have a hop label / any named
label, before and after; heads shown as used hop heads while carrying < USED, before and after;
twins found; heads labelled but not used.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

import torch

from interp.attention import HEAD_KINDS, HOP_KINDS, classify_heads, label_heads
from interp.head_evidence import CARRIES, USED, describe, head_evidence
from interp.tasks.lego_heads import hop_probe
from models.runs import LoadedRun, load_run, load_weights
from models.snapshots import read_index, read_snapshot
from tasks import seeded_generator

BEFORE_KINDS = ("association", "parent", "previous", "self", "broadcast", "manipulation")  # issue 28's kinds


@dataclass
class Counts:
    carriers: int = 0  # heads carrying >= CARRIES
    hop_before: int = 0  # of those, with a hop label before
    named_before: int = 0  # ... with any label but mixed, before
    hop_after: int = 0
    named_after: int = 0
    idle_used_before: int = 0  # hop label, carrying < USED: shown as used before (no status)
    idle_used_after: int = 0  # status "used" with a hop label while carrying < USED (0 by construction)
    twins: int = 0
    not_used: int = 0  # labelled, status "not used"

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def row(self, name: str) -> str:
        rate = lambda part: f"{part} ({part / self.carriers:.2f})" if self.carriers else str(part)  # noqa: E731
        return (f"| {name} | {self.carriers} | {rate(self.hop_before)} / {rate(self.named_before)} | "
                f"{rate(self.hop_after)} / {rate(self.named_after)} | {self.idle_used_before} / "
                f"{self.idle_used_after} | {self.twins} | {self.not_used} |")


def load(spec: str) -> LoadedRun:
    """A run folder, or RUN@STEP: that run with its snapshot of STEP loaded."""
    folder, _, step = spec.partition("@")
    run = load_run(folder)
    if step:
        entry = next((e for e in read_index(folder) if e.step == int(step)), None)
        if entry is None:
            raise SystemExit(f"{folder} has no snapshot of step {step}")
        load_weights(run.model, read_snapshot(folder, entry), f"{folder} snapshot {step}")
    return run


def check(spec: str, n_pairs: int) -> Counts:
    run = load(spec)
    tokens = run.task.sample(512, seeded_generator(0), split="test").tokens
    heads = classify_heads(run.model, run.task, tokens)
    before = label_heads(heads.scores[[HEAD_KINDS.index(k) for k in BEFORE_KINDS]], heads.thresholds, BEFORE_KINDS)
    probe = hop_probe(run, 0, n_pairs)
    evidence = head_evidence(run.model, heads, probe, task=run.task)
    shares = torch.tensor(evidence.shares)
    counts = Counts()
    print(f"== {spec} ({run.config.heads_origin})")
    for layer, row in enumerate(heads.labels):
        for head, label in enumerate(row):
            share, status = float(shares[layer, head]), evidence.status[layer][head]
            old = before[layer][head]
            carrier = share >= CARRIES
            counts.carriers += carrier
            counts.hop_before += carrier and old in HOP_KINDS
            counts.named_before += carrier and old != "mixed"
            counts.hop_after += carrier and label in HOP_KINDS
            counts.named_after += carrier and label != "mixed"
            counts.idle_used_before += share < USED and old in HOP_KINDS
            counts.idle_used_after += share < USED and label in HOP_KINDS and status == "used"
            counts.twins += status == "twin"
            counts.not_used += status == "not used"
            if carrier or label != "mixed" or old != "mixed":
                where = evidence.reads[layer][head] if evidence.reads else None
                said = describe(label, status, share, evidence.partner[layer][head], evidence.joint[layer][head], where)
                print(f"  L{layer}H{head}  before {old:<12}  after {said}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LEGO run folders (e.g. zoo/lego-three-hops), or "
                                                "RUN@STEP for a snapshot")
    parser.add_argument("--n-pairs", type=int, default=64, help="clean/corrupted pairs per (depth, "
                                                                "variable) (default 64)")
    args = parser.parse_args(argv)
    rows = [(spec, check(spec, args.n_pairs)) for spec in args.runs]
    print("\n| model | carriers | hop / named label, before | hop / named label, after | idle shown as used, "
          "before / after | twins | labelled, not used |\n|---|---|---|---|---|---|---|")
    for spec, counts in rows:
        print(counts.row(spec))
    print(sum((c for _, c in rows), Counts()).row(f"**all {len(rows)}**"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
