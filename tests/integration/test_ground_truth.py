"""Issue 28, part 2: compiled ground truth. The fixtures in tests/data/circuits/ are models whose
weights were set by hand (tests/fixtures/make_fixtures.py), so every node and edge of their circuit is
known: Q-, K- and V-composition, a three-layer two-hop chain, a cancelling pair (part 3), each
with distractor heads nothing reads, and each again with N(0, 0.05) on every weight.

Per fixture and method, precision and recall of the known nodes (heads) and edges (sender ->
receiver's q/k/v, or -> logits), and the AUROC of the method's scores against them (MIB's
InterpBench score: the chance that a known node or edge outscores an unknown one, ties 1/2):

  exact        exact head patching (`patch_head_out`); node score |effect|
  path         path patching (`path_patch`); edge score |effect|, node score the largest |effect|
               of the edges at the head (sent or received)
  atp, graddrop, ig4
               attribution estimates of the head sweep (`judge_estimates`, ig_steps=4); node score |estimate|
  circuit (first), circuit (stays), circuit (both)
               `find_circuit` under each rule ("stays", the default, is the one a cancelling
               pair does not fool); a set, so its AUROC scores members 1, the rest 0

Node-level methods are judged on nodes only. Scores are normalised effects (1 = the whole clean -
corrupted difference); a node or edge is predicted where its score exceeds THRESHOLD = 0.1. The
table (all numbers) is printed (pytest -s) and written to $GROUND_TRUTH_JSON, else
ground_truth.json in the temporary folder (not into the repository). The floors asserted are ones the methods were
measured to reach (FLOORS); the numbers are deterministic (CPU, one thread).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

import pytest

from interp.atp import judge_estimates
from interp.circuit import candidate_edges, edge_name, find_circuit, head_name
from interp.patching import patch_head_out
from interp.paths import path_patch
from tests.fixtures.make_fixtures import OUT, build_all, differences, load_fixture

ROOT = Path(__file__).resolve().parents[2]
THRESHOLD = 0.1
NAMES = ["q_composition", "k_composition", "v_composition", "two_hop_chain", "cancellation"]
FIXTURES = [*NAMES, *(f"{name}_noisy" for name in NAMES)]
METHODS = ["exact", "path", "atp", "graddrop", "ig4", "circuit (first)", "circuit (stays)", "circuit (both)"]
COLUMNS = ("node_precision", "node_recall", "node_auroc", "edge_precision", "edge_recall", "edge_auroc")


def precision_recall(predicted: set, known: set) -> tuple[float | None, float]:
    """Precision (None where nothing is predicted) and recall."""
    hits = len(predicted & known)
    return (hits / len(predicted) if predicted else None), hits / len(known)


def auroc(scores: dict, known: set) -> float:
    """P(score of a known item > score of an unknown one), ties counting 1/2 (Mann-Whitney)."""
    positive = [v for k, v in scores.items() if k in known]
    negative = [v for k, v in scores.items() if k not in known]
    assert len(positive) == len(known) and negative, "every known item must be scored, and some other"
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


def judge(nodes: dict[str, float], known_nodes: set[str], edges: dict[tuple[str, str], float] | None,
          known_edges: set[tuple[str, str]], threshold: float = THRESHOLD) -> dict[str, float | None]:
    row: dict[str, float | None] = {}
    row["node_precision"], row["node_recall"] = precision_recall({k for k, v in nodes.items() if v > threshold},
                                                                 known_nodes)
    row["node_auroc"] = auroc(nodes, known_nodes)
    if edges is not None:
        row["edge_precision"], row["edge_recall"] = precision_recall({k for k, v in edges.items() if v > threshold},
                                                                     known_edges)
        row["edge_auroc"] = auroc(edges, known_edges)
    return row


def evaluate(name: str) -> tuple[dict[str, dict[str, float | None]], dict]:
    """Every method on one fixture: its row of the table, and what the circuit finder found."""
    truth = load_fixture(OUT / name)
    model, pairs = truth.model, truth.pairs
    cfg = model.cfg
    heads = [head_name(layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    every_edge = [edge_name(e) for e in candidate_edges({(layer, head) for layer in range(cfg.n_layers)
                                                          for head in range(cfg.n_heads)})]
    known_nodes, known_edges = set(truth.nodes), set(truth.edges)
    assert known_nodes <= set(heads) and known_edges <= set(every_edge)
    args = (model, pairs.clean, pairs.corrupted, pairs.logit_diff())
    rows, seconds = {}, {}

    started = time.perf_counter()
    exact = patch_head_out(*args)
    seconds["exact"] = time.perf_counter() - started
    rows["exact"] = judge({h: abs(v) for h, v in zip(heads, exact.values.flatten().tolist())}, known_nodes, None,
                          known_edges)

    started = time.perf_counter()
    paths = path_patch(*args)
    seconds["path"] = time.perf_counter() - started
    edge_scores = {e: 0.0 for e in every_edge} | {(s, r): abs(v) for s, r, v in paths.strongest(k=None)}
    node_scores = {h: max(v for (s, r), v in edge_scores.items() if h in (s, r.split(".")[0])) for h in heads}
    rows["path"] = judge(node_scores, known_nodes, edge_scores, known_edges)

    started = time.perf_counter()
    for estimate, judged in judge_estimates(*args, "head", exact, ig_steps=4).items():
        rows[estimate] = judge({h: abs(v) for h, v in zip(heads, judged.estimate.values.flatten().tolist())},
                               known_nodes, None, known_edges)
    seconds["attribution"] = time.perf_counter() - started

    found = {}
    for rule in ("first", "stays", "both"):
        method = f"circuit ({rule})"
        started = time.perf_counter()
        circuit = find_circuit(*args, exact.values, paths, rule=rule)
        seconds[method] = time.perf_counter() - started
        kept_edges = {(s, r) for s, r, _ in circuit.edges}
        rows[method] = judge({h: float(h in circuit.nodes) for h in heads}, known_nodes,
                             {e: float(e in kept_edges) for e in every_edge}, known_edges, threshold=0.5)
        areas = circuit.areas()
        found[method] = {"nodes": circuit.nodes, "edges": sorted(kept_edges), "faithfulness": circuit.faithfulness,
                         "faithfulness_mean": circuit.faithfulness_mean, "curve": circuit.curves,
                         "edge_faithfulness": circuit.edge_faithfulness,
                         "edge_faithfulness_mean": circuit.edge_faithfulness_mean, "reached": circuit.reached,
                         "node_cpr_cmd": areas["nodes"], "edge_cpr": areas["edges"]["cpr"],
                         "edge_cmd": areas["edges"]["cmd"], "n_edges": circuit.n_edges,
                         "edge_curve_ends": [circuit.edge_curve[0], circuit.edge_curve[-1]],
                         "sizes_by_rule": circuit.sizes_by_rule()}
    found["seconds"] = {k: round(v, 3) for k, v in seconds.items()}
    return rows, found


# What each method was measured to reach, as floors: per group of fixtures, the minimum over its
# fixtures of (node precision, node recall, node AUROC, edge precision, edge recall, edge AUROC);
# None: not asserted (a node-level method has no edges). Exact and path patching and the finder
# under "stays" and "both" reach 1.0 everywhere. One-step attribution misses heads whose effect
# passes through a saturated softmax (L0H0 of q_composition scores 0.011: recall 1/2 on Q- and
# K-composition, 1/3 on the chain); GradDrop recovers no more. Four-step integrated gradients
# recovers every head but on the noiseless cancelling pair, where it ranks the known heads first
# (AUROC 1) but scores the three upstream ones 0.083, under the threshold: along its path from
# corrupted to clean both signs flip together, so their product, which drives L2H0's softmax, hardly
# moves (the cancellation again, in the gradient); the noise breaks the symmetry (0.15-0.17). Rule
# "first" (the default before "stays") keeps L2H0 alone on both cancellation fixtures: recall 1/4 of
# nodes and edges.
NOISELESS = NAMES
NOISY = [f"{name}_noisy" for name in NAMES]
ALL_ONES = (1.0,) * 6
FLOORS: dict[tuple[str, str], tuple] = {
    ("noiseless", "exact"): (1.0, 1.0, 1.0, None, None, None), ("noisy", "exact"): (1.0, 1.0, 1.0, None, None, None),
    ("noiseless", "path"): ALL_ONES, ("noisy", "path"): ALL_ONES,
    ("noiseless", "atp"): (1.0, 0.25, 1.0, None, None, None), ("noisy", "atp"): (1.0, 1 / 3, 1.0, None, None, None),
    ("noiseless", "graddrop"): (1.0, 0.25, 0.75, None, None, None),
    ("noisy", "graddrop"): (1.0, 0.25, 0.5, None, None, None),
    ("noiseless", "ig4"): (1.0, 0.25, 1.0, None, None, None), ("noisy", "ig4"): (1.0, 1.0, 1.0, None, None, None),
    ("noiseless", "circuit (stays)"): ALL_ONES, ("noisy", "circuit (stays)"): ALL_ONES,
    ("noiseless", "circuit (first)"): (1.0, 0.25, 0.625, 1.0, 0.25, 0.625),
    ("noisy", "circuit (first)"): (1.0, 0.25, 0.625, 1.0, 0.25, 0.625),
    ("noiseless", "circuit (both)"): ALL_ONES, ("noisy", "circuit (both)"): ALL_ONES,
}
GROUPS = {"noiseless": NOISELESS, "noisy": NOISY}


@pytest.fixture(scope="module")
def table():
    started = time.perf_counter()
    rows, found = {}, {}
    for name in FIXTURES:
        rows[name], found[name] = evaluate(name)
    seconds = time.perf_counter() - started
    lines = [f"{'fixture':22s} {'method':16s} " + " ".join(f"{c.replace('_', ' '):>14s}" for c in COLUMNS)]
    for name in FIXTURES:
        for method in METHODS:
            row = rows[name][method]
            cells = ["-" if row.get(c) is None else f"{row[c]:.3f}" for c in COLUMNS]
            lines.append(f"{name:22s} {method:16s} " + " ".join(f"{c:>14s}" for c in cells))
    print("\n" + "\n".join(lines))
    for name in FIXTURES:
        f = found[name]
        stays = f["circuit (stays)"]
        print(f"{name}: circuit (stays) {stays['nodes']} (first: {f['circuit (first)']['nodes']}, both: "
              f"{f['circuit (both)']['nodes']}); node CPR/CMD {stays['node_cpr_cmd']}; edge CPR "
              f"{stays['edge_cpr']}, CMD {stays['edge_cmd']}; seconds {f['seconds']}")
    print(f"ground truth: {len(FIXTURES)} fixtures in {seconds:.1f} s")
    out = Path(os.environ.get("GROUND_TRUTH_JSON") or Path(tempfile.gettempdir()) / "ground_truth.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"threshold": THRESHOLD, "columns": list(COLUMNS), "rows": rows, "circuits": found,
                               "seconds": round(seconds, 1)}, indent=1))
    print(f"written to {out}")
    return rows, found


def test_the_script_rebuilds_the_committed_fixtures():
    """`python -m tests.fixtures.make_fixtures` is deterministic: a fresh build in memory is the
    committed circuit.json exactly and the committed weights within 1e-7 (relative above 1;
    on the machine that wrote them, bit for bit). Each fixture is under 200 KB."""
    assert sorted(build_all()) == sorted(FIXTURES)
    assert differences() == []
    for name in FIXTURES:
        assert sum(p.stat().st_size for p in (OUT / name).iterdir()) < 200 * 1024


def test_the_fixtures_do_what_their_circuits_say():
    """Noiseless: clean prompts give the answer by UNEMBED (4 logits), corrupted ones the wrong
    answer by as much, and the distractor heads change nothing when resampled."""
    for name in NOISELESS:
        truth = load_fixture(OUT / name)
        metric = truth.pairs.logit_diff()
        clean, corrupted = metric(truth.model(truth.pairs.clean)), metric(truth.model(truth.pairs.corrupted))
        assert clean.min() > 3.9 and corrupted.max() < -3.9, name
        exact = patch_head_out(truth.model, truth.pairs.clean, truth.pairs.corrupted, metric).values
        for distractor in truth.meta["distractors"]:
            layer, head = (int(x) for x in distractor[1:].split("H"))
            assert abs(exact[layer, head]) < 1e-3, (name, distractor)
    for name in NOISY:  # the noisy twins still do the task on every pair
        truth = load_fixture(OUT / name)
        metric = truth.pairs.logit_diff()
        assert metric(truth.model(truth.pairs.clean)).min() > 0 > metric(truth.model(truth.pairs.corrupted)).max()


def test_methods_recover_the_known_circuits(table):
    rows, found = table
    for name in FIXTURES:  # exact and path patching and the finder: everything, nothing else, noise or not
        for method, columns in (("exact", COLUMNS[:3]), ("path", COLUMNS), ("circuit (stays)", COLUMNS)):
            assert all(rows[name][method][c] == 1.0 for c in columns), (name, method, rows[name][method])
    assert rows["cancellation"]["ig4"]["node_recall"] == 0.25
    assert rows["cancellation_noisy"]["ig4"]["node_recall"] == 1.0
    assert {method for _, method in FLOORS} == set(METHODS)
    for (group, method), floors in FLOORS.items():
        for name in GROUPS[group]:
            for column, floor in zip(COLUMNS, floors):
                if floor is not None:
                    value = rows[name][method][column]
                    assert value is not None and value >= floor - 1e-9, (name, method, column, value, floor)


def test_the_cancelling_pair_fools_the_first_rule_and_not_stays_or_both(table):
    """Part 3: resample ablation of L0H0, L0H1 and L1H0 together cancels (both signs flip back),
    so rule "first" stops at L2H0 alone, faithful 1.0 under resample and 0.75 under mean;
    "stays" (the default) and "both" keep the whole chain, and "stays" its edges."""
    _, found = table
    before, after = found["cancellation"]["circuit (first)"], found["cancellation"]["circuit (stays)"]
    assert before["sizes_by_rule"] == after["sizes_by_rule"] == {"first": 1, "stays": 4, "both": 4}
    assert before["nodes"] == ["L2H0"] and before["faithfulness"] == pytest.approx(1.0, abs=1e-3)
    assert before["faithfulness_mean"] == pytest.approx(0.75, abs=1e-2)
    assert before["curve"]["resample"][:4] == pytest.approx([0.0, 1.0, 0.5, 0.5], abs=1e-3)
    truth = load_fixture(OUT / "cancellation")
    assert sorted(after["nodes"]) == sorted(truth.nodes) and set(after["edges"]) == set(truth.edges)
    assert after["faithfulness"] == pytest.approx(1.0, abs=1e-3)
    assert after["faithfulness_mean"] == pytest.approx(1.0, abs=1e-3)
    assert sorted(found["cancellation"]["circuit (both)"]["nodes"]) == sorted(truth.nodes)


def test_the_faithfulness_curves_run_from_no_head_to_the_clean_model(table):
    _, found = table
    for name in FIXTURES:
        circuit = found[name]["circuit (stays)"]
        assert circuit["curve"]["resample"][-1] == pytest.approx(1.0, abs=1e-4)
        first, last = circuit["edge_curve_ends"]
        assert last == pytest.approx(1.0, abs=1e-4)  # every edge kept
        assert first == pytest.approx(circuit["curve"]["resample"][0], abs=1e-3)  # attention only: no edge = no head
        cpr, cmd = circuit["node_cpr_cmd"]["resample"]["cpr"], circuit["node_cpr_cmd"]["resample"]["cmd"]
        assert cmd >= 0 and (cpr <= 1 + 1e-9 or name.endswith("_noisy"))
    assert math.isfinite(found["cancellation"]["circuit (stays)"]["edge_cpr"])
