"""`workbench circuit-export`, `workbench circuit-compare` and `workbench analyze --bootstrap` on the
zoo's smallest run, as a user types them."""

import json
import shutil
from pathlib import Path

from analyses.cli import main
from interp.analysis import patching_analysis
from interp.mib import MIB_PERCENTAGES, mib_circuit, mib_file, read_mib, write_mib
from models.runs import load_run

ROOT = Path(__file__).resolve().parents[2]
COMPOSITE = ROOT / "zoo" / "composite-inferential"  # 2 layers of 1 head: its circuit takes a second


def test_export_writes_the_circuit_analyze_finds_and_compare_reads_it_back(tmp_path, capsys):
    out = tmp_path / "mib"
    assert main(["circuit-export", str(COMPOSITE), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(["circuit.json", *(f"edges-{100 * p:g}pct.json"
                                                                              for p in MIB_PERCENTAGES)])
    data = read_mib(out / "circuit.json")
    assert "wrote" in capsys.readouterr().out and data["meta"]["run"] == str(COMPOSITE)
    analysed = patching_analysis(load_run(COMPOSITE)).circuit  # what `workbench analyze` writes
    found = mib_circuit(data)
    assert sorted(found["heads"]) == sorted(analysed.nodes)
    assert [(s, r, round(v, 4)) for s, r, v in found["edges"]] == analysed.edges
    assert data["meta"]["faithfulness"] == analysed.faithfulness
    budget = read_mib(out / "edges-100pct.json")
    assert all(edge["in_graph"] for edge in budget["edges"].values())  # 100%: every edge

    report = tmp_path / "same.json"
    assert main(["circuit-compare", str(COMPOSITE), str(out), "--out", str(report)]) == 0
    same = json.loads(report.read_text())
    assert same["circuit"]["heads"]["jaccard"] == same["circuit"]["edges"]["jaccard"] == 1.0
    assert all(t["edges"]["jaccard"] in (1.0, None) for t in same["thresholds"])
    assert same["edge_score_spearman"] == 1.0
    lego_shaped = write_mib(tmp_path / "lego.json", mib_file({"n_layers": 4, "n_heads": 4, "parallel_attn_mlp": False,
                                                              "d_model": 64}, ["L3H1"], None, {}, None))
    assert main(["circuit-compare", str(out / "circuit.json"), str(lego_shaped)]) == 2
    assert "different shapes" in capsys.readouterr().err
    assert main(["circuit-compare", str(out / "circuit.json"), str(tmp_path)]) == 2  # neither run nor circuit

    heads_only = tmp_path / "heads"
    assert main(["circuit-export", str(COMPOSITE), "--out", str(heads_only), "--no-edges"]) == 0
    assert [p.name for p in heads_only.iterdir()] == ["circuit.json"]  # no scores: no edge budgets
    data = read_mib(heads_only / "circuit.json")
    assert not data["meta"]["edges_scored"] and sorted(mib_circuit(data)["heads"]) == sorted(analysed.nodes)
    assert all(edge["score"] == 0.0 for edge in data["edges"].values())


def test_analyze_bootstrap_stores_the_spread_and_the_report_shows_the_stable_core(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(COMPOSITE, run)
    assert main(["analyze", str(run), "--bootstrap", "1"]) == 2
    assert "2 or more" in capsys.readouterr().err
    assert main(["analyze", str(run), "--samples", "64", "--bootstrap", "3"]) == 0
    circuit = json.loads((run / "analysis.json").read_text())["patching"]["paths"]["circuit"]
    spread = circuit["bootstrap"]
    n_pairs = json.loads((run / "analysis.json").read_text())["patching"]["n_pairs"]
    assert spread["resamples"] == 3 and spread["pairs"] == n_pairs and spread["edges"]
    assert set(spread["node_share"]) == {"L0H0", "L1H0"} and len(spread["samples"]["faithfulness"]) == 3
    assert set(spread["stable"]["nodes"]) <= set(spread["node_share"])
    page = (run / "report.html").read_text()
    assert "Stable core" in page and f"resamples of the {n_pairs} pairs" in page


def _unmeasured(monkeypatch):
    """Measuring a circuit fails the test: a bad --out is refused before it."""
    import interp.circuit_compare

    def measure(*args, **kwargs):
        raise AssertionError("the circuit was measured before --out was checked")

    monkeypatch.setattr(interp.circuit_compare, "measure_run_circuit", measure)


def test_compare_writes_into_a_new_folder_and_refuses_a_folder_as_its_file(tmp_path, capsys, monkeypatch):
    cfg = {"n_layers": 2, "n_heads": 1, "parallel_attn_mlp": False, "d_model": 8}
    circuit = write_mib(tmp_path / "circuit.json", mib_file(cfg, ["L1H0"], [], {}, None))
    out = tmp_path / "new" / "folder" / "comparison.json"
    assert main(["circuit-compare", str(circuit), str(circuit), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["a"] == str(circuit)
    _unmeasured(monkeypatch)
    capsys.readouterr()
    assert main(["circuit-compare", str(COMPOSITE), str(circuit), "--out", str(tmp_path / "new")]) == 2
    assert "--out" in capsys.readouterr().err
