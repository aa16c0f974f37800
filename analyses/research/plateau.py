"""`python -m analyses.research.plateau RUN_DIR [RUN_DIR ...]`: the hop's attention and gradient pull in a
LEGO run (interp/tasks/lego.py), on uniform test sentences and on biased (mixed-input) ones, side by
side. Prints, per variable that needs a hop and kind of data, the head with the largest pull and
the head that puts the most attention on the parent clause.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch

from interp.probes import residual_similarity
from interp.task_analysis import predictions
from interp.tasks.lego_plateau import hop_pull, parent_element_split
from models.runs import load_run
from tasks import LegoTask, seeded_generator


def biased_twin(task: LegoTask, identity_prob: float) -> LegoTask:
    """The same task whose training split draws every sentence with biased elements."""
    return LegoTask(dataclasses.replace(task.cfg, min_vars=None, biased_fraction=1.0, identity_prob=identity_prob))


def describe(run_dir: str, n: int, identity_prob: float, seed: int = 0) -> list[str]:
    run = load_run(run_dir)
    if not isinstance(run.task, LegoTask):
        raise SystemExit(f"{run_dir} is not a LEGO run")
    data = {"uniform": run.task.sample(n, seeded_generator(seed), split="test"),
            f"biased {identity_prob}": biased_twin(run.task, identity_prob).sample(n, seeded_generator(seed))}
    collapse = residual_similarity(run.model, data["uniform"].tokens[:256])
    lines = [f"{run_dir}:", "  mean cosine between positions, embedding then each block: "
             + " ".join(f"{c:.2f}" for c in collapse.tolist())]
    answers = predictions(run.model, data["uniform"])
    splits = [parent_element_split(data["uniform"], answers, k) for k in range(2, run.task.cfg.n_vars)]
    lines.append("  accuracy where the parent clause applies the identity / elsewhere (signal = sum - 1; 0: zero-hop "
                 "rule or guessing, 1: the hop): " + ", ".join(
                     f"#{s.variable} {s.identity:.2f} / {s.other:.2f} ({s.signal:+.2f})" for s in splits))
    if run.task.cfg.forest_fraction > 0:
        lines += forest_accuracy(run, n=4000, seed=seed)
    if run.task.cfg.mention_labels != "none":
        lines += mention_accuracy(run, n=2000, seed=seed)
    for variable in range(2, run.task.cfg.n_vars):
        cells = []
        for name, batch in data.items():
            pull = hop_pull(run.model, run.task, batch, variable)
            site, layer, head, value = pull.strongest()
            att = float(pull.attention[("lhs", "rhs").index(site), layer, head])
            most = pull.most_attentive()
            cells.append(f"{name}: loss {pull.loss:.3f}, max pull {value:+.4f} at L{layer}H{head} {site} "
                         f"(attention {att:.3f}); most attention on the parent {most[3]:.3f} at L{most[1]}H{most[2]} "
                         f"{most[0]} (uniform {pull.uniform:.3f})")
        lines.append(f"  #{variable}  " + "; ".join(cells))
    return lines


def mention_accuracy(run, n: int, seed: int) -> list[str]:
    """Accuracy of the mention labels (`task.mention_labels`) on training-split sentences, per
    mentioned variable: what the right-hand token of #k+1's clause says about #k."""
    batch = run.task.sample(n, seeded_generator(seed + 11))
    n_vars = run.task.cfg.n_vars
    correct = (predictions(run.model, batch) == batch.labels) & batch.label_mask
    shown = [f"#{k} {correct[:, n_vars + k].sum() / batch.label_mask[:, n_vars + k].sum():.3f}"
             for k in range(n_vars) if batch.loss_mask[:, n_vars + k].any()]
    return [f"  mention labels ({run.task.cfg.mention_labels}) of the supervised variables, accuracy: "
            + ", ".join(shown)]


def forest_accuracy(run, n: int, seed: int) -> list[str]:
    """Accuracy on forest sentences of the supervised variables, by hops from the value their
    sub-chain starts at, apart for sentences with one value and with several. With several, a
    variable one hop from a value needs the hop, or guesses among the sentence's values."""
    task = LegoTask(dataclasses.replace(run.task.cfg, min_vars=None, forest_fraction=1.0))
    batch = task.sample(n, seeded_generator(seed + 7))
    correct = predictions(run.model, batch) == batch.labels
    hops = torch.zeros_like(batch.labels)
    for i in range(1, task.cfg.n_vars):
        hops[:, i] = torch.where(batch.latents["cuts"][:, i], 0, hops[:, i - 1] + 1)
    several = ((batch.tokens >= task.first_value).sum(1, keepdim=True) > 1).expand_as(hops)
    lines = ["  forest sentences (supervised variables), accuracy by hops from a value:"]
    for h in range(task.cfg.n_vars):
        for multi, name in ((False, "one value"), (True, "several values")):
            mask = (hops == h) & (several == multi) & batch.loss_mask
            if mask.sum() >= 50:
                lines.append(f"    {h} hops, {name}: {correct[mask].float().mean():.3f} (n = {int(mask.sum())})")
    return lines


def hop_breakdown(run, n: int, seed: int = 5, variable: int = 2) -> list[str]:
    """Where a partial hop succeeds: #`variable`'s accuracy on test sentences whose parent clause
    does not apply the identity (there the zero-hop rule is always wrong, so any success is the
    hop), by the parent's clause slot, the variable's slot, their distance, and the parent's
    letter. Flat rows mean a graded read of the parent, not a positional or letter shortcut."""
    from tasks.lego import CLAUSE_LEN, VARIABLES

    batch = run.task.sample(n, seeded_generator(seed), split="test")
    right = (predictions(run.model, batch) == batch.labels)[:, variable].float()
    away = batch.latents["elements"][:, variable - 1] != 0
    slot = (batch.label_pos - batch.label_pos.min()) // CLAUSE_LEN
    features = {"parent's slot": slot[:, variable - 1], "own slot": slot[:, variable],
                "parent slot - own slot": slot[:, variable - 1] - slot[:, variable],
                "parent's letter": batch.latents["variables"][:, variable - 1]}
    lines = [f"  #{variable} where the parent does not apply the identity ({int(away.sum())} sentences; "
             f"accuracy {right[away].mean():.2f}), by:"]
    for name, feature in features.items():
        cells = []
        for value in sorted(set(feature[away].tolist())):
            mask = away & (feature == value)
            label = VARIABLES[value] if name == "parent's letter" else f"{value:+d}" if "-" in name else str(value)
            cells.append(f"{label}: {right[mask].mean():.2f}")
        lines.append(f"    {name}: " + ", ".join(cells))
    head_line, best = _letter_head(run, batch, right, away, variable)
    return [*lines, head_line, _letter_patching(run, variable, best, seed)]


def _letter_patching(run, variable: int, letter: int, seed: int, n: int = 128) -> str:
    """Exact head patching where the hop for `letter` works: aligned test sentences whose
    parent is that letter, the parent's group element flipped, the logit difference read at
    #`variable` (1 = the head's clean output restores the clean answer)."""
    from interp.patching import logit_diff_metric, patch_head_out
    from tasks.lego import VARIABLES

    gen = seeded_generator(seed + 1)
    clean = run.task.sample(20 * n, gen, split="test", aligned=True)
    rows = (clean.latents["variables"][:, variable - 1] == letter).nonzero()[:, 0][:n]
    clean = clean.select(rows)
    corrupted, _ = run.task.corrupt(clean, gen, depth=variable - 1)
    effects = patch_head_out(run.model, clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, variable))
    ranked = sorted(((float(v), layer, head) for (layer, head), v in np.ndenumerate(effects.values.numpy())),
                    key=lambda item: -abs(item[0]))[:3]
    return (f"    exact head patching on {len(rows)} sentences whose parent is {VARIABLES[letter]}, the "
            f"parent's element flipped, metric at #{variable}: "
            + ", ".join(f"L{layer}H{head} {v:+.2f}" for v, layer, head in ranked))


def _letter_head(run, batch, right, away, variable: int) -> tuple[str, int]:
    """The head whose attention from #`variable`'s left-hand token onto its parent's clause
    (the four tokens `p = g x`) differs most between the parent letter the model answers best
    and the other letters: where a letter-specific hop would look."""
    from interp.attention import attention_patterns
    from tasks.lego import VARIABLES

    letters = batch.latents["variables"][:, variable - 1]
    best = max(sorted(set(letters[away].tolist())), key=lambda v: right[away & (letters == v)].mean().item())
    rows, parent = torch.arange(len(batch)), batch.label_pos[:, variable - 1]
    patterns = torch.cat([attention_patterns(run.model, batch.tokens[i: i + 500]) for i in range(0, len(batch), 500)],
                         1)
    query = batch.label_pos[:, variable]
    # indices split by a slice put the batch first: [batch layer head]
    mass = sum(patterns[:, rows, :, query, parent + offset] for offset in range(4))
    on_best, others = mass[letters == best].mean(0), mass[letters != best].mean(0)
    layer, head = divmod(int((on_best - others).abs().argmax()), mass.shape[2])
    return (f"    attention from #{variable}'s left-hand token onto the parent's clause, parent {VARIABLES[best]} "
            f"(best answered) vs the other letters, largest difference: L{layer}H{head} {on_best[layer, head]:.2f} vs "
            f"{others[layer, head]:.2f}"), best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--n", type=int, default=512, help="sentences per batch")
    parser.add_argument("--identity-prob", type=float, default=0.9)
    parser.add_argument("--breakdown", action="store_true",
                        help="also #2's accuracy where the parent negates, by slot, distance and "
                             "letter (6,000 sentences)")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    for run_dir in args.runs:
        print("\n".join(describe(run_dir, args.n, args.identity_prob)))
        if args.breakdown:
            print("\n".join(hop_breakdown(load_run(run_dir), 6000)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
