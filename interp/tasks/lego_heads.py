"""What a LEGO head's label is checked against: its share of a *hop*.

A hop is the step from one variable to the next along the chain. Flipping the group element at
chain depth d (1 <= d < v) changes variable #v only through the hops from d to v; exact patching
of a head's output on such pairs, read at #v, says how much of that change passes through the
head. The probe holds one pair set per supervised (d, v); a head's share is its largest effect
over them (`interp.head_evidence`). The root clause's flip (d = 0), which the patching section
uses, is left out: it also reaches #v through reading the root value, which is not a hop.
"""

from __future__ import annotations

from interp.head_evidence import PairSet, ShareProbe
from interp.patching import logit_diff_metric
from interp.task_analysis import default_share_probe
from models.runs import LoadedRun
from tasks import seeded_generator


def hop_probe(run: LoadedRun, seed: int = 0, n_pairs: int = 64) -> ShareProbe:
    """One set of `n_pairs` aligned test sentences per (depth d, variable #v), 1 <= d < v <= the
    last supervised variable, each drawn from `seed + 1` (the same clean sentences for every
    set); ValueError where fewer than three variables are supervised (no hop to patch)."""
    supervised = [slot for slot, kept in enumerate(run.task.supervised_slots()) if kept]
    last = max(supervised)
    sets = [hop_pairs(run, depth, variable, n_pairs, seed + 1)
            for depth in range(1, last) for variable in range(depth + 1, last + 1)]
    if not sets:
        raise ValueError(f"{run.path} supervises fewer than three variables: no hop to patch")
    return ShareProbe(sets, f"group element at depth d flipped, metric at #v, for every 1 <= d < v <= {last}: "
                            f"the largest effect (a hop's share)")


def lego_share_probe(run: LoadedRun, seed: int = 0) -> ShareProbe:
    """The hop probe where the task supervises three variables or more; else the patching
    section's own pairs."""
    supervised = sum(run.task.supervised_slots())
    return hop_probe(run, seed) if supervised >= 3 else default_share_probe(run, seed)


def hop_pairs(run: LoadedRun, depth: int, variable: int, n_pairs: int, seed: int) -> PairSet:
    """`n_pairs` aligned test sentences drawn from `seed`, each beside its twin with the group
    element at chain depth `depth` flipped, and the logit difference at `variable`."""
    gen = seeded_generator(seed)
    clean = run.task.sample(n_pairs, gen, split="test", aligned=True)
    corrupted, _ = run.task.corrupt(clean, gen, depth=depth)
    return PairSet(clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, label_index=variable))


def hop_effects(run: LoadedRun, depth: int, variable: int, n_pairs: int = 64, seed: int = 1):
    """[layer, head]: exact head patching, normalised, on one set of `hop_probe` (`hop_pairs`), alone."""
    from interp.patching import patch_head_out

    pairs = hop_pairs(run, depth, variable, n_pairs, seed)
    return patch_head_out(run.model, pairs.clean, pairs.corrupted, pairs.metric).values
