"""`workbench analyze` on freshly trained tiny runs: analysis.json and the report's sections."""

import html
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from analyses.cli import main
from interp.circuit import faithfulness_areas
from interp.patching import spearman
from tests.helpers import analysed_zoo_copy
from tests.integration.test_cli import TINY


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """`analysed(task, into)`: a copy at `into` of one tiny run of the task, trained and analysed
    (`--samples 64`) once for this file, what `workbench analyze` printed for it, and the typed
    analysis `analyze_run` handed the command before it was written."""
    import contextlib
    import io

    import interp.analysis

    made: dict[str, tuple[Path, str, Any]] = {}

    def copy(task: str, into: Path) -> tuple[Path, str, Any]:
        if task not in made:
            out = tmp_path_factory.mktemp("analysed") / task
            assert main(["train", "--task", task, "--out", str(out), *TINY]) == 0
            printed, kept = io.StringIO(), []
            measure = interp.analysis.analyze_run

            def keeping(*args, **kwargs):
                kept.append(measure(*args, **kwargs))
                return kept[-1]

            with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
                patch.setattr(interp.analysis, "analyze_run", keeping)
                assert main(["analyze", str(out), "--samples", "64"]) == 0
            made[task] = (out, printed.getvalue(), kept[0])
        shutil.copytree(made[task][0], into)
        return into, *made[task][1:]

    return copy


@pytest.mark.parametrize("task", ["lego", "composite", "templates"])
def test_analyze_writes_analysis_json_and_a_full_report(tmp_path, task, analysed):
    out, printed, _ = analysed(task, tmp_path / task)
    analysis = json.loads((out / "analysis.json").read_text())
    assert set(analysis) >= {"task", "heads", "patching", "probes", "verdict"} and analysis["task"] == task
    assert len(analysis["heads"]["labels"]) == 2  # layers
    assert analysis["patching"]["heads"]["method"] == "exact"
    assert analysis["patching"]["heads_attribution"]["method"] == "attribution"
    # how far attribution can be trusted on this run: its rank agreement with the exact map beside it
    exact, estimate = (torch.tensor(analysis["patching"][k]["values"]) for k in ("heads", "heads_attribution"))
    assert analysis["patching"]["heads_attribution_spearman"] == pytest.approx(spearman(estimate, exact))
    page = (out / "report.html").read_text()
    ranked = exact.numel() >= 5  # composite-cpu has 2 heads: no rank correlation over them is printed
    written = analysis["patching"]["heads_attribution_spearman"]
    assert (f"Spearman correlation with exact: {written:.2f}" in page) == ranked
    assert ("Rank correlation with exact: n/a (fewer than 5 heads)" in page) == (not ranked)
    # AtP*'s yardstick: heads verified in attribution's order until exact's top heads are all found
    verified = analysis["patching"]["heads_attribution_verified"]
    n_heads = exact.numel()
    order = (estimate - 0).abs().flatten().argsort(descending=True, stable=True).tolist()
    top = set(exact.abs().flatten().topk(verified["k"]).indices.tolist())
    assert verified["heads"] == max(order.index(i) for i in top) + 1 and verified["of"] == n_heads
    assert f"after {verified['heads']} of {n_heads} heads" in page
    # the same per head for GradDrop and integrated gradients; the rest is benchmark --patching's
    per_estimate = analysis["patching"]["heads_estimates_verified"]
    assert set(per_estimate) == {"atp", "graddrop", "ig4"} and per_estimate["atp"]["heads"] == verified["heads"]
    assert all(1 <= found["heads"] <= n_heads and found["of"] == n_heads for found in per_estimate.values())
    assert (f"GradDrop {per_estimate['graddrop']['heads']} (Spearman" in page) == ranked
    assert f"GradDrop {per_estimate['graddrop']['heads']}" in page and "workbench benchmark --patching" in page
    verdict = analysis["verdict"]  # what the verdict reads from the circuit graph
    if task == "lego":
        assert len(verdict["findings_from_circuit"]) == 1
        assert verdict["findings_from_circuit"][0].startswith("circuit: ")
        assert html.escape(verdict["findings_from_circuit"][0]) in page
    elif task == "composite":
        assert verdict["route"].endswith("logits") or verdict["route"] == "no circuit edge reaches the logits"
    paths = analysis["patching"]["paths"]  # the strongest head-to-head and head-to-logits paths
    if task == "templates":  # the preset's identity-augmented attention is beyond path patching: said, not hidden
        assert "identity-augmented" in paths["refused"] and "Not computed: path patching" in page
    else:
        assert paths["refused"] is None and paths["strongest"]
        assert all(r == "logits" or r.split(".")[1] in ("q", "k", "v") for _, r, _ in paths["strongest"])
    circuit = paths["circuit"]  # the fewest heads keeping 90%, measured; its curve starts and ends where it must
    n_heads = 4 if task == "templates" else len(analysis["heads"]["labels"][0])
    assert len(circuit["curve"]) == 2 * n_heads + 1
    assert abs(circuit["curve"][-1] - 1.0) <= 1e-4
    assert circuit["faithfulness"] == circuit["curve"][len(circuit["nodes"])]
    # MIB's areas of the faithfulness curves, on the page too: CPR over heads is the curve's mean height, between its
    # lowest and highest points, CMD the mean distance from 1 (>= 0); over edges where path patching ran
    areas = circuit["areas"]
    assert set(areas["nodes"]) == {"resample", "mean"} and circuit["rule"] == "stays"
    resample = areas["nodes"]["resample"]
    assert (resample["cpr"], resample["cmd"]) == pytest.approx(faithfulness_areas(circuit["curve"]), abs=1e-4)
    assert min(circuit["curve"]) <= resample["cpr"] <= max(circuit["curve"])
    assert all(one["cmd"] >= 0 and math.isfinite(one["cpr"]) for one in areas["nodes"].values())
    assert f"resample ablation: CPR {resample['cpr']:.2f}, CMD {resample['cmd']:.2f}" in page
    assert (areas["edges"] is None) == (task == "templates")
    if areas["edges"] is not None:
        assert areas["edges"]["cmd"] >= 0
        assert f"CPR {areas['edges']['cpr']:.2f}, CMD {areas['edges']['cmd']:.2f}." in page
    if task == "templates" or not circuit["nodes"]:  # no edges to ablate: said so on the page
        assert circuit["edge_faithfulness"] is None and circuit["edges"] == []
    else:  # the edges left after pruning keep what the heads keep, up to the target, and the page says so
        assert circuit["edge_faithfulness"] >= min(circuit["target"], circuit["faithfulness"]) - 1e-6
        assert len(circuit["edges"]) <= circuit["candidate_edges"]
        assert f"{circuit['candidate_edges']} edges among" in page
    for section in ["Verdict", "Attention heads", "Activation patching", "Path patching", "Circuit", "Training curves",
                    "Attention patterns"]:
        assert f"<h2>{section}</h2>" in page
    assert ("<h2>Probes</h2>" in page) == (task != "templates")  # templates have no probe map
    # `workbench report` alone rebuilds the same sections from analysis.json
    (out / "report.html").unlink()
    assert main(["report", str(out)]) == 0
    assert "<h2>Verdict</h2>" in (out / "report.html").read_text()
    if task == "composite":
        assert analysis["verdict"]["verdict"] == "unlearned"  # 12 steps cannot fit the seen pairs
        assert printed.startswith("unlearned")
    elif task == "templates":
        assert analysis["verdict"]["verdict"] == "unlearned" and analysis["probes"] is None
        assert set(analysis["verdict"]["accuracy"]) == {"train", "val", "test"}
        assert "printed variable" in analysis["patching"]["pairs"] or "symbol" in analysis["patching"]["pairs"]
        assert printed.startswith("unlearned (accuracy per symbol split")
    else:
        assert len(analysis["probes"]["accuracy"]) == 3  # embedding + 2 blocks
        rules = analysis["verdict"]["parity_rules"]  # what each variable's answers compute
        assert len(rules) == len(analysis["verdict"]["acc_per_var"]) and "closest parity rule" in page
        assert any("parity" in line for line in analysis["verdict"]["findings"])


def test_analyze_needs_a_trained_run(tmp_path):
    assert main(["analyze", str(tmp_path)]) == 2


@pytest.mark.parametrize("agreement, gap, says", [
    (0.93, 5.0, "broadly agrees"), (0.8, 5.0, "broadly agrees"), (0.79, 5.0, "only to screen"),
    (0.93, 0.1, "of little meaning"), (None, 5.0, "undefined"),
])
def test_the_report_says_how_far_attribution_agrees_with_exact(agreement, gap, says):
    from interp.analysis_html import _agreement_note

    heads = {"clean_metric": gap, "corrupted_metric": 0.0, "layers": [0, 1],
             "values": [[0.1, -0.7, 0.01], [0.0, 0.3, -0.02]]}  # 6 heads: enough to rank
    estimate = {"layers": [0, 1], "values": [[0.6, 0.0, 0.01], [0.05, 0.2, 0.0]]}
    patching = {"heads_attribution_spearman": agreement, "heads": heads, "heads_attribution": estimate,
                "heads_attribution_verified": None, "heads_estimates_verified": {}}
    note = _agreement_note(patching)
    assert says in note
    if agreement is not None and gap > 1:  # the heads that matter most, by |effect|, from both maps
        assert "exact: L0H1 -0.70, L1H1 0.30, L0H0 0.10; attribution: L0H0 0.60, L1H1 0.20, L1H0 0.05." in note


def test_no_rank_correlation_is_printed_over_fewer_than_5_heads():
    """Over 2 heads Spearman is +1 or -1 whatever the maps: the note compares values instead."""
    from interp.analysis_html import _agreement_note

    heads = {"clean_metric": 10.9, "corrupted_metric": -10.9, "layers": [0, 1], "values": [[1.0], [0.99]]}
    estimate = {"layers": [0, 1], "values": [[0.13], [0.18]]}
    found = {"heads": 2, "of": 2, "k": 2, "spearman": -1.0}
    patching = {"heads_attribution_spearman": -1.0, "heads": heads, "heads_attribution": estimate,
                "heads_attribution_verified": found, "heads_estimates_verified": {"atp": found, "ig4": found}}
    note = _agreement_note(patching)
    assert "n/a (fewer than 5 heads)" in note and "Spearman" not in note and "-1.00" not in note
    assert "differs" not in note and "agrees" not in note  # no verdict drawn from it
    assert "exact: L0H0 1.00, L1H0 0.99; attribution: L1H0 0.18, L0H0 0.13" in note


HOSTILE = "<img src=x onerror=alert(1)>"


def _poison(value):
    """Every string in a JSON tree replaced by the hostile payload (numbers kept, so the report
    can still draw its figures)."""
    if isinstance(value, str):
        return HOSTILE
    if isinstance(value, list):
        return [_poison(v) for v in value]
    if isinstance(value, dict):
        return {k: _poison(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("task", ["lego", "composite"])
def test_every_string_read_from_analysis_json_is_escaped_in_the_report(tmp_path, task, analysed):
    """Browser-free: a payload in every string field of analysis.json and in the run's name
    reaches the page as text (&lt;img ...), never as markup."""
    out, _, _ = analysed(task, tmp_path / f"{HOSTILE.replace('/', '')}-{task}")
    analysis = json.loads((out / "analysis.json").read_text())
    poisoned = {**_poison(analysis), "task": task}  # the task name picks the registry entry
    poisoned["patching"]["n_pairs"] = HOSTILE
    (out / "analysis.json").write_text(json.dumps(poisoned))
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "<img src=x" not in page
    assert page.count("&lt;img src=x onerror=alert(1)&gt;") >= 5


def test_the_summary_rounds_numbers_for_reading():
    from interp.run_report import readable

    assert readable("lr", 1.000028069254334e-05) == "1.00e-05"
    assert readable("eval_loss", 0.38413625955581665) == "0.384" and readable("train_loss", 5.03e-05) == "5.03e-05"
    assert readable("acc_per_var", [1.0, 0.98412, 0.5]) == "[1.0, 0.984, 0.5]"
    assert readable("step", 3000) == "3000" and readable("diverged", True) == "true"
    assert readable("acc_per_pair", {"1,2": 0.99999}) == "{1,2: 1.0}"


def _without_wall_times(value):
    """A JSON tree with every "seconds" field (the analysis's and the probe map's) dropped."""
    if isinstance(value, dict):
        return {k: _without_wall_times(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_without_wall_times(v) for v in value]
    return value


def test_analyze_runs_on_the_cpu_by_default_and_device_cpu_writes_the_same_analysis(tmp_path, capsys, analysed):
    out, printed, _ = analysed("composite", tmp_path / "run")  # analysed without --device
    assert printed.rstrip().endswith("on cpu")
    by_default = _without_wall_times(json.loads((out / "analysis.json").read_text())) | {"run": None}  # its folder
    assert main(["analyze", str(out), "--samples", "64", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("on cpu")
    on_cpu = _without_wall_times(json.loads((out / "analysis.json").read_text())) | {"run": None}
    assert on_cpu == by_default  # bit for bit, but for the wall times and the folder it was made in


def test_analyze_device_cuda_without_cuda_exits_2_naming_cuda_and_writes_nothing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(["train", "--task", "lego", "--out", str(out), *TINY]) == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # so that a GPU machine checks it too
    assert main(["analyze", str(out), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "analyze --device='cuda'" in err and "no CUDA device is available" in err
    assert not (out / "analysis.json").exists() and not (out / "report.html").exists()


def _key_tree(value):
    """The nested keys of a JSON value (list items by their first element's tree)."""
    if isinstance(value, dict):
        return {k: _key_tree(v) for k, v in value.items()}
    if isinstance(value, list) and value and isinstance(value[0], (dict, list)):
        return [_key_tree(value[0])]
    return None


@pytest.mark.parametrize("task", ["lego", "composite", "templates"])
def test_the_analysis_is_typed_until_written_in_the_format_of_before(tmp_path, task, analysed):
    """`analyze_run` hands back the objects that measured (head scores, patch results, the
    circuit, the probe map, the task's verdict), not JSON dicts. Written, it has the key tree of
    an analysis.json made by the dict-based code (9f7496e, tests/data/) of the same tiny run, but
    the composite verdict's new per-key-position rates, the analysed weights' step and digest, the
    schema version, the circuit's rule and areas (CPR, CMD) and the classifier's kinds; and such an
    older file still renders. The circuit's rule is "stays" since 9f7496e: on the untrained LEGO run its curve
    falls back to 0.38 at 7 of the 8 heads, so it keeps all 8 where "first" kept 2, and edges
    among them where 9f7496e's circuit needed none (its empty list gives no item shape: the
    (sender, receiver, value) triples are pinned by the composite file)."""
    from interp.analysis import write_analysis
    from interp.analysis_file import SCHEMA, read_analysis
    from interp.attention import HEAD_KINDS, HeadScores
    from interp.circuit import Circuit
    from interp.patching import PatchResult
    from interp.run_report import build_run_report
    from interp.tasks.composite import CompositeProbeMap, CompositeVerdict
    from interp.tasks.lego_probes import ProbeMap
    from interp.tasks.lego_verdict import LegoVerdict
    from interp.tasks.templates import TemplatesVerdict
    from models.runs import load_run

    out, _, analysis = analysed(task, tmp_path / task)  # the CLI's analyze_run(run, n_samples=64, seed=0)
    run = load_run(out)
    assert isinstance(analysis.heads, HeadScores) and isinstance(analysis.patching.circuit, Circuit)
    assert isinstance(analysis.patching.residual, PatchResult) and analysis.patching.heads.method == "exact"
    assert set(analysis.patching.estimates) == {"atp", "graddrop", "ig4"}
    assert isinstance(analysis.verdict, {"lego": LegoVerdict, "composite": CompositeVerdict,
                                         "templates": TemplatesVerdict}[task])
    assert isinstance(analysis.probes,
                      {"lego": ProbeMap, "composite": CompositeProbeMap, "templates": type(None)}[task])
    if task == "lego":  # what the circuit graph adds to the verdict is a field of it
        assert analysis.verdict.findings_from_circuit[0].startswith("circuit: ")
    written = analysis.to_dict()
    before = json.loads((Path(__file__).parents[1] / "data" / f"analysis-9f7496e-{task}.json").read_text())
    if task == "composite":
        assert set(written["verdict"].pop("held_out_by_key_position")) == {"inferential", "symmetric"}
    assert written.pop("weights") == run.weights.to_dict()  # added since: which weights were analysed
    assert written.pop("schema") == SCHEMA  # added since: the version of the format (older files are 1)
    circuit, pinned = (tree["patching"]["paths"]["circuit"] for tree in (written, before))
    assert circuit.pop("areas") == analysis.patching.circuit.areas() and circuit.pop("rule") == "stays"  # added since
    if task == "lego":  # rule "stays": every head, and edges where "first" kept 2 heads and no edge
        assert (len(pinned["nodes"]), pinned["edges"]) == (2, []) and len(circuit["nodes"]) == len(circuit["order"])
        assert circuit["edges"] and _key_tree(circuit["edges"]) == [None]
        circuit["edges"] = []  # compared as 9f7496e's empty list, whose items have no shape to compare
    assert set(written["heads"]["scores"]) == set(written["heads"]["thresholds"]) == set(HEAD_KINDS)
    evidence = written["heads"].pop("evidence")  # added since (schema 3): each label with its patching share
    assert len(evidence["status"]) == len(written["heads"].pop("where")) == len(written["heads"]["labels"])
    kinds_aside = lambda tree: {**tree, "heads": {**tree["heads"], "scores": {}, "thresholds": {}}}  # noqa: E731
    # the kinds changed since (issue 28, part 5)
    assert _key_tree(kinds_aside(written)) == _key_tree(kinds_aside(before))
    write_analysis(run, analysis)
    assert read_analysis(out) == json.loads(json.dumps(analysis.to_dict()))  # what was written comes back
    (out / "analysis.json").write_text(json.dumps(before))  # the older file renders every section
    page = build_run_report(run).to_html()
    assert all(f"<h2>{section}</h2>" in page
               for section in ["Verdict", "Activation patching", "Path patching", "Circuit"])


def test_a_learned_models_circuit_areas_lie_in_0_1_in_analysis_json_and_the_report(built_once):
    """On a learned model (the zoo's composite-inferential, copied and analysed: shared with
    test_browser_report) the faithfulness curves run from the corrupted run to the clean one
    without overshooting, so MIB's CPR and CMD lie in [0, 1], over heads under both ablations and
    over edges, and sum to 1."""
    out = analysed_zoo_copy(built_once, "composite-inferential")
    areas = json.loads((out / "analysis.json").read_text())["patching"]["paths"]["circuit"]["areas"]
    for one in [*areas["nodes"].values(), areas["edges"]]:
        assert 0 <= one["cpr"] <= 1 and 0 <= one["cmd"] <= 1 and one["cpr"] + one["cmd"] == pytest.approx(1, abs=1e-3)
    page = (out / "report.html").read_text()
    assert f"resample ablation: CPR {areas['nodes']['resample']['cpr']:.2f}" in page and "MIB benchmark" in page


DATA = Path(__file__).parents[1] / "data"
# what the first writers of analysis.json left out (schema 1 has no "schema" key): absent, each is
# read as not recorded, but attribution's Spearman, which is computed from the written maps
OLDEST_GAPS = ("heads_attribution_spearman", "heads_attribution_verified", "heads_estimates_verified", "paths")


@pytest.mark.parametrize("task", ["lego", "composite", "templates"])
def test_a_schema_1_analysis_json_is_read_upgraded_and_renders(tmp_path, task):
    """analysis.json files written before the schema key (tests/data, 9f7496e) read as the current
    schema, every value of theirs kept, and render every section; so do the first writers' files,
    which lack the later fields."""
    from interp.analysis_file import SCHEMA, read_analysis, upgraded

    before = json.loads((DATA / f"analysis-9f7496e-{task}.json").read_text())
    (tmp_path / "analysis.json").write_text(json.dumps(before))
    read = read_analysis(tmp_path)
    expected = json.loads(json.dumps(before))
    expected["patching"]["paths"]["circuit"].update(rule="first", areas=None)  # the rule then; no areas then
    expected["heads"].update(where=None, evidence=None)  # no depth or gathering kinds, no evidence then
    assert read == {**expected, "schema": SCHEMA, "weights": None}  # no weights recorded then
    page = _sections(read)
    assert all(f"<h2>{section}</h2>" in page for section in ["Verdict", "Attention heads", "Activation patching",
                                                               "Path patching", "Circuit"])
    words = re.sub(r'src="data:[^"]*"', "", page)  # the text, without the figures' base64 (which may hold "MIB")
    assert "the circuit is the first prefix that reaches the target." in page and "MIB" not in words
    oldest = json.loads(json.dumps(before))
    del oldest["probes"], oldest["heads"]["planted"]
    for key in OLDEST_GAPS:
        del oldest["patching"][key]
    as_read = json.loads(json.dumps(oldest))
    assert upgraded(oldest) != oldest and oldest == as_read  # upgrading fills a copy, not the caller's dict
    (tmp_path / "analysis.json").write_text(json.dumps(oldest))
    read = read_analysis(tmp_path)
    spearman = before["patching"]["heads_attribution_spearman"]
    assert read["patching"]["heads_attribution_spearman"] == pytest.approx(spearman)
    assert read["patching"]["paths"] is None and read["probes"] is None and read["heads"]["planted"] == {}
    page = _sections(read)
    shown = f"Spearman correlation with exact: {spearman:.2f}" if task != "composite" else "n/a (fewer than 5 heads)"
    assert shown in page and "<h2>Path patching</h2>" not in page


def _sections(analysis):
    from interp.analysis_html import analysis_sections
    from interp.report import Report

    report = Report("an older analysis.json")
    analysis_sections(report, analysis)
    return report.to_html()


@pytest.mark.parametrize("schema, says",
                         [(4, "is analysis.json schema 4, newer than this workbench reads (schema 1 to 3)"),
                                          ("2", "holds schema='2', which is no version of analysis.json (1 to 3)"),
                                          (0, "holds schema=0")])
def test_an_analysis_json_of_a_newer_or_no_schema_is_refused_naming_the_file_and_the_versions(tmp_path, schema, says):
    from interp.analysis_file import SCHEMA, read_analysis
    from models.runs import RunFolderError

    assert SCHEMA == 3  # the messages above name it
    written = {**json.loads((DATA / "analysis-9f7496e-lego.json").read_text()), "schema": schema}
    (tmp_path / "analysis.json").write_text(json.dumps(written))
    with pytest.raises(RunFolderError) as refused:
        read_analysis(tmp_path)
    assert str(refused.value).startswith(f"{tmp_path / 'analysis.json'} {says}")
