"""The composite task's analysis: the verdict (which solution: inferential, symmetric, mixed or
unlearned, from the held-out pair's answers on test keys; "unlearned" when seen-pair accuracy is
below 90%), with its evidence (attention from the last token to key and anchors and from the
anchors to the key, per layer; cosine similarity of last-token representations for equal
targets from different pairs; the circuit graph's route to the logits), the probe map of where
the key, the first composition and the answer are readable, the report's sections and curves
(its presets are in composite_presets.py). `CompositeAnalysis`, at the end of the file, is what
interp/tasks/__init__.py lists.

Shape glossary: layer = residual streams (interp.probes), site = positions read per sample,
quantity = composite targets, label = 1 (the last position).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import einops
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp import plots
from interp.attention import attention_patterns
from interp.circuit import Circuit, chains_to_logits
from interp.probes import ProbeSet, layer_names, probe_grid, rounded
from interp.report import figure_html, table_html
from interp.report_format import dict_table_html, evidence_html, is_series, rate, table_verdict_html
from interp.task_analysis import TaskAnalysis, named_chain, predictions, without_unset
from models.runs import LoadedRun
from models.shapes import ANY, Grid, Many, OrNone
from tasks import Batch, CompositeTask, seeded_generator
from tasks.base import uniform_choice

SEEN_ACCURACY_TO_COUNT = 0.9  # below it a composite cell counts as not learned (docs/papers.md, section 2)
COMPOSITE_SITES = ("key", "anchor1", "anchor2", "last")
# "intermediate" is g(x; a1) = x + shift(a1), the paper's order; "intermediate_a2" is g(x; a2), what the
# group's public code computes first (it applies the second anchor first: y = f(f(x, a2), a1))
COMPOSITE_QUANTITIES = ("key", "intermediate", "intermediate_a2", "target")


# ---------------------------------------------------------------------------------------------
# The verdict


@dataclass
class CompositeVerdict:
    verdict: str  # inferential | symmetric | mixed | unlearned
    seen_accuracy: float
    held_out_inferential: float
    held_out_symmetric: float
    held_out_other: float
    attention_flow: dict[str, list[float]] = field(default_factory=dict)  # per layer, head-averaged
    cosine_same_target: float | None = None
    cosine_different_target: float | None = None
    route: str | None = None  # the circuit graph's longest path to the logits (interp.analysis), where drawn
    # per key position (0 .. seq_len-3): the held-out rates of the inferential and symmetric answers
    # (None where no sequence had its key there); a solution can differ by where the pair sits
    held_out_by_key_position: dict[str, list[float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return without_unset(asdict(self), ("route",))


def composite_verdict(model: HookedTransformer, task: CompositeTask, n: int = 2000, seed: int = 0) -> CompositeVerdict:
    """The held-out answer rates on test keys, with the mechanism evidence."""
    gen = seeded_generator(seed)
    seen = task.sample(n, gen, split="test", pair_ids=_trained_pairs(task, n, gen))
    held = task.sample(n, gen, split="test", pair_ids=held_out_pairs(task, n, gen))
    seen_acc = (predictions(model, seen) == seen.labels).float().mean().item()
    pred = predictions(model, held)[:, 0]
    inf = (pred == held.latents["inferential"]).float().mean().item()
    sym = (pred == held.latents["symmetric"]).float().mean().item()
    same, different = last_token_similarity(model, task, seen, gen)
    return CompositeVerdict(
        verdict=classify_composite(seen_acc, inf, sym), seen_accuracy=round(seen_acc, 4),
        held_out_inferential=round(inf, 4), held_out_symmetric=round(sym, 4),
        held_out_other=round(max(0.0, 1 - inf - sym), 4),  # never -0.00 from rounding
        attention_flow=composite_attention_flow(model, held), cosine_same_target=round(same, 4),
        cosine_different_target=round(different, 4),
        held_out_by_key_position={name: _rate_by_key_position(pred, held, name, task.n_key_positions)
                                  for name in ("inferential", "symmetric")},
    )


def held_out_on_training_keys(model: HookedTransformer, task: CompositeTask, n: int = 2000, seed: int = 0
                              ) -> dict[str, Any]:
    """The held-out pair's answer rates with keys of the *training* split: the pair is unseen, the
    (key, position) combinations are not. The composite paper's public code reports this reading
    (its test-key reading is only logged); `composite_verdict` reads test keys, new pair and new
    keys at once."""
    gen = seeded_generator(seed + 1)
    held = task.sample(n, gen, split="train", pair_ids=held_out_pairs(task, n, gen))
    pred = predictions(model, held)[:, 0]
    rates = {a: round((pred == held.latents[a]).float().mean().item(), 4) for a in ("inferential", "symmetric")}
    return {"train_keys_inferential": rates["inferential"], "train_keys_symmetric": rates["symmetric"],
            "train_keys_by_key_position": {a: _rate_by_key_position(pred, held, a, task.n_key_positions)
                                           for a in ("inferential", "symmetric")}}


def held_out_other_answers(model: HookedTransformer, task: CompositeTask, n: int = 2000, seed: int = 0,
                           top: int = 5) -> list[dict[str, Any]]:
    """What a model answers on the held-out pair when it gives neither solution: its `top` most
    common answers other than x-10 and x-6, as offsets from the key, each with its share of `n`
    fresh test-key sequences and the trained pairs whose target is that offset (e.g. (4,4)'s
    x-16, a model that reads one anchor twice)."""
    gen = seeded_generator(seed + 2)
    held = task.sample(n, gen, split="test", pair_ids=held_out_pairs(task, n, gen))
    return other_answers(predictions(model, held)[:, 0], held, task, top)


def other_answers(pred: Int[Tensor, " batch"], held: Batch, task: CompositeTask, top: int = 5) -> list[dict[str, Any]]:
    """`held_out_other_answers` on given predictions of held-out rows."""
    neither = (pred != held.latents["inferential"]) & (pred != held.latents["symmetric"])
    offsets, counts = torch.unique(pred[neither] - held.latents["key"][neither], return_counts=True)
    trained = ~task.is_held_out
    rows = []
    for i in counts.argsort(descending=True, stable=True)[:top].tolist():
        offset = int(offsets[i])
        pairs = [task.pair_name(p) for p in ((task.trained_shift == offset) & trained).nonzero()[:, 0].tolist()]
        rows.append({"offset": offset, "share": round(int(counts[i]) / len(pred), 4), "target_of": pairs})
    return rows


def _rate_by_key_position(pred: Int[Tensor, " batch"], held: Batch, answer: str,
                          n_positions: int) -> list[float | None]:
    """Per key position, the share of `pred` equal to the `answer` latent (None: no sequence there)."""
    positions = held.latents["key_pos"]
    rates = []
    for p in range(n_positions):
        here = positions == p
        rates.append(round((pred[here] == held.latents[answer][here]).float().mean().item(), 4) if here.any() else None)
    return rates


def classify_composite(seen_accuracy: float, inferential: float, symmetric: float) -> str:
    if seen_accuracy < SEEN_ACCURACY_TO_COUNT:
        return "unlearned"
    if inferential > 0.5:
        return "inferential"
    if symmetric > 0.5:
        return "symmetric"
    return "mixed"


def _trained_pairs(task: CompositeTask, n: int, gen: torch.Generator) -> Tensor:
    ids = (~task.is_held_out).nonzero()[:, 0]
    return ids[torch.randint(len(ids), (n,), generator=gen)]


def held_out_pairs(task: CompositeTask, n: int, gen: torch.Generator) -> Tensor:
    ids = task.is_held_out.nonzero()[:, 0]
    if len(ids) == 0:
        raise ValueError("the task has no held-out pair; set task.held_out")
    return ids[torch.randint(len(ids), (n,), generator=gen)]


@torch.no_grad()
def composite_attention_flow(model: HookedTransformer, batch: Batch) -> dict[str, list[float]]:
    """Per layer, head-averaged attention: last token -> key, anchor 1, anchor 2; anchor 1 and
    anchor 2 -> key."""
    device = next(model.parameters()).device
    patterns = attention_patterns(model, batch.tokens.to(device)).mean(2).cpu()  # [layer, batch, q, k]
    key = batch.latents["key_pos"]
    rows, last = torch.arange(len(batch)), batch.tokens.shape[1] - 1
    read = lambda q, k: patterns[:, rows, q, k].mean(-1).round(decimals=4).tolist()  # noqa: E731
    return {
        "last->key": read(last, key), "last->anchor1": read(last, key + 1), "last->anchor2": read(last, key + 2),
        "anchor1->key": read(key + 1, key), "anchor2->key": read(key + 2, key),
    }


@torch.no_grad()
def last_token_similarity(model: HookedTransformer, task: CompositeTask, batch: Batch,
                          gen: torch.Generator) -> tuple[float, float]:
    """Mean cosine similarity of the final last-token residual between each input and a twin
    with another trained pair and a key chosen so that the target is the same; and, as a
    baseline, with a twin whose key gives a different target."""
    latents = dict(batch.latents)
    other = _other_trained_pair(task, latents["pair"], gen)
    same_key = latents["key"] + task.trained_shift[latents["pair"]] - task.trained_shift[other]
    in_range = (same_key >= task.cfg.value_min) & (same_key <= task.cfg.value_max)
    same_key = same_key.clamp(task.cfg.value_min, task.cfg.value_max)
    other_key = torch.where(same_key + 7 <= task.cfg.value_max, same_key + 7, same_key - 7)  # target moves by 7
    twin = task.build({**latents, "pair": other, "key": same_key})
    shifted = task.build({**latents, "pair": other, "key": other_key})
    base = _last_residual(model, batch.tokens)
    same = F.cosine_similarity(base, _last_residual(model, twin.tokens), dim=-1)[in_range].mean().item()
    different = F.cosine_similarity(base, _last_residual(model, shifted.tokens), dim=-1)[in_range].mean().item()
    return same, different


@torch.no_grad()
def anchor_order_sensitivity(model: HookedTransformer, task: CompositeTask, key_pos: int, n: int = 256,
                             seed: int = 0) -> dict[str, list[float | None]]:
    """Whether the anchors' order survives, layer by layer: on held-out pairs (test keys, the key
    at `key_pos`), the distance between each residual and its twin with the two anchors swapped,
    over the distance to a twin with another pair (a trained pair that is neither order of the
    same two anchors), per layer's resid_post at anchor 2 and the last token. 0: the twins are
    the same there (the anchors arrive without their order); about 1 or more: swapping the order
    moves the residual as far as changing the pair (None where changing the pair moves nothing).
    Where the pair ends the sequence, anchor 2 is the last token, and its own token changes under
    the swap, so the ratio there is large by construction."""
    gen = seeded_generator(seed)
    batch = task.sample(n, gen, split="test", pair_ids=held_out_pairs(task, n, gen), key_pos=key_pos)
    pairs, mirror = torch.tensor(task.pairs), task.mirror
    pair = batch.latents["pair"]
    if (mirror[pair] == pair).any():
        raise ValueError("a held-out pair with two equal anchors is its own mirror: swapping them changes nothing")
    same_set = (pairs.unsqueeze(0).sort(-1).values == pairs[pair].sort(-1).values.unsqueeze(1)).all(-1)
    other = _choose(~task.is_held_out.unsqueeze(0) & ~same_set, gen, "a trained pair of two other anchors")
    swapped = task.build({**batch.latents, "pair": mirror[pair]})
    changed = task.build({**batch.latents, "pair": other})
    names = [f"blocks.{layer}.hook_resid_post" for layer in range(model.cfg.n_layers)]
    device = next(model.parameters()).device
    caches = [model.run_with_cache(b.tokens.to(device), names_filter=lambda name: name in names)[1]
              for b in (batch, swapped, changed)]
    sites = {"anchor2": key_pos + 2, "last": task.cfg.seq_len - 1}
    out: dict[str, list[float | None]] = {}
    for site, pos in sites.items():
        ratios: list[float | None] = []
        for name in names:
            base, swap, change = (cache[name][:, pos].cpu() for cache in caches)
            moved = (base - change).norm(dim=-1).mean()  # 0 only if the site does not see the anchors at all
            ratios.append(round(((base - swap).norm(dim=-1).mean() / moved).item(), 3) if moved > 0 else None)
        out[site] = ratios
    return out


def _choose(allowed: Bool[Tensor, "batch n"], gen: torch.Generator, what: str) -> Int[Tensor, " batch"]:
    """`uniform_choice`, refusing rows with nothing to choose (it would silently give index 0)."""
    if not allowed.any(-1).all():
        raise ValueError(f"this task has no {what} for some rows")
    return uniform_choice(allowed, gen)


@torch.no_grad()
def pair_route_at_last(model: HookedTransformer, task: CompositeTask, key_pos: int, n: int = 256,
                       seed: int = 0) -> dict[str, list[float]]:
    """Whether the pair reaches the answer through the last token's own attention: on trained
    pairs (test keys, the key at `key_pos`), each layer's attention output at the last token is
    patched in from a twin with another trained pair of another shift (same key, same noise).
    Per layer, the share of answers that follow the twin's pair (key + its shift) and the share
    that keep the clean answer. A layer whose patch makes the answers follow the twin carries
    the pair to the last token there; where the pair ends the sequence, the last token is anchor
    2 itself and its attention reads anchor 1 and the key."""
    gen = seeded_generator(seed)
    batch = task.sample(n, gen, split="test", pair_ids=_trained_pairs(task, n, gen), key_pos=key_pos)
    pair, key = batch.latents["pair"], batch.latents["key"]
    shift = task.trained_shift
    other = _choose(~task.is_held_out.unsqueeze(0) & (shift.unsqueeze(0) != shift[pair].unsqueeze(1)), gen,
                    "trained pair of another shift")
    twin = task.build({**batch.latents, "pair": other})
    follow, keep = [], []
    for layer in range(model.cfg.n_layers):
        answer = last_attention_patched(model, batch, twin, layer)
        follow.append(round((answer == key + shift[other]).float().mean().item(), 3))
        keep.append(round((answer == key + shift[pair]).float().mean().item(), 3))
    return {"follows_twin": follow, "keeps_clean": keep}


@torch.no_grad()
def last_attention_patched(model: HookedTransformer, batch: Batch, donor: Batch, layer: int) -> Int[Tensor, " batch"]:
    """The model's answers on `batch` with `layer`'s attention output at the last position taken
    from the same rows of `donor` (same length)."""
    name, last = f"blocks.{layer}.hook_attn_out", batch.tokens.shape[1] - 1
    _, cache = model.run_with_cache(donor.tokens.to(next(model.parameters()).device), names_filter=name)

    def patch(value: Tensor, hook: Any) -> Tensor:
        value[:, last] = cache[name][:, last]
        return value

    with model.hooks(fwd_hooks=[(name, patch)]):
        return predictions(model, batch)[:, 0]


def _other_trained_pair(task: CompositeTask, pair: Tensor, gen: torch.Generator) -> Tensor:
    allowed = ~task.is_held_out.unsqueeze(0) & (torch.arange(len(task.pairs)).unsqueeze(0) != pair.unsqueeze(1))
    return uniform_choice(allowed, gen)


def _last_residual(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_model"]:
    device = next(model.parameters()).device
    name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    _, cache = model.run_with_cache(tokens.to(device), names_filter=name)
    return cache[name][:, -1].cpu()


# ---------------------------------------------------------------------------------------------
# Probes: where the key, the first composition and the answer are readable


@dataclass
class CompositeProbeMap:
    """Composite probe accuracy per (layer, site, quantity).

    sites: the key's position, the first and second anchor's positions, the last position.
    quantities: the key x, the intermediate g(x; a1) = x + shift(a1), and the target (label).
    chance: per quantity, 1 / the number of distinct values it takes in the probes' training set.
    """

    accuracy: Float[Tensor, "layer site quantity"]
    train_accuracy: Float[Tensor, "layer site quantity"]
    layer_names: list[str]
    site_names: list[str]
    quantity_names: list[str]
    chance: list[float]
    majority: list[float]  # per quantity, test accuracy of always answering the most frequent class
    n_train: int
    n_test: int
    split: str
    method: str
    seconds: float

    def to_dict(self) -> dict[str, object]:
        return {
            "accuracy": rounded(self.accuracy), "train_accuracy": rounded(self.train_accuracy),
            "layer_names": self.layer_names, "site_names": self.site_names, "quantity_names": self.quantity_names,
            "chance": [round(c, 5) for c in self.chance], "majority": [round(m, 4) for m in self.majority],
            "n_train": self.n_train, "n_test": self.n_test,
            "split": self.split, "method": self.method, "seconds": round(self.seconds, 3),
        }

    def at(self, site: str, quantity: str) -> Float[Tensor, " layer"]:
        """Accuracy across layers of one (site, quantity) probe, by name."""
        return self.accuracy[:, self.site_names.index(site), self.quantity_names.index(quantity)]


def composite_quantities(task: CompositeTask, batch: Batch) -> Int[Tensor, "batch quantity"]:
    """The key x, g(x; a1), g(x; a2) and the label, in the order of COMPOSITE_QUANTITIES."""
    shifts = torch.tensor(task.cfg.shifts)
    anchors = torch.tensor(task.pairs)[batch.latents["pair"]]
    key = batch.latents["key"]
    return torch.stack([key, key + shifts[anchors[:, 0] - 1], key + shifts[anchors[:, 1] - 1], batch.labels[:, 0]],
                       dim=-1)


def composite_probe_set(task: CompositeTask, batch: Batch) -> ProbeSet:
    key_pos = batch.latents["key_pos"]
    last = torch.full_like(key_pos, task.cfg.seq_len - 1)
    positions = torch.stack([key_pos, key_pos + 1, key_pos + 2, last], dim=-1)
    targets = einops.repeat(composite_quantities(task, batch), "batch quantity -> batch site quantity",
                            site=len(COMPOSITE_SITES))
    return ProbeSet(batch.tokens, positions, targets, torch.ones_like(positions, dtype=torch.bool))


def composite_probe_map(
    model: HookedTransformer, task: CompositeTask, n_train: int = 4000, n_test: int = 2000, seed: int = 0,
    split: str = "train", method: str = "lda",
) -> CompositeProbeMap:
    """Where the key, g(key; a1) and the target are linearly readable: at the key, at each anchor
    and at the last position, layer by layer. Classes are token values (~100), hence LDA.

    Probes are fitted on `n_train` sequences drawn with `seed` and scored on `n_test` fresh ones
    drawn with `seed + 1`, both from the task's `split` ("train": seen pairs and training keys).
    """
    start = time.perf_counter()
    train_batch = task.sample(n_train, seeded_generator(seed), split)
    train = composite_probe_set(task, train_batch)
    test = composite_probe_set(task, task.sample(n_test, seeded_generator(seed + 1), split))
    grid = probe_grid(model, train, test, task.d_vocab_out, method)
    chance = [1 / len(values.unique()) for values in composite_quantities(task, train_batch).T]
    return CompositeProbeMap(grid.accuracy, grid.train_accuracy, layer_names(model), list(COMPOSITE_SITES),
                             list(COMPOSITE_QUANTITIES), chance, grid.majority[0].tolist(), n_train, n_test, split,
                             method, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# workbench analyze and the report


def _attention_flow_html(flow: Any) -> str:
    if not is_series(flow):  # a hand-edited analysis.json: shown as it is
        return f"<p>attention_flow: {evidence_html(flow)}</p>"
    layers = [f"L{i}" for i in range(len(next(iter(flow.values()))))]
    return ("<p>attention_flow: mean attention from one position to another on the held-out pair, per layer, "
            "averaged over heads (the key, then anchor 1 and anchor 2 of the pair).</p>"
            + dict_table_html(flow, layers, "query -> key"))


def _key_position_html(rates: Any) -> str:
    if not is_series(rates):
        return f"<p>held_out_by_key_position: {evidence_html(rates)}</p>"
    names = {"inferential": "x-10 (inferential)", "symmetric": "x-6 (symmetric)"}
    fig = plots.rate_bars({names.get(k, k): v for k, v in rates.items()}, "key position", "share of answers",
                          "held-out pair: answers by key position")
    return figure_html(fig, "held_out_by_key_position: on the held-out pair (test keys), the share of answers that "
                            "are the inferential (x-10) and the symmetric (x-6) solution, per position of the key; "
                            "n/a where no test sequence had its key there.")


def composite_curves(metrics: list[dict[str, Any]]) -> plt.Figure:
    """Seen-pair accuracy and the held-out pair's inferential/symmetric rates over steps, and loss."""
    return plots.rates_and_loss(metrics, [("acc_seen", "seen pairs (test keys)"),
                                          ("held_out_inferential", "held-out: inferential"),
                                          ("held_out_symmetric", "held-out: symmetric")],
                                ylabel="rate", title="accuracy and held-out answers")


class CompositeAnalysis(TaskAnalysis):
    curves_caption = "Seen-pair accuracy on test keys, and the answers on the held-out pair."
    verdict_shape = {"verdict": ANY, "seen_accuracy": float, "held_out_inferential": float,
                     "held_out_symmetric": float, "held_out_other": float}
    probes_shape = {"site_names": Many(str), "quantity_names": Many(str), "layer_names": Many(str),
                    "accuracy": Many(Grid(OrNone(float)))}

    def findings(self, run: LoadedRun, seed: int) -> tuple[CompositeProbeMap, CompositeVerdict]:
        return composite_probe_map(run.model, run.task, seed=seed), composite_verdict(run.model, run.task, seed=seed)

    def headline(self, verdict: CompositeVerdict) -> str:
        return (f"{verdict.verdict} (held-out pair on test keys: x-10 inferential {verdict.held_out_inferential:.2f}, "
                f"x-6 symmetric {verdict.held_out_symmetric:.2f}, other {verdict.held_out_other:.2f}; seen pairs "
                f"{verdict.seen_accuracy:.2f}; fresh sequences)")

    def verdict_html(self, verdict: dict[str, Any]) -> str:
        """The verdict's table, with the attention flow as a table (per layer) and the held-out answers
        per key position as bars below it."""
        return table_verdict_html(verdict, {"attention_flow": _attention_flow_html,
                                            "held_out_by_key_position": _key_position_html})

    def probes_html(self, probes: dict[str, Any]) -> str:
        rows = []
        by_site = zip(*probes["accuracy"])  # per site, its row of quantities at every layer
        for site, layers in zip(probes["site_names"], by_site):
            for quantity, values in zip(probes["quantity_names"], zip(*layers)):
                rows.append([site, quantity, *map(rate, values)])
        header = ["site", "quantity", *probes["layer_names"]]
        return "<p>Linear probe accuracy per layer.</p>" + table_html(rows, header)

    def curves(self, run: LoadedRun) -> plt.Figure:
        return composite_curves(run.metrics)

    def circuit_findings(self, verdict: CompositeVerdict, circuit: Circuit, labels: dict[str, str],
                                    planted: set[str]) -> CompositeVerdict:
        """The route to the answer: the circuit's longest path to the logits."""
        chains = chains_to_logits(circuit.edges)
        route = named_chain(chains[0], labels, planted) if chains else "no circuit edge reaches the logits"
        return dataclasses.replace(verdict, route=route)

    def timeline_panels(self, verdict: dict[str, Any]) -> dict[str, dict[str, float]]:
        """The timeline's evidence: seen accuracy and the held-out pair's answers (x-10 inferential,
        x-6 symmetric, other), and each answer's rate per key position."""
        answers = {"seen accuracy": verdict["seen_accuracy"],
                   "held-out x-10 (inferential)": verdict["held_out_inferential"],
                   "held-out x-6 (symmetric)": verdict["held_out_symmetric"],
                   "held-out other": verdict["held_out_other"]}
        panels = {"held-out answers": answers}
        for answer, title in (("inferential", "x-10 by key position"), ("symmetric", "x-6 by key position")):
            rates = verdict.get("held_out_by_key_position", {}).get(answer, [])
            panels[title] = {f"key at {p}": r for p, r in enumerate(rates) if r is not None}
        return panels

    def summary(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """A run's verdict from its last evaluation (the evaluation batch's seen accuracy and held-out
        rates), by `classify_composite`; without held-out rates (an evaluation batch too small to hold
        the held-out pair) only "unlearned" can be told, else "-". None without seen accuracy."""
        if "acc_seen" not in record:
            return None
        rates = {"seen": record["acc_seen"]}
        if "held_out_inferential" in record and "held_out_symmetric" in record:
            rates |= {"x-10": record["held_out_inferential"], "x-6": record["held_out_symmetric"]}
            return {"label": classify_composite(*rates.values()), "rates": rates}
        return {"label": "unlearned" if rates["seen"] < SEEN_ACCURACY_TO_COUNT else "-", "rates": rates}

    def verdict_rates(self, verdict: dict[str, Any]) -> dict[str, float]:
        """The rates that decide a composite verdict: seen-pair accuracy, held-out x-10 and x-6."""
        return {"seen": verdict["seen_accuracy"], "x-10": verdict["held_out_inferential"],
                "x-6": verdict["held_out_symmetric"]}

    def metric_words(self) -> dict[str, str]:
        return {"acc_seen": "seen pairs answered right (fraction)",
                "held_out_inferential": "held-out pair answered x-10, inferential (fraction)",
                "held_out_symmetric": "held-out pair answered x-6, symmetric (fraction)",
                "held_out_other": "held-out pair, any other answer (fraction)",
                "acc_per_pair": "accuracy per anchor pair (fraction)"}
