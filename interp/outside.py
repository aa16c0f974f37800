"""Your own model, your own prompts: the workbench's patching, path patching, circuit graph, head
scores and HTML report on any TransformerLens `HookedTransformer`, with clean/corrupted prompt
pairs you write yourself and no project Task (docs/outside-models.md walks through it).

    pairs = PromptPairs.from_lists(clean, corrupted, answers, wrong_answers, model=model)  # or .from_json(path)
    analysis = analyze_model(model, pairs)  # metric: logit(answer) - logit(wrong_answer) at the last token
    analysis.write_report("runs/mine/report.html")  # and analysis.to_dict() for JSON

From the command line (analyses/outside.py): `workbench analyze-model --model FILE.py:FUNCTION
--prompts PAIRS.json --out DIR`, FUNCTION() returning the model, the pairs file `from_json`'s.

The pairs and the metric, and how they are read and checked, are `interp.outside_prompts`'s
(`PromptPairs`, `scalar_metric`): a pair is a clean prompt, its corrupted twin of the same length
and the two answers, read at the last position.

Nothing here reimplements patching: it calls `interp.patching`, `interp.atp`, `interp.paths`,
`interp.circuit`, `interp.attention` and `interp.analysis_html`'s report sections, as `workbench
analyze` does on a project run. Path patching is refused, with the option named, for model
options it does not handle (`interp.paths.check_path_patchable`, the same check for every model;
the table of options is in docs/limits.md); the circuit then has no edges.

Head scores need no task: per head, the attention mass on each kind's targets relative to
uniform attention (`interp.attention.relative_mass`), as the project's classifier measures:
  previous   the position just before the query
  self       the query's own position
  first      position 0 (the BOS token where the model prepends one)
  duplicate  earlier (causal) or other positions holding the query's own token
  induction  causal models only: the token after an earlier occurrence of the query's token
A kind that no query of the prompts can show (no repeated token: no duplicate or induction
query) is NaN and None in `to_dict`. Thresholds: previous, self and first reuse the project's
calibrated ones (previous, self, broadcast); duplicate reuses association's (calibrated on LEGO's
planted heads); induction's is calibrated on the hand-set induction head
(`interp.toy_induction.calibrate_induction`).

Shape glossary: batch = prompt pairs, pos = token positions, layer, head_index, kind.
"""

from __future__ import annotations

import html
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp import plots
from interp.analysis import PatchingAnalysis
from interp.analysis_html import _circuit_html, _patching_html, _paths_html
from interp.atp import judge_estimates
from interp.attention import DEFAULT_THRESHOLDS, HeadScores, attention_patterns, relative_mass
from interp.circuit import find_circuit
from interp.outside_prompts import PromptPairs, _kind, check_metric
from interp.patching import Metric, patch_head_out, patch_residual
from interp.paths import check_path_patchable, path_patch
from interp.report import Report, figure_html, table_html
from interp.report_format import evidence_text
from models.runs import non_finite_weights

OUTSIDE_KINDS = ("previous", "self", "first", "duplicate", "induction")
OUTSIDE_THRESHOLDS = {"previous": DEFAULT_THRESHOLDS["previous"], "self": DEFAULT_THRESHOLDS["self"],
                      "first": DEFAULT_THRESHOLDS["broadcast"], "duplicate": DEFAULT_THRESHOLDS["association"],
                      "induction": 0.36}
# induction: measured by `interp.toy_induction.calibrate_induction()`, the midpoint between the
# highest score of a randomly initialised copy of hand_set_induction_model's architecture (0.002,
# 3 seeds) and its hand-set induction head (0.72); analyses/lab/workbench-circuits.md, "The classifier against patching"


# ---------------------------------------------------------------------------------------------
# Head scores without a task


def outside_target_masks(
    tokens: Int[Tensor, "batch pos"], causal: bool
) -> dict[str, tuple[Bool[Tensor, "batch pos pos"], Bool[Tensor, "batch pos"], Int[Tensor, "batch pos"]]]:
    """Per kind of OUTSIDE_KINDS: (targets [batch query key], the queries that count, how many
    keys each query can attend to). A query counts when some allowed key is a target and some is
    not. Induction needs a causal model (left out otherwise)."""
    n, n_pos = tokens.shape
    allowed = torch.ones(n_pos, n_pos, dtype=torch.bool, device=tokens.device)
    if causal:
        allowed = allowed.tril()
    allowed = allowed.unsqueeze(0).expand(n, -1, -1)
    eye = torch.eye(n_pos, dtype=torch.bool, device=tokens.device).unsqueeze(0)
    same = tokens.unsqueeze(2) == tokens.unsqueeze(1)  # [batch query key]
    previous = torch.diag_embed(torch.ones(n_pos - 1, dtype=torch.bool, device=tokens.device), offset=-1).unsqueeze(0)
    first = torch.zeros(1, n_pos, n_pos, dtype=torch.bool, device=tokens.device)
    first[:, 1:, 0] = True
    targets = {"previous": previous & allowed, "self": eye & allowed, "first": first & allowed,
               "duplicate": same & ~eye & allowed}
    if causal:  # key k follows an earlier occurrence of the query's token: tokens[k - 1] == tokens[q], k < q
        after = torch.zeros_like(same)
        after[:, :, 1:] = same[:, :, :-1]
        targets["induction"] = after & ~eye & allowed
    n_keys = allowed.sum(-1)
    return {kind: (t.expand(n, -1, -1), t.any(-1) & (t.sum(-1) < n_keys), n_keys) for kind, t in targets.items()}


def outside_head_scores(
    patterns: Float[Tensor, "layer batch head_index query_pos key_pos"], tokens: Int[Tensor, "batch pos"], causal: bool,
    thresholds: dict[str, float] | None = None,
) -> HeadScores:
    """Scores of OUTSIDE_KINDS for every head (NaN where no query of `tokens` can show the kind),
    and labels: the best-scoring kind that reaches its threshold, else "mixed"."""
    thresholds = {**OUTSIDE_THRESHOLDS, **(thresholds or {})}
    masks = outside_target_masks(tokens, causal)
    n_layers, _, n_heads = patterns.shape[:3]
    scores = torch.full((len(OUTSIDE_KINDS), n_layers, n_heads), float("nan"))
    for i, kind in enumerate(OUTSIDE_KINDS):
        if kind in masks and masks[kind][1].any():
            targets, queries, n_keys = masks[kind]
            scores[i] = relative_mass(patterns.float(), targets, queries, n_keys).cpu()
    labels = []
    for layer in range(n_layers):
        row = []
        for head in range(n_heads):
            found = [(scores[i, layer, head].item(), kind) for i, kind in enumerate(OUTSIDE_KINDS)
                     if math.isfinite(scores[i, layer, head].item())
                     and scores[i, layer, head].item() >= thresholds[kind]]
            row.append(max(found)[1] if found else "mixed")
        labels.append(row)
    return HeadScores(scores, labels, thresholds, OUTSIDE_KINDS)


def _scores_dict(heads: HeadScores) -> dict[str, Any]:
    """`HeadScores.to_dict` with NaN (a kind these prompts cannot show) as None, valid JSON."""
    clean = lambda t: [[None if v != v else round(v, 4) for v in row] for row in t.tolist()]  # noqa: E731
    return {"kinds": list(heads.kinds), "scores": {k: clean(heads.score(k)) for k in heads.kinds},
            "labels": heads.labels, "thresholds": heads.thresholds}


# ---------------------------------------------------------------------------------------------
# The analysis


@dataclass
class OutsideAnalysis:
    """`analyze_model`'s findings: head scores, and patching in the form `workbench analyze`
    writes (`interp.analysis.PatchingAnalysis`: exact residual and head sweeps, attribution
    estimates judged against exact, path patching or why it was refused, the circuit)."""

    model: dict[str, Any]  # the configuration options that matter here (`model_summary`)
    pairs: PromptPairs
    prompts: list[dict[str, Any]]  # per pair: clean and corrupted token names, answer and wrong answer names
    metric: str
    heads: HeadScores
    patching: PatchingAnalysis
    patterns: Float[Tensor, "layer head_index query_pos key_pos"]  # on the first clean prompt, for the report
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """Plain values for `json.dumps` (NaN as None)."""
        pairs = [{**named, "clean_ids": clean, "corrupted_ids": corrupted, "answer_id": int(a),
                  "wrong_answer_id": int(w)}
                 for named, clean, corrupted, a, w in zip(self.prompts, self.pairs.clean.tolist(),
                                                          self.pairs.corrupted.tolist(), self.pairs.answers,
                                                          self.pairs.wrong_answers)]
        return {"model": self.model, "pairs": pairs, "metric": self.metric, "heads": _scores_dict(self.heads),
                "patching": _nan_to_none(self.patching.to_dict()), "seconds": self.seconds}

    def write_json(self, path: str | Path) -> Path:
        """`to_dict()` as a JSON file (the analysis.json of this analysis)."""
        from models.runs import atomic_write_bytes, non_finite_note
        from models.safe_files import finite_json

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data, places = finite_json(self.to_dict())  # strict JSON: NaN and infinity as null, and said so
        if places:
            data["non_finite"] = non_finite_note(places, [])
        atomic_write_bytes(path, json.dumps(data, indent=1, allow_nan=False).encode())
        return path

    def report(self, title: str = "Your model, your prompts") -> Report:
        """The HTML report: prompts, every head's attention (circuitsvis, offline), head scores,
        exact and attribution patching, path patching, the circuit graph."""
        report = Report(title)
        # NaN stays NaN here (to_dict writes it as None, for JSON): the sections print it as "nan", as they
        # print a run's analysis.json read back
        written = {**self.to_dict(), "patching": self.patching.to_dict()}
        join = "" if self.model.get("tokenizer") else " "
        rows = [[i, join.join(p["clean"]), join.join(p["corrupted"]), p["answer"], p["wrong_answer"]]
                for i, p in enumerate(self.prompts[:20])]
        report.add("Model and prompts", f"<p>{html.escape(_model_line(self.model))}. Metric: "
                                        f"{html.escape(self.metric)}. "
                   f"{len(self.pairs)} pairs (the first {len(rows)} below); analysed in {self.seconds:.1f} s.</p>"
                   + table_html(rows, ["pair", "clean", "corrupted", "answer", "wrong answer"]))
        n_layers, n_heads = self.patterns.shape[:2]
        names = [f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)]
        report.add("Attention", "<p>Every head on the first clean prompt (hover a head to zoom in).</p>"
                   + report.attention_widget(self.prompts[0]["clean"], self.patterns.flatten(0, 1), names,
                                             self.model["causal"]))
        heads = written["heads"]
        unseen = [kind for kind, rows_ in heads["scores"].items() if all(v is None for row in rows_ for v in row)]
        note = f" Not measurable on these prompts (no query can show it): {', '.join(unseen)}." if unseen else ""
        report.add("Head scores", f"<p>Attention mass on each kind's targets relative to uniform attention (0 = "
                   f"uniform, 1 = all of it), on the clean and corrupted prompts.{html.escape(note)} Thresholds: "
                   f"{html.escape(evidence_text(heads['thresholds'], 2))} (induction's calibrated on a hand-set "
                   "induction head).</p>"
                   + figure_html(self.head_score_figure(), "Score per kind; * marks each head's label.")
                   + table_html([[f"L{i}", *row] for i, row in enumerate(heads["labels"])],
                                ["layer", *[f"H{h}" for h in range(n_heads)]]))
        patching = written["patching"]
        report.add("Activation patching", _patching_html(patching))
        report.add("Path patching", _paths_html(patching["paths"], heads["labels"]))
        report.add("Circuit", _circuit_html(patching["paths"]["circuit"], heads["labels"]))
        return report

    def head_score_figure(self) -> Any:
        """One heatmap per kind (layer x head), * on each head's label; blank where a kind is NaN."""
        return plots.head_score_heatmaps({k: self.heads.score(k).tolist() for k in self.heads.kinds}, self.heads.labels)

    def write_report(self, path: str | Path, title: str = "Your model, your prompts") -> Path:
        """Write the report (one self-contained HTML file: no CDN, no server) and return its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return self.report(title).write(path)


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value


def _model_line(cfg: dict[str, Any]) -> str:
    parts = [f"{cfg['n_layers']} layers x {cfg['n_heads']} heads, d_model {cfg['d_model']}",
             "causal" if cfg["causal"] else "bidirectional", "attention only" if cfg["attn_only"] else "with MLPs",
             f"normalization {cfg['normalization_type']}"]
    bad = non_finite_clause(cfg)
    return ", ".join(parts) + (f". Its {bad}" if bad else "")


def non_finite_clause(cfg: dict[str, Any]) -> str:
    """Where the model's weights hold NaN or infinity, "weights hold NaN or infinity (...): every
    number measured on it is undefined", naming the tensors; else ""."""
    bad = cfg.get("non_finite_weights") or []
    return (f"weights hold NaN or infinity ({len(bad)} tensors: {', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}): every number measured on it is undefined" if bad else "")


def model_summary(model: HookedTransformer) -> dict[str, Any]:
    cfg = model.cfg
    return {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "d_model": cfg.d_model, "d_head": cfg.d_head,
            "d_vocab": cfg.d_vocab, "d_vocab_out": cfg.d_vocab_out, "n_ctx": cfg.n_ctx,
            "causal": cfg.attention_dir == "causal", "attn_only": bool(cfg.attn_only),
            "normalization_type": cfg.normalization_type, "positional_embedding_type": cfg.positional_embedding_type,
            "model_name": getattr(cfg, "model_name", None), "tokenizer": getattr(model, "tokenizer", None) is not None,
            "non_finite_weights": non_finite_weights(model)}


def analyze_model(
    model: HookedTransformer, pairs: PromptPairs, metric: Metric | None = None, *, ig_steps: int = 4,
    circuit_target: float = 0.9, score_tokens: Int[Tensor, "batch pos"] | None = None,
) -> OutsideAnalysis:
    """Everything `workbench analyze` does for a project run that needs no task, on any
    HookedTransformer and your prompt pairs:

    - exact patching of the residual stream (layer x position) and of each head's output,
      clean -> corrupted (`patch_residual`, `patch_head_out`);
    - attribution estimates per head (plain, GradDrop, `ig_steps`-step integrated gradients)
      judged against exact (`interp.atp.judge_estimates`);
    - path patching (`interp.paths.path_patch`) unless the model's options are refused
      (`interp.paths.check_path_patchable`; the reason is kept);
    - the circuit graph (`interp.circuit.find_circuit`, target `circuit_target`);
    - head scores (`outside_head_scores`) on the clean and corrupted prompts, or `score_tokens`.

    `metric`: per pair, logits [batch pos d_vocab_out] -> [batch]; None: logit(answer) -
    logit(wrong_answer) at the last position. A TransformerLens-style metric returning one number
    goes through `scalar_metric(fn)`. The model runs where its parameters are."""
    started = time.perf_counter()
    if not isinstance(model, HookedTransformer):
        raise ValueError(f"analyze_model needs a transformer_lens HookedTransformer, not {type(model).__name__}")
    if not isinstance(pairs, PromptPairs):
        raise ValueError(f"analyze_model needs PromptPairs (PromptPairs.from_lists or .from_json), not {_kind(pairs)}")
    pairs.check(model)
    if metric is None:
        metric, metric_name = pairs.logit_diff(), "logit(answer) - logit(wrong answer) at the last position"
    else:
        check_metric(model, pairs, metric)
        metric_name = getattr(metric, "__name__", type(metric).__name__)
    device = next(model.parameters()).device
    clean, corrupted = pairs.clean.to(device), pairs.corrupted.to(device)
    args = (model, clean, corrupted, metric)
    heads = patch_head_out(*args)
    residual = patch_residual(*args)
    estimates = judge_estimates(*args, "head", heads, ig_steps=ig_steps)
    try:
        check_path_patchable(model)
        refused = None
    except ValueError as err:
        refused = str(err)
    paths = None if refused else path_patch(*args)
    circuit = find_circuit(*args, heads.values, paths, target=circuit_target)
    causal = model.cfg.attention_dir == "causal"
    scored = torch.cat([clean, corrupted]) if score_tokens is None else score_tokens.to(device)
    head_scores = outside_head_scores(attention_patterns(model, scored).cpu(), scored.cpu(), causal)
    names = model if getattr(model, "tokenizer", None) is not None else None
    prompts = [{"clean": pairs.token_strings(c, names), "corrupted": pairs.token_strings(k, names),
                "answer": pairs.token_strings([a], names)[0], "wrong_answer": pairs.token_strings([w], names)[0]}
               for c, k, a, w in zip(pairs.clean, pairs.corrupted, pairs.answers.tolist(),
                                     pairs.wrong_answers.tolist())]
    description = f"{len(pairs)} pairs of your prompts; metric: {metric_name}"
    patching = PatchingAnalysis(description, len(pairs), prompts[0]["clean"], residual, heads, estimates, paths,
                                refused, circuit)
    return OutsideAnalysis(model_summary(model), pairs, prompts, metric_name, head_scores, patching,
                           attention_patterns(model, clean[:1])[:, 0].cpu(), round(time.perf_counter() - started, 2))
