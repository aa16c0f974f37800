"""The committed zoo (analyses/zoo.py): every folder is what its rebuild command makes, and the
analyses find in each trained model what analyses/RESULTS.md says they find, in seconds."""

from pathlib import Path

import pytest
import torch

from analyses.zoo import KEPT_FILES, ZOO, status, zoo_path
from interp.attention import classify_heads
from interp.tasks.composite import composite_verdict
from interp.tasks.lego_heads import hop_effects
from interp.tasks.lego_verdict import lego_parity_rules
from models.runs import TRAIN_STATE, load_run
from tasks import seeded_generator
from tests.helpers import held_out_rates_by_hand


@pytest.fixture(scope="module")
def runs():
    loaded = {}

    def load(name):
        if name not in loaded:
            loaded[name] = load_run(zoo_path(name))
        return loaded[name]

    with torch.no_grad():
        yield load


@pytest.mark.parametrize("name", list(ZOO))
def test_each_zoo_folder_holds_its_entrys_config_and_small_weights_only(name):
    folder = zoo_path(name)
    assert status(name) == "built", f"rebuild with: {ZOO[name].command()}"
    assert not (folder / TRAIN_STATE).exists()
    assert {p.name for p in folder.iterdir()} <= set(KEPT_FILES)
    assert (folder / "model.safetensors").stat().st_size <= 2 * 2**20


def hop_head_effects(run, seed=1):
    """Exact head patching for a change that reaches #2 only through the hop: flip #1's group
    element (depth 1) and read #2; values normalised (1 = the whole clean-corrupted difference)."""
    return hop_effects(run, depth=1, variable=2, seed=seed)


def head_labels(run):
    return classify_heads(run.model, run.task, run.task.sample(256, seeded_generator(0), split="test").tokens).labels


def test_planted_lego_model_its_heads_patching_and_rules(runs):
    run = runs("lego-planted")
    assert run.metrics[-1]["acc_per_var"][:3] == [1.0, 1.0, 1.0]
    labels = head_labels(run)
    assert [labels[layer][0] for layer in (1, 2, 3)] == ["association"] * 3  # the planted heads
    assert labels[1][2] == "manipulation"  # learned around them
    effects = hop_head_effects(run)
    assert effects[2, 0] > 0.5 and effects[1, 2] > 0.5  # planted association, learned manipulation
    rules = lego_parity_rules(run.model, run.task, n=1000)
    assert all(rule.is_true_rule for rule in rules[:3])
    for rule in rules[3:]:  # one hop, then the variable's own element: x0 + g0 + g(k-1) + gk
        k = rule.variable
        assert rule.terms == ["x0", "g0", f"g{k - 1}", f"g{k}"] and rule.agreement > 0.8


def test_mimic_lego_model_keeps_its_mimicked_association_head_and_sits_on_the_plateau(runs):
    run = runs("lego-mimic")
    labels = head_labels(run)
    assert labels[0][1] == "association"  # mimicking trains heads 0 and 1 of every layer
    assert [labels[layer][0] for layer in (1, 2, 3)] == ["manipulation"] * 3
    rules = lego_parity_rules(run.model, run.task, n=1000)
    assert rules[1].is_true_rule and rules[1].accuracy > 0.98
    for rule in rules[2:]:  # the zero-hop rule: #0's value, then the variable's own element
        assert rule.terms == ["x0", "g0", f"g{rule.variable}"] and rule.agreement > 0.95
        assert 0.4 < rule.accuracy < 0.6


@pytest.mark.parametrize(("name", "verdict", "rate"), [("composite-symmetric", "symmetric", "held_out_symmetric"),
                                                      ("composite-inferential", "inferential", "held_out_inferential")])
def test_composite_models_answer_held_out_pairs_as_their_names_say(runs, name, verdict, rate):
    result = composite_verdict(runs(name).model, runs(name).task)
    assert result.verdict == verdict and result.seen_accuracy > 0.95 and getattr(result, rate) > 0.5
    inferential, symmetric = held_out_rates_by_hand(runs(name), n=2000)
    assert (result.held_out_inferential, result.held_out_symmetric) == (round(inferential, 4), round(symmetric, 4))


def test_the_readmes_python_example_runs_on_the_zoo():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(compile(block, "README.md (From Python)", "exec"), namespace)  # noqa: S102
    assert namespace["result"].values.shape == (4, 4) and len(namespace["rules"]) == 6
    assert len(namespace["paths"].strongest(5)) == 5


def test_long_mimic_lego_model_passes_the_hop_with_a_learned_association_head(runs):
    """Mimicking trains heads 0 (conv) and 1 (same token) of each layer; head 3 of layer 1 was never
    mimicked, yet is labelled association and carries about half of the hop's effect on #2."""
    run = runs("lego-mimic-long")
    assert run.metrics[-1]["acc_per_var"][2] > 0.85
    labels = head_labels(run)
    assert labels[1][3] == "association" and labels[2][0] == "manipulation"
    effects = hop_head_effects(run)
    assert effects[1, 3] > 0.3 and effects[2, 0] > 0.5
    rules = lego_parity_rules(run.model, run.task, n=1000)
    assert rules[2].is_true_rule and rules[2].agreement > 0.85


def test_every_report_says_how_the_model_got_its_heads(runs):
    from interp.run_report import build_run_report

    def summary(name):
        return next(body for heading, body in build_run_report(runs(name), n_examples=1).sections
                    if heading == "Summary")

    planted = summary("lego-planted")
    assert "planted (hardcoded: layer 1 head 0 association" in planted and "zoo/lego-three-hops" in planted
    assert "Heads: mimicked, then learned: 1500 steps" in summary("lego-mimic-long")
    assert "Heads: learned: random initialisation" in summary("composite-inferential")
    assert [entry.origin for entry in ZOO.values()] == ["planted", "mimicked", "mimicked", "learned", "learned",
                                                        "warm-started", "warm-started", "warm-started",
                                                        *["warm-started"] * 4, "learned", "learned", "learned",
                                                        "learned"]
    assert "warm-started from the weights of zoo/lego-three-hops-n6" in summary("lego-three-hops")


def test_the_hop_breakdown_reads_a_solved_hop_and_the_zero_hop_rule(runs):
    from analyses.research.plateau import hop_breakdown

    solved, plateau = hop_breakdown(runs("lego-planted"), 600), hop_breakdown(runs("lego-mimic"), 600)
    assert "accuracy 1.00" in solved[0] and all(cell.endswith("1.00") for line in solved[1:5]
                                                 for cell in line.split(": ", 1)[1].split(", "))
    # the plateau model answers x0 + g0 + g2: always wrong where the parent negates
    assert float(plateau[0].rsplit("accuracy ", 1)[1].rstrip("), by:")) < 0.05
    assert [line.split(":")[0].strip() for line in solved[1:5]] == ["parent's slot", "own slot",
                                                                    "parent slot - own slot",
                                                                   "parent's letter"]


def test_the_six_letter_model_learned_the_hop_for_one_letter_and_the_workbench_finds_its_head(runs):
    """analyses/lab/lego-recipes.md, "What the six-letter models know of the hop": learned from random init, no
    planted or mimicked heads; #2 right whenever the parent is d; L1H3 looks at d's clause."""
    from analyses.research.plateau import hop_breakdown

    run = runs("lego-six-letters")
    assert run.config.heads_origin == "learned" and 0.65 < run.metrics[-1]["acc_per_var"][2] < 0.72
    lines = hop_breakdown(run, 1200)
    letters = dict(cell.split(": ") for cell in lines[4].split(": ", 1)[1].split(", "))
    assert float(letters["d"]) == 1.0 and all(float(v) < 0.35 for k, v in letters.items() if k != "d")
    assert "parent d (best answered)" in lines[5] and "L1H3" in lines[5]
    top = lines[6].split("metric at #2: ", 1)[1].split(", ")[0]  # exact patching where the hop works
    assert top.startswith("L1H3 +") and float(top.split("+")[1]) > 0.9


def test_at_batch_512_a_plain_model_learns_the_hop_and_the_workbench_labels_its_association_heads(runs):
    """analyses/lab/lego-recipes.md, "Batch 512": learned from random init, nothing planted or mimicked; #0-#2 right;
    heads of layer 2 are labelled association, and the hop's effect on #2 runs through them."""
    run = runs("lego-association")
    assert run.config.heads_origin == "learned" and run.metrics[-1]["acc_per_var"][:3] == [1.0, 1.0, 1.0]
    association = [head for head, label in enumerate(head_labels(run)[2]) if label == "association"]
    assert association, "no layer-2 head labelled association"
    effects = hop_head_effects(run)
    assert max(float(effects[2, head]) for head in association) > 0.7  # L2H3: .82


@pytest.mark.parametrize("name", ["lego-three-hops-n6", "lego-three-hops"])
def test_a_curriculum_of_plain_models_follows_three_hops_through_heads_the_workbench_labels(runs, name):
    """analyses/lab/lego-recipes.md, "Three hops": lego-association (one hop, learned) trained on #0-#4, then on
    n = 8: every supervised variable >= 98% with the chain's true rule, #4 three hops from #1;
    a learned association head and a learned manipulation head each carry >= 0.3 of the
    normalised effect of an element the answer reaches only through hops."""
    run = runs(name)
    assert run.config.model.planted == {} and run.config.train.mimic_steps == 0
    assert run.config.heads_origin == "warm-started" and run.config.train.init_from.startswith("zoo/lego-")
    assert min(run.metrics[-1]["acc_per_var"][:5]) >= 0.98
    rules = lego_parity_rules(run.model, run.task, n=1000)
    assert all(rule.is_true_rule and rule.agreement > 0.98 for rule in rules[:5])
    labels = head_labels(run)
    association = [(layer, head) for layer, row in enumerate(labels) for head, label in enumerate(row)
                   if label == "association"]
    manipulation = [(layer, head) for layer, row in enumerate(labels) for head, label in enumerate(row)
                    if label == "manipulation"]
    assert association and manipulation
    hop, second = hop_effects(run, depth=1, variable=4), hop_effects(run, depth=2, variable=4)
    assert max(float(hop[cell]) for cell in association) >= 0.3  # #1's element reaches #4 in three hops
    assert max(float(effects[cell]) for effects in (hop, second) for cell in manipulation) >= 0.3


def test_a_learned_albert_follows_three_hops_through_heads_the_classifier_labels_by_role(runs):
    """analyses/lab/lego-recipes.md, "The curriculum as one command": ALBERT seed 1 of the cpu-scale study (tied
    layers, the lego-three-hops-albert curriculum, nothing planted or mimicked) fits #0-#4 of n = 8
    with the true rule; #1's element reaches #4 through L0H2 (.84) and L1H1 (.70). Averaged over
    every query the classifier labelled every head mixed; scored by role ("The classifier against
    patching") L0H2 and L1H1 are manipulation heads and two late heads look up the parent clause."""
    run = runs("lego-three-hops-albert")
    assert run.config.model.tie_layers and run.config.model.planted == {} and run.config.train.mimic_steps == 0
    assert ZOO["lego-three-hops-albert"].curriculum == "lego-three-hops-albert"
    assert min(run.metrics[-1]["acc_per_var"][:5]) >= 0.98
    rules = lego_parity_rules(run.model, run.task, n=1000)
    assert all(rule.is_true_rule and rule.agreement > 0.98 for rule in rules[:5])
    assert not any(rule.is_true_rule for rule in rules[5:])  # #5-#7: no extrapolation
    hop = hop_effects(run, depth=1, variable=4)
    assert float(hop[0, 2]) >= 0.6 and float(hop[1, 1]) >= 0.5
    labels = head_labels(run)
    assert labels[0][2] == labels[1][1] == "manipulation"
    assert labels[2][3] == labels[3][3] == "parent"


def test_the_classifier_check_counts_carriers_and_labels_before_and_after_with_their_evidence(capsys):
    """`python -m analyses.research.classifier_check` on the zoo's three-hop model
    (analyses/lab/workbench-circuits.md, "Labels against patching"): L3H3 looks up the parent clause
    and is used; L3H0, mixed before, reads #2's clause from everywhere (the depth kind) and carries
    the hop; no head carrying < 0.05 is shown as a used hop head after, one is before (L1H2, a
    manipulation head the answer does not depend on)."""
    from analyses.research.classifier_check import main

    assert main(["zoo/lego-three-hops", "--n-pairs", "32"]) == 0
    out = capsys.readouterr().out
    line = lambda head: out.split(f"  {head} ", 1)[1].split("\n", 1)[0]  # noqa: E731
    assert "after parent, used" in line("L3H3")
    assert "before mixed" in line("L3H0") and "after depth (#2's clause), used" in line("L3H0")
    assert "after looks like manipulation, not used" in line("L1H2")
    cells = out.splitlines()[-1].split("|")
    carriers, before, after, idle = (cells[i].strip() for i in (2, 3, 4, 5))
    assert int(carriers) == 9 and idle == "1 / 0"
    assert int(after.split(" / ")[1].split()[0]) > int(before.split(" / ")[1].split()[0])  # more carriers named


@pytest.mark.parametrize("seed", [0, 1])
def test_the_12_layer_albert_extrapolates_by_the_chain_and_the_bert_does_not(runs, seed):
    """analyses/lab/lego-depth.md, "12 layers for 12 variables" (the LEGO paper's shape at d_model 64, built on
    an H100 by analyses/gpu/zoo.sh): both fit #0-#5; ALBERT answers #6 by the chain's true rule, BERT
    a little above chance."""
    albert, bert = runs(f"lego12-albert-s{seed}"), runs(f"lego12-bert-s{seed}")
    for run in (albert, bert):
        assert run.config.model.n_layers == 12 and run.config.model.planted == {} and run.config.train.mimic_steps == 0
        assert run.config.heads_origin == "warm-started" and min(run.metrics[-1]["acc_per_var"][:6]) >= 0.99
    assert albert.config.model.tie_layers and not bert.config.model.tie_layers
    albert_rules, bert_rules = (lego_parity_rules(run.model, run.task, n=500)[:8] for run in (albert, bert))
    assert all(rule.is_true_rule for rule in albert_rules[:7]) and albert_rules[6].accuracy > 0.95
    assert bert_rules[6].accuracy < 0.8  # BERT s0 .70, s1 .60 here (n = 500)


@pytest.mark.parametrize(("name", "verdict"), [("composite-matched-inferential", "inferential"),
                                               ("composite-matched-symmetric", "symmetric")])
def test_the_matched_protocol_pair_answers_held_out_pairs_as_named(runs, name, verdict):
    """analyses/lab/composite-mechanism.md, "Findings 2-4 on one protocol's pair": under the matched protocol, seed 1,
    depth 2, gamma 0.9 composes the primitives on held-out pairs and gamma 0.5 answers them
    symmetrically."""
    run = runs(name)
    result = composite_verdict(run.model, run.task)
    assert run.config.model.n_layers == 2 and run.config.task.key_modulus == 9
    assert result.verdict == verdict and result.seen_accuracy > 0.95
