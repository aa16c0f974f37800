"""Attention-pattern scores and head labels.

For every (layer, head), over a batch, how much attention goes to each kind of target relative
to uniform attention over the same keys:

    score = mean over queries of (mass on targets - uniform mass on targets) / (1 - uniform mass)

so 0 is what uniform attention gives and 1 puts all mass on the targets. The kinds:
  association   from a symbol (LEGO: variable) to the *other* positions holding the same token
  parent        from any position of a segment that reads a symbol (one that is not the first
                symbol of its segment; LEGO: a clause's right-hand variable) to every position of
                the segment where that symbol is defined, i.e. is the first symbol (LEGO: a
                clause to its parent clause, the lookup of a whole clause, not only its token)
  previous      to the position just before the query
  self          to the query's own position
  broadcast     to BOS/EOS-like positions (position 0 for tasks without them)
  manipulation  to the other positions of the query's own clause (the task's segments)
  depth         to the whole segment at one fixed depth of the task's order, from every position
                outside it (LEGO: the clause of chain depth k, e.g. "#2's clause"), for tasks with
                the optional `segment_depth(tokens)`; elsewhere 0. Its depth is kept (`HeadScores.where`)
  gathering     to one role's position in *every* segment (LEGO: every clause's group element, or
                every clause's right-hand variable): the mass on those positions relative to
                uniform, times their coverage (the fraction of them that get at least half of an
                even share of that mass), so a head that reads one clause (association, parent)
                scores low. Keys holding the query's own token are not targets: same-token
                attention (every `=` reading every `=`) is association's. Its role, the key role
                scored highest, is kept (`HeadScores.where`). Only where roles recur (see below);
                elsewhere 0.

For the three kinds of a hop (HOP_KINDS: association, parent, manipulation), queries are
grouped by their *role*, their offset inside their segment (LEGO: left-hand
variable, `=`, element, right-hand variable, `;`), and a kind's score is that of the role where
it is highest. A learned head often does one thing from one role only (a clause's right-hand
variable looks up its parent, the other four tokens look elsewhere), and averaging over roles
hides it. Scored from the right-hand variable alone, association is direction-aware: there its
only target is the parent's left-hand variable. On the zoo's learned LEGO models this raises the
share of heads carrying a hop (by exact patching) that get a hop label from 9 of 40 to 26 of 40
(analyses/lab/workbench-circuits.md, "The classifier against patching"). A role is scored where it has at least
MIN_ROLE_QUERIES counted queries; where none has, the kind is averaged over all its queries. Roles
are used only where they recur, every role in at least two segments of a sequence on average (LEGO's
clauses); a task whose one segment is the whole sequence (a sum `a + b =`) has one position per
role, and is scored over all queries.

A head's label is, among the kinds whose score reaches their threshold and is within NEAR_BEST of
the best such score, the first in HEAD_KINDS order (the narrower kinds first: a previous-token
head inside a clause scores 1 on manipulation too, from the roles whose previous token is in the
clause); else "mixed". The thresholds are calibrated on planted heads (`calibrate_thresholds`);
parent on planted association heads, which look up the parent from the right-hand variable.

Shape glossary: layer, batch, head_index, query_pos, key_pos, kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from tasks import Task

HEAD_KINDS = ("association", "parent", "previous", "self", "broadcast", "manipulation", "depth", "gathering")
HOP_KINDS = ("association", "parent", "manipulation")  # the steps of a LEGO hop: find the parent, combine
MIN_ROLE_QUERIES = 16
NEAR_BEST = 0.05
CALIBRATED_ON = {"parent": "association"}  # the planted kind whose heads set the threshold
# Measured by `calibrate_thresholds([LegoTask(LegoConfig(n_vars=6, n_supervised=3)),
# LegoTask(LegoConfig(n_vars=12, group="s3", n_supervised=3))])` over 3 seeds x 2 layouts, scored by
# role where the kind is a hop kind: the midpoint between the highest score of any randomly
# initialised head (association 0.007, parent 0.008, previous 0.008, self 0.008, broadcast 0.039,
# manipulation 0.038) and the lowest score of a planted head of that kind (0.484, 0.407, 1.0, 1.0,
# 0.968, 0.771; a planted association head splits its mass between the other occurrence and
# itself, hence 0.48). Depth and gathering (issue 41): random 0.031 and 0.170; hand-set patterns
# (`depth_pattern`, `gathering_pattern`) 1.0 and 1.0.
# tests/unit/test_attention.py re-checks.
DEFAULT_THRESHOLDS = {"association": 0.25, "parent": 0.21, "previous": 0.5, "self": 0.5, "broadcast": 0.5,
                      "manipulation": 0.4, "depth": 0.52, "gathering": 0.58}


@torch.no_grad()
def attention_patterns(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "layer batch head_index query_pos key_pos"]:
    """Every layer's attention pattern (`blocks.{l}.attn.hook_pattern`) on these tokens."""
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    return torch.stack([cache[name] for name in names])


def allowed_keys(tokens: Int[Tensor, "batch pos"], task: Task) -> Bool[Tensor, "batch query_pos key_pos"]:
    """Keys a query can attend to: real tokens, and for causal tasks none after the query."""
    n_pos = tokens.shape[1]
    allowed = (~task.padding_mask(tokens)).unsqueeze(1).expand(-1, n_pos, -1)
    if task.causal:
        allowed = allowed & torch.ones(n_pos, n_pos, dtype=torch.bool, device=tokens.device).tril()
    return allowed


def segment_offsets(tokens: Int[Tensor, "batch pos"], task: Task) -> Int[Tensor, "batch pos"]:
    """Each position's offset inside its segment (0 for the segment's first position)."""
    segments = task.segment_ids(tokens)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(segments)
    return positions - torch.cummax(torch.where(starts, positions, 0), dim=1).values


def segment_roles(tokens: Int[Tensor, "batch pos"], task: Task) -> Int[Tensor, "batch pos"]:
    """The roles queries are grouped by: their segment offsets where every offset recurs (at
    least two positions per sequence hold it, on average), else all 0, where the segments are no
    repeated structure whose roles could be compared (e.g. one segment over the whole sequence)."""
    offsets = segment_offsets(tokens, task)
    recurs = torch.bincount(offsets[~task.padding_mask(tokens)]).min() >= 2 * tokens.shape[0]
    return offsets if recurs else torch.zeros_like(offsets)


def parent_targets(tokens: Int[Tensor, "batch pos"], task: Task) -> Bool[Tensor, "batch query_pos key_pos"]:
    """From every position of a segment that holds a reader (a symbol that is not the first of
    its segment and whose token is the first symbol of another segment) to that other segment."""
    segments, symbols = task.segment_ids(tokens), task.symbol_mask(tokens)
    first = segment_offsets(tokens, task) == 0
    real = ~task.padding_mask(tokens)
    same_token = tokens.unsqueeze(2) == tokens.unsqueeze(1)
    same_segment = segments.unsqueeze(2) == segments.unsqueeze(1)
    lookup = same_token & ~same_segment & (symbols & ~first).unsqueeze(2) & (symbols & first).unsqueeze(1)
    none = torch.iinfo(segments.dtype).min
    read = torch.where(lookup, segments.unsqueeze(1), none).amax(-1)  # [batch query]: the segment it reads
    read_by_segment = torch.where(same_segment, read.unsqueeze(1), none).amax(-1)
    parent = (segments.unsqueeze(1) == read_by_segment.unsqueeze(2)) & (read_by_segment != none).unsqueeze(2)
    return parent & real.unsqueeze(1) & real.unsqueeze(2)


def target_masks(tokens: Int[Tensor, "batch pos"], task: Task) -> dict[str, tuple[Tensor, Tensor]]:
    """Per kind: (targets [batch query_pos key_pos], queries that count [batch query_pos]). A query
    counts when some allowed key is a target and some is not (else uniform attention is perfect)."""
    n_pos = tokens.shape[1]
    real = ~task.padding_mask(tokens)
    real_keys = allowed_keys(tokens, task)
    eye = torch.eye(n_pos, dtype=torch.bool, device=tokens.device).unsqueeze(0)
    same_token = (tokens.unsqueeze(2) == tokens.unsqueeze(1)) & ~eye & real_keys
    segments = task.segment_ids(tokens)
    same_clause = (segments.unsqueeze(2) == segments.unsqueeze(1)) & ~eye & real_keys
    broadcast = task.broadcast_mask(tokens).unsqueeze(1).expand(-1, n_pos, -1) & ~eye & real_keys
    previous = torch.diag_embed(torch.ones(n_pos - 1, dtype=torch.bool, device=tokens.device), offset=-1).unsqueeze(0)
    previous = previous.expand(tokens.shape[0], -1, -1) & real_keys
    masks = {
        "association": (same_token, real & task.symbol_mask(tokens)),
        "parent": (parent_targets(tokens, task) & ~eye & real_keys, real),
        "previous": (previous, real),
        "self": (eye.expand(tokens.shape[0], -1, -1) & real_keys, real),
        "broadcast": (broadcast, real),
        "manipulation": (same_clause, real),
    }
    partial = lambda targets: targets.any(-1) & (targets.sum(-1) < real_keys.sum(-1))  # noqa: E731
    return {kind: (targets, queries & partial(targets)) for kind, (targets, queries) in masks.items()}


def relative_mass(
    patterns: Float[Tensor, "layer batch head_index query_pos key_pos"],
    targets: Bool[Tensor, "batch query_pos key_pos"],
    queries: Bool[Tensor, "batch query_pos"],
    n_keys: Int[Tensor, "batch query_pos"],
) -> Float[Tensor, "layer head_index"]:
    """Mean over counted queries of (mass - uniform) / (1 - uniform) on the target keys."""
    mass = torch.einsum("lbhqk,bqk->lbhq", patterns, targets.to(patterns.dtype))
    uniform = targets.sum(-1) / n_keys.clamp(min=1)  # [batch, query_pos]
    relative = (mass - uniform[None, :, None]) / (1 - uniform[None, :, None]).clamp(min=1e-6)
    weight = queries.to(patterns.dtype)[None, :, None]
    return (relative * weight).sum((1, 3)) / weight.sum((1, 3)).clamp(min=1)


def best_role_mass(
    patterns: Float[Tensor, "layer batch head_index query_pos key_pos"],
    targets: Bool[Tensor, "batch query_pos key_pos"],
    queries: Bool[Tensor, "batch query_pos"],
    n_keys: Int[Tensor, "batch query_pos"],
    roles: Int[Tensor, "batch query_pos"],
) -> Float[Tensor, "layer head_index"]:
    """`relative_mass` over the queries of each role with at least MIN_ROLE_QUERIES of them, and
    per head the highest; with no such role, over all the queries (which the best role's score
    is never below, being their weighted mean)."""
    by_role = [relative_mass(patterns, targets, queries & (roles == role), n_keys)
               for role in roles[queries].unique().tolist() if (queries & (roles == role)).sum() >= MIN_ROLE_QUERIES]
    return torch.stack(by_role).amax(0) if by_role else relative_mass(patterns, targets, queries, n_keys)


@dataclass
class HeadScores:
    """Scores [kind, layer, head] and a label per head."""

    scores: Float[Tensor, "kind layer head_index"]
    labels: list[list[str]]
    thresholds: dict[str, float]
    kinds: tuple[str, ...] = HEAD_KINDS
    # per head, what a depth head reads (its depth) or a gathering head (the segment offset, its role); else None
    where: list[list[int | None]] | None = None

    def score(self, kind: str) -> Float[Tensor, "layer head_index"]:
        return self.scores[self.kinds.index(kind)]

    def heads_labelled(self, label: str) -> list[tuple[int, int]]:
        return [(layer, head) for layer, row in enumerate(self.labels) for head, lab in enumerate(row) if lab == label]

    def to_dict(self) -> dict[str, object]:
        return {"kinds": list(self.kinds), "scores": {k: self.score(k).round(decimals=4).tolist() for k in self.kinds},
                "labels": self.labels, "thresholds": self.thresholds, "where": self.where}


def score_heads(
    patterns: Float[Tensor, "layer batch head_index query_pos key_pos"], tokens: Int[Tensor, "batch pos"], task: Task,
    thresholds: dict[str, float] | None = None, by_role: bool = True,
) -> HeadScores:
    """Scores of every kind for every head, and labels, from patterns already computed.
    `by_role=False` averages over all queries instead of taking the best role."""
    thresholds = thresholds or DEFAULT_THRESHOLDS
    n_keys = allowed_keys(tokens, task).sum(-1)
    masks = target_masks(tokens, task)
    roles = segment_roles(tokens, task)
    gathering, gathered = gathering_scores(patterns, tokens, task)
    depth, depths = depth_scores(patterns, tokens, task)
    scores = torch.stack([gathering if kind == "gathering" else depth if kind == "depth"
                          else relative_mass(patterns, *masks[kind], n_keys) if not (by_role and kind in HOP_KINDS)
                          else best_role_mass(patterns, *masks[kind], n_keys, roles) for kind in HEAD_KINDS])
    labels = label_heads(scores, thresholds)
    read = {"gathering": gathered, "depth": depths}
    where = [[int(read[label][layer, head]) if label in read else None for head, label in enumerate(row)]
             for layer, row in enumerate(labels)]
    return HeadScores(scores, labels, dict(thresholds), where=where)


def depth_scores(
    patterns: Float[Tensor, "layer batch head_index query_pos key_pos"], tokens: Int[Tensor, "batch pos"], task: Task,
) -> tuple[Float[Tensor, "layer head_index"], Int[Tensor, "layer head_index"]]:
    """Per head, the depth score of its best (query role, depth k) and that k: the mean over the
    role's queries outside the depth-k segment of (mass on that segment - uniform) / (1 - uniform).
    Zeros for a task without `segment_depth`."""
    shape = patterns.shape[0], patterns.shape[2]
    if not hasattr(task, "segment_depth"):
        return torch.zeros(shape), torch.zeros(shape, dtype=torch.long)
    depth, roles = task.segment_depth(tokens), segment_roles(tokens, task)
    allowed = allowed_keys(tokens, task)
    n_keys = allowed.sum(-1).clamp(min=1)
    best, best_depth = torch.zeros(shape), torch.zeros(shape, dtype=torch.long)
    for k in depth[depth >= 0].unique().tolist():
        queries = (~task.padding_mask(tokens)) & (depth != k)
        targets = (depth == k).unsqueeze(1) & allowed & queries.unsqueeze(2)
        counted = queries & targets.any(-1)
        value = best_role_mass(patterns, targets, counted, n_keys, roles).cpu()
        better = value > best
        best, best_depth = torch.where(better, value, best), torch.where(better, k, best_depth)
    return best, best_depth


def depth_pattern(tokens: Int[Tensor, "batch pos"], task: Task, k: int) -> Float[Tensor, "batch query_pos key_pos"]:
    """A hand-set depth head: every query attends evenly to the segment at depth `k` (queries
    inside it to themselves), the ground truth `calibrate_thresholds` scores for this kind."""
    targets = (task.segment_depth(tokens) == k).unsqueeze(1) & allowed_keys(tokens, task)
    inside = (task.segment_depth(tokens) == k).unsqueeze(2)
    eye = torch.eye(tokens.shape[1], dtype=torch.bool, device=tokens.device)
    targets = torch.where(inside | ~targets.any(-1, keepdim=True), eye.expand_as(targets), targets)
    return targets.float() / targets.sum(-1, keepdim=True)


def gathering_scores(
    patterns: Float[Tensor, "layer batch head_index query_pos key_pos"], tokens: Int[Tensor, "batch pos"], task: Task,
) -> tuple[Float[Tensor, "layer head_index"], Int[Tensor, "layer head_index"]]:
    """Per head, the gathering score of its best (query role, key role) and that key role: the
    mean over the query role's queries of (mass on the key role's positions in every segment,
    but those holding the query's token, - uniform) / (1 - uniform), times the coverage of those
    positions (the fraction holding at least half of an even share of that mass). Zeros where roles
    do not recur."""
    shape = patterns.shape[0], patterns.shape[2]
    roles = segment_roles(tokens, task)
    in_segment = (~task.padding_mask(tokens)) & (task.segment_ids(tokens) >= 0)  # LEGO: not BOS/EOS/padding
    if not bool((roles[in_segment] > 0).any()):
        return torch.zeros(shape), torch.zeros(shape, dtype=torch.long)
    allowed = allowed_keys(tokens, task)
    same_token = tokens.unsqueeze(2) == tokens.unsqueeze(1)  # the query itself too: that is association's
    n_keys = allowed.sum(-1).clamp(min=1)
    best, best_role = torch.full(shape, -1.0), torch.zeros(shape, dtype=torch.long)
    for key_role in roles[in_segment].unique().tolist():
        targets = ((roles == key_role) & in_segment).unsqueeze(1) & allowed & ~same_token
        n_targets = targets.sum(-1)
        share = patterns * targets.unsqueeze(1)  # [layer batch head query key]
        mass = share.sum(-1)
        covered = (share >= 0.5 * mass.unsqueeze(-1) / n_targets.clamp(min=1)[:, None, :, None]) & targets.unsqueeze(1)
        coverage = covered.sum(-1) / n_targets.clamp(min=1)[:, None]
        uniform = (n_targets / n_keys)[:, None]
        score = (mass - uniform) / (1 - uniform).clamp(min=1e-6) * coverage
        counted = in_segment & (n_targets >= 2) & (n_targets < allowed.sum(-1))
        for query_role in roles[counted].unique().tolist():
            weight = (counted & (roles == query_role)).to(patterns.dtype)
            if weight.sum() < MIN_ROLE_QUERIES:
                continue
            value = (score * weight[:, None]).sum((1, 3)).cpu() / weight.sum().cpu()
            better = value > best
            best, best_role = torch.where(better, value, best), torch.where(better, key_role, best_role)
    return best.clamp(min=0.0) if bool((best > -1).any()) else torch.zeros(shape), best_role


def gathering_pattern(tokens: Int[Tensor, "batch pos"], task: Task,
                      role: int) -> Float[Tensor, "batch query_pos key_pos"]:
    """A hand-set gathering head: every query attends evenly to the positions of segment offset
    `role` in every segment (the ground truth `calibrate_thresholds` scores for this kind)."""
    in_segment = (~task.padding_mask(tokens)) & (task.segment_ids(tokens) >= 0)
    targets = ((segment_offsets(tokens, task) == role) & in_segment).unsqueeze(1) & allowed_keys(tokens, task)
    empty = ~targets.any(-1, keepdim=True)
    targets = targets | (empty & torch.eye(tokens.shape[1], dtype=torch.bool, device=tokens.device))
    return targets.float() / targets.sum(-1, keepdim=True)


def label_heads(scores: Float[Tensor, "kind layer head_index"], thresholds: dict[str, float],
                kinds: tuple[str, ...] = HEAD_KINDS) -> list[list[str]]:
    """Per head: among the kinds of `kinds` whose score reaches their threshold, the first (in
    `kinds` order) within NEAR_BEST of the best of them; "mixed" where none reaches."""
    scores = scores[[HEAD_KINDS.index(kind) for kind in kinds]]
    labels = []
    for layer in range(scores.shape[1]):
        row = []
        for head in range(scores.shape[2]):
            passing = {kind: float(scores[i, layer, head]) for i, kind in enumerate(kinds)
                       if scores[i, layer, head] >= thresholds[kind]}
            best = max(passing.values(), default=None)
            row.append(next((kind for kind, score in passing.items() if score >= best - NEAR_BEST), "mixed"))
        labels.append(row)
    return labels


def classify_heads(
    model: HookedTransformer, task: Task, tokens: Int[Tensor, "batch pos"], thresholds: dict[str, float] | None = None,
    by_role: bool = True,
) -> HeadScores:
    """Run the model on `tokens` and score and label every head."""
    device = next(model.parameters()).device
    return score_heads(attention_patterns(model, tokens.to(device)).cpu(), tokens, task, thresholds, by_role)


def calibrate_thresholds(tasks: list[Task], seeds: range = range(3),
                         n_samples: int = 128) -> dict[str, dict[str, float]]:
    """Measure, per kind, the highest score of any head of randomly initialised models and the
    lowest score of planted heads of that kind (gathering and depth: of hand-set `gathering_pattern`s
    and `depth_pattern`s, one per role and per depth 0-2); the threshold is the midpoint.

    Layouts: each kind planted in every layer of a 2-layer model, and in one head of a 3-layer one.
    """
    from models.config import ModelConfig
    from models.factory import build_model
    from models.planted import PLANTED_KINDS
    from tasks import seeded_generator

    random_max = dict.fromkeys(HEAD_KINDS, -1.0)
    planted_min = dict.fromkeys(HEAD_KINDS, 2.0)
    layouts = [(2, {f"*.{h}": kind for h, kind in enumerate(PLANTED_KINDS)}),
               (3, {f"{h % 3}.{h}": kind for h, kind in enumerate(PLANTED_KINDS)})]
    for task in tasks:
        for seed in seeds:
            tokens = task.sample(n_samples, seeded_generator(seed), split="test").tokens
            for n_layers, plan in layouts:
                cfg = ModelConfig(n_layers=n_layers, d_model=60, n_heads=len(PLANTED_KINDS) + 1, d_head=12)
                plain = score_heads(attention_patterns(build_model(cfg, task, seed=seed), tokens), tokens, task).scores
                for i, kind in enumerate(HEAD_KINDS):
                    random_max[kind] = max(random_max[kind], plain[i].max().item())
                planted_model = build_model(ModelConfig(**{**cfg.__dict__, "planted": plan}), task, seed=seed)
                scores = score_heads(attention_patterns(planted_model, tokens), tokens, task).scores
                for layer, heads in planted_model.planted_plan.items():
                    for head, planted in heads.items():
                        for kind in (k for k in HEAD_KINDS if CALIBRATED_ON.get(k, k) == planted):
                            planted_min[kind] = min(planted_min[kind],
                                                    scores[HEAD_KINDS.index(kind), layer, head].item())
            for k in range(3) if hasattr(task, "segment_depth") else []:  # hand-set depth heads
                scores = depth_scores(depth_pattern(tokens, task, k)[None, :, None], tokens, task)[0]
                planted_min["depth"] = min(planted_min["depth"], scores.item())
            roles = segment_roles(tokens, task)
            for role in roles[roles > 0].unique().tolist() if bool((roles > 0).any()) else []:  # hand-set gatherers
                pattern = gathering_pattern(tokens, task, role)[None, :, None]
                planted_min["gathering"] = min(planted_min["gathering"],
                                               gathering_scores(pattern, tokens, task)[0].item())
    return {kind: {"random_max": round(random_max[kind], 4), "planted_min": round(planted_min[kind], 4),
                   "threshold": round((random_max[kind] + planted_min[kind]) / 2, 2)} for kind in HEAD_KINDS}


def mass_on_keys(
    patterns: Float[Tensor, "layer batch head_index query_pos key_pos"],
    query_pos: Int[Tensor, " batch"],
    key_mask: Bool[Tensor, "batch key_pos"],
) -> tuple[Float[Tensor, "layer head_index"], float]:
    """Mean attention mass that the query at `query_pos` (one per sequence) puts on the keys in
    `key_mask`, per layer and head, with the uniform-attention baseline (the masked fraction of
    keys) to compare it with. E.g. how much a LEGO variable's token reads the group elements."""
    by_query = patterns.permute(1, 3, 0, 2, 4)  # batch query_pos layer head key_pos
    rows = by_query[torch.arange(patterns.shape[1], device=patterns.device), query_pos]  # batch layer head key_pos
    mass = (rows * key_mask[:, None, None, :].float()).sum(-1).mean(0)
    return mass, key_mask.float().mean().item()
