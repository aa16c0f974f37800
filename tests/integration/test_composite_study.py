"""The composite studies at tiny scale: they train, resume, measure and write their reports."""

import dataclasses
import json

import pytest

from analyses.runners.study import run_study
from analyses.studies.composite import SCALES, aggregate_phase
from tests.helpers import held_out_rates_by_hand


def test_phase_study_writes_the_diagram_and_a_verdict_per_cell(tmp_path):
    results = run_study("composite-phase", tmp_path, "tiny", progress=False)
    table = results["table"]
    grid = SCALES["tiny"].phase_grid
    assert set(table) == {f"{g},{d}" for g in grid["model.init_gamma"] for d in grid["model.n_layers"]}
    for cell in table.values():
        assert cell["verdict"] in ("inferential", "symmetric", "mixed", "unlearned")
        assert 0 <= cell["held_out_inferential"] + cell["held_out_symmetric"] <= 1
    for measures in results["cells"].values():
        assert 0 <= measures["query_condensation"]["share_aligned"] <= 1
        spectrum = measures["embedding_spectrum"]  # the leading shares, largest first
        assert spectrum == sorted(spectrum, reverse=True) and sum(spectrum) <= 1.001
    page = (tmp_path / "report.html").read_text()
    assert "Phase diagram" in page and "data:image/png;base64" in page
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["headline"] == json.loads(json.dumps(results["headline"]))
    _check_table_against_the_cells(results, grid)
    _check_held_out_rates_by_hand(tmp_path / "runs", results["cells"])
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/model.safetensors")}
    run_study("composite-phase", tmp_path, "tiny", progress=False)  # a re-run trains nothing
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/model.safetensors")} == mtimes


def _check_table_against_the_cells(results, grid):
    """Each (gamma, depth) row recomputed from the per-run measures: per seed the run with the
    best seen accuracy (a single lr at tiny scale), then the mean over seeds."""
    for key, row in results["table"].items():
        gamma, depth = key.split(",")
        runs = [m for name, m in results["cells"].items()
                if f"init_gamma={gamma}" in name and f"n_layers={depth}" in name]
        assert row["seeds"] == len(runs) == len(grid.get("train.seed", [0]))
        for field in ("seen_accuracy", "held_out_inferential", "held_out_symmetric"):
            assert row[field] == pytest.approx(sum(m[field] for m in runs) / len(runs), abs=1e-4)
        assert row["init_std"] == pytest.approx(results["base"]["model"]["d_model"] ** -float(gamma), abs=1e-5)


def _check_held_out_rates_by_hand(runs, cells):
    from models.runs import load_run

    for name, measured in cells.items():
        inferential, symmetric = held_out_rates_by_hand(load_run(runs / name), n=200)  # SCALES["tiny"].eval_samples
        assert measured["held_out_inferential"] == pytest.approx(inferential, abs=1e-4)
        assert measured["held_out_symmetric"] == pytest.approx(symmetric, abs=1e-4)


def test_mechanism_study_reports_flow_patching_and_probes_per_layer(tmp_path):
    results = run_study("composite-mechanism", tmp_path, "tiny", progress=False)
    assert set(results["models"]) == {"small_gamma", "large_gamma"}
    for m in results["models"].values():
        assert set(m["patching_key"]) == {"key", "anchor1", "anchor2", "last"}
        assert m["patching_key"]["key"][0] == pytest.approx(1.0)  # layer 0's input at the key is all the key is
        assert m["patching_key"]["anchor1"][0] == pytest.approx(0.0)  # ... and the anchors know nothing of it yet
        assert len(m["attention_flow"]["last->key"]) == 2 and len(m["probes"]["key:key"]) == 3
        assert m["probes"]["key:key"][0] > 0.9  # the key is readable at its own token from the embedding on
    assert "Probes" in (tmp_path / "report.html").read_text()


def test_phase_protocol_keeps_each_seeds_best_learning_rate_and_averages_seeds():
    points = {f"{s}-{lr}": {"train.seed": s, "train.lr": lr, "model.init_gamma": 0.5, "model.n_layers": 2}
              for s in (0, 1) for lr in (1, 2)}
    measured = {
        "0-1": {"seen_accuracy": 0.5, "held_out_inferential": 0.0, "held_out_symmetric": 0.0, "verdict": "unlearned"},
        "0-2": {"seen_accuracy": 1.0, "held_out_inferential": 0.8, "held_out_symmetric": 0.1, "verdict": "inferential"},
        "1-1": {"seen_accuracy": 0.96, "held_out_inferential": 0.6, "held_out_symmetric": 0.3,
                "verdict": "inferential"},
        "1-2": {"seen_accuracy": 0.92, "held_out_inferential": 0.0, "held_out_symmetric": 1.0, "verdict": "symmetric"},
    }
    cell = aggregate_phase(points, measured, d_model=400)["0.5,2"]
    assert cell["seeds"] == 2 and cell["seed_verdicts"] == ["inferential", "inferential"]
    assert cell["seen_accuracy"] == pytest.approx(0.98) and cell["held_out_inferential"] == pytest.approx(0.7)
    assert cell["verdict"] == "inferential"
    # per mapping, the best learned run of each seed: seed 0 (0.8, 0.1), seed 1 (0.6, 1.0)
    assert cell["best_inferential"] == pytest.approx(0.7) and cell["best_symmetric"] == pytest.approx(0.55)
    assert cell["init_std"] == pytest.approx(0.05)  # 400^-0.5


def test_a_study_with_set_trains_every_cell_post_ln_and_refuses_where_it_cannot(tmp_path):
    from models.runs import read_config
    from tasks import ConfigError

    results = run_study("composite-mechanism", tmp_path, "tiny", progress=False, overrides=["model.norm_position=post"])
    assert results["models"]
    configs = [read_config(d) for d in (tmp_path / "runs").iterdir() if (d / "config.json").exists()]
    assert configs and all(c.model.norm_position == "post" for c in configs)
    with pytest.raises(ConfigError, match="does not take --set"):
        run_study("lego-extrapolation", tmp_path / "x", "tiny", overrides=["model.norm_position=post"])
    with pytest.raises(ConfigError, match="with --out"):
        run_study("composite-phase", None, "tiny", overrides=["model.norm_position=post"])
    with pytest.raises(ConfigError, match="norm_position='middle'"):
        run_study("composite-phase", tmp_path / "y", "tiny", overrides=["model.norm_position=middle"])


def test_a_sweeps_index_gives_the_phase_protocols_table():
    from analyses.studies.composite import sweep_phase_table

    def cell(seed, lr, seen, inferential, symmetric, status="done"):
        return {"point": {"train.seed": seed, "train.lr": lr}, "status": status,
                "final": {"acc_seen": seen, "held_out_inferential": inferential, "held_out_symmetric": symmetric}}

    index = {"base": {"model": {"n_layers": 2, "init_gamma": 0.7, "d_model": 128}},
             "cells": {"a": cell(0, 1, 1.0, 0.9, 0.0), "b": cell(0, 2, 0.5, 0.0, 0.0),
                       "c": cell(1, 1, 0.95, 0.1, 0.8), "d": cell(1, 2, 0.0, 0.0, 0.0, status="failed")}}
    table = sweep_phase_table(index)
    assert list(table) == ["0.7,2"]
    row = table["0.7,2"]
    assert row["seeds"] == 2 and row["seed_verdicts"] == ["inferential", "symmetric"]
    assert row["held_out_inferential"] == pytest.approx(0.5) and row["init_std"] == pytest.approx(128 ** -0.7, abs=1e-5)


def test_gammas_pick_the_mechanism_studys_pair_and_other_studies_refuse_them(tmp_path, capsys):
    from analyses.cli import main
    from models.runs import read_config

    results = run_study("composite-mechanism", tmp_path, "tiny", progress=False, gammas=(0.5, 0.8),
                        overrides=["model.norm_position=post"])
    assert results["gammas"] == {"small_gamma": 0.5, "large_gamma": 0.8}
    trained = {d.name: read_config(d).model for d in (tmp_path / "runs").iterdir() if d.is_dir()}
    assert {name: (m.init_gamma, m.n_layers, m.norm_position) for name, m in trained.items()} == {
        "small_gamma": (0.5, 2, "post"), "large_gamma": (0.8, 2, "post")}  # --set no longer undoes the pair
    assert "--gammas 0.5,0.8" in (tmp_path / "report.html").read_text()
    for argv, says in [(["composite-phase", "--gammas", "0.5,0.8"], "does not take --gammas"),
                       (["composite-mechanism", "--gammas", "0.8,0.5"], "0 < SMALL < LARGE"),
                       (["composite-mechanism", "--gammas", "0.5"], "0 < SMALL < LARGE"),
                       (["composite-mechanism", "--gammas", "0.5,nan"], "0 < SMALL < LARGE")]:
        out = tmp_path / "refused"
        assert main(["study", *argv, "--scale", "tiny", "--out", str(out)]) == 2
        assert says in capsys.readouterr().err and not out.exists()


def test_protocol_matched_trains_the_matched_blocks_in_a_folder_of_its_own(tmp_path, capsys, monkeypatch):
    from analyses.cli import main
    from models.runs import read_config

    monkeypatch.chdir(tmp_path)  # the default folder is relative: runs/studies/<name>-<scale>-matched
    assert main(["study", "composite-mechanism", "--scale", "tiny", "--protocol", "matched", "--seeds", "0,1",
                 "--no-progress"]) == 0
    folder = tmp_path / "runs/studies/composite-mechanism-tiny-matched"
    trained = {d.name: read_config(d) for d in (folder / "runs").iterdir() if d.is_dir()}
    assert {name: (c.model.init_gamma, c.train.seed) for name, c in trained.items()} == {
        "small_gamma": (0.5, 0), "large_gamma": (0.9, 0), "small_gamma-s1": (0.5, 1), "large_gamma-s1": (0.9, 1)}
    assert all((c.model.biases, c.model.act_fn, c.task.key_modulus, c.train.lr) == (False, "relu", 9, 1e-4)
               for c in trained.values())
    assert "--protocol matched" in (folder / "report.html").read_text()
    assert sorted(json.loads((folder / "results.json").read_text())["models"]) == sorted(trained)
    # the default protocol, named, is the same study as unnamed: same folder, same cells
    assert main(["study", "composite-mechanism", "--scale", "tiny", "--protocol", "fast", "--no-progress"]) == 0
    fast = tmp_path / "runs/studies/composite-mechanism-tiny"
    assert all(read_config(d).model.biases for d in (fast / "runs").iterdir() if d.is_dir())
    assert "--protocol" not in (fast / "report.html").read_text()
    capsys.readouterr()
    refused = [(["lego-heads", "--protocol", "matched"], "does not take --protocol"),
               (["composite-phase", "--protocol", "slow"], "use one of ('fast', 'matched')"),
               (["composite-phase", "--scale", "gpu", "--protocol", "matched"], "declared at scales ('tiny', 'cpu')")]
    for argv, says in refused:
        assert main(["study", *argv, "--out", str(tmp_path / "refused")]) == 2
        assert says in capsys.readouterr().err and not (tmp_path / "refused").exists()


def test_seeds_give_the_mechanism_study_a_pair_per_seed():
    from analyses.studies.composite_mechanism import contrast_cells

    cells = contrast_cells("tiny", gammas=(0.5, 0.9), protocol="matched", seeds=(0, 2))
    assert {name: (c.model.init_gamma, c.train.seed, c.model.n_layers) for name, c in cells.items()} == {
        "small_gamma": (0.5, 0, 2), "large_gamma": (0.9, 0, 2),  # seed 0 keeps the names older folders use
        "small_gamma-s2": (0.5, 2, 2), "large_gamma-s2": (0.9, 2, 2)}


def test_the_matched_cpu_protocol_is_the_preset_its_phase_diagram_was_trained_with():
    """The phase diagram in analyses/RESULTS.md was trained by `workbench sweep` with these
    settings spelled out; the study's cells must be the same runs."""
    from analyses.studies.composite_cells import MATCHED, base_config
    from models.presets import get_preset

    spelled_out = get_preset("composite-cpu").with_overrides([
        "model.biases=false", "model.act_fn=relu", "task.key_modulus=9", "model.norm_position=pre", "train.lr=1e-4",
        "train.steps=30000", "train.eval_every=200", "train.checkpoint_every=1000", "train.plateau_evals=10",
        "train.plateau_min_steps=5000", 'train.plateau_watch=["held_out_inferential","held_out_symmetric"]',
        "train.plateau_watch_tol=0.03", "model.init_gamma=0.9"])
    assert get_preset("composite-matched") == spelled_out
    cpu = base_config("cpu", (), "matched")
    assert cpu.model == spelled_out.model and cpu.task == spelled_out.task
    assert cpu.train.precision == "fp32"  # as every recorded run, also where the CPU has bf16 kernels
    assert dataclasses.replace(cpu.train, compile=False) == spelled_out.train
    assert MATCHED["cpu"].phase_grid["model.init_gamma"] == [0.5, 0.7, 0.9, 1.0]


def test_measure_reads_a_sweeps_cells_like_the_phase_study(tmp_path, capsys):
    """`python -m analyses.studies.composite SWEEP --measure` gives each cell the phase study's
    measure (composite_verdict on fresh test-key sequences), not the run's last evaluation."""
    import json

    from analyses.runners.sweep import run_sweep
    from analyses.studies.composite import main
    from interp.tasks.composite import composite_verdict
    from models.runs import load_run
    from tests.helpers import tiny_composite_run

    run_sweep(tiny_composite_run(steps=10), {"train.seed": [0, 1]}, tmp_path, workers=1, progress=False)
    assert main([str(tmp_path), "--measure"]) == 0
    row = json.loads(capsys.readouterr().out.strip())
    runs = [load_run(tmp_path / f"seed={s}") for s in (0, 1)]
    verdicts = [composite_verdict(run.model, run.task, n=2000) for run in runs]
    assert row["seeds"] == 2 and row["seed_verdicts"] == [v.verdict for v in verdicts]
    assert row["seen_accuracy"] == pytest.approx(sum(v.seen_accuracy for v in verdicts) / 2, abs=1e-4)


def test_cells_reads_a_plain_folder_of_runs_and_marks_the_unfinished(tmp_path, capsys, monkeypatch):
    """`--cells` on a folder of run folders that no sweep wrote (analyses/gpu/composite_paper.sh's):
    one row per run, and a run killed before its budget is "unfinished", measured at its last
    checkpoint (step 10, though it was evaluated at 15), not reported as stopped by the budget."""
    from analyses.studies.composite import main
    from interp.tasks.composite import composite_verdict
    from models.runs import load_run
    from models.train import Trainer
    from tests.helpers import Killed, tiny_composite_run

    Trainer(tiny_composite_run(steps=10), tmp_path / "done", progress=False).fit()
    killed = Trainer(tiny_composite_run(steps=20, seed=1), tmp_path / "killed", progress=False)
    original = killed._next_batch
    monkeypatch.setattr(killed, "_next_batch",
                        lambda: (_ for _ in ()).throw(Killed) if killed.step == 17 else original())
    with pytest.raises(Killed):
        killed.fit()
    (tmp_path / "notes").mkdir()  # not a run folder: skipped
    assert main([str(tmp_path), "--cells", "--n", "200"]) == 0
    rows = {row["cell"]: row for row in map(json.loads, capsys.readouterr().out.strip().splitlines())}
    assert sorted(rows) == ["done", "killed"]
    assert (rows["done"]["steps"], rows["done"]["of_steps"], rows["done"]["stopped"]) == (10, 10, "budget")
    assert (rows["killed"]["steps"], rows["killed"]["of_steps"], rows["killed"]["stopped"]) == (10, 20, "unfinished")
    verdict = composite_verdict(load_run(tmp_path / "killed").model, load_run(tmp_path / "killed").task, n=200)
    assert rows["killed"]["held_out_symmetric"] == verdict.to_dict()["held_out_symmetric"]
    other = rows["killed"]["held_out_other_answers"]  # an untrained model answers neither solution
    assert other
    assert sum(row["share"] for row in other) <= 1 - verdict.held_out_inferential - verdict.held_out_symmetric + .05


def test_cells_refuses_a_folder_with_no_runs(tmp_path, capsys):
    from analyses.studies.composite import main

    assert main([str(tmp_path), "--cells"]) == 2
    assert "no run folder" in capsys.readouterr().err


def test_mechanism_by_key_position_lines_up_the_pair_where_asked(tmp_path, capsys):
    """`--cells --mechanism`: per run, the held-out answers, attention flow and residual patching
    with the key at positions 2 and 6. With the key at 6 the pair ends the sequence, so anchor 2
    is the last token: the two sites read the same residual, and patching there agrees."""
    from analyses.studies.composite import main
    from analyses.studies.composite_mechanism import mechanism_by_key_position
    from models.runs import load_run
    from models.train import Trainer
    from tests.helpers import tiny_composite_run

    Trainer(tiny_composite_run(steps=10), tmp_path / "run", progress=False).fit()
    measured = mechanism_by_key_position(load_run(tmp_path / "run"), n=64)
    assert sorted(measured) == [2, 6]
    at_end = measured[6]
    assert at_end["attention"]["last->key"] == at_end["attention"]["anchor2->key"]
    assert at_end["patching_key"]["last"] == at_end["patching_key"]["anchor2"]
    # before the first block only the corrupted token's own residual restores the answer
    assert [at_end["patching_key"][site][0] for site in ("key", "anchor1", "anchor2")] == [1.0, 0.0, 0.0]
    assert 0 <= at_end["held_out_inferential"] + at_end["held_out_symmetric"] <= 1
    assert at_end["order_swapped"]["last"] == at_end["order_swapped"]["anchor2"]
    assert all(len(v) == 2 for v in at_end["pair_route_at_last"].values())  # one share per layer
    with pytest.raises(ValueError, match="outside 0..6"):
        mechanism_by_key_position(load_run(tmp_path / "run"), key_positions=(7,))
    with pytest.raises(SystemExit) as refused:
        main([str(tmp_path), "--mechanism"])  # without --cells
    assert refused.value.code == 2 and "add --cells" in capsys.readouterr().err
    assert main([str(tmp_path), "--cells", "--mechanism", "--n", "64"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["by_key_position"]["6"]["patching_key"] == {k: v for k, v in at_end["patching_key"].items()}
    assert row["cell"] == "run" and set(row["by_key_position"]) == {"2", "6"}


def test_cells_complexity_prints_the_phase_studys_vectors_and_condensation_per_run(tmp_path, capsys):
    """`--cells --complexity` on a plain folder of runs: per run the verdict, the last-token
    cosines, the first-layer W_Q condensation and the embedding spectrum, as the phase study's
    report, and the step of the weights read."""
    from analyses.studies.composite import main
    from interp.complexity import query_condensation
    from models.runs import load_run
    from models.train import Trainer
    from tests.helpers import tiny_composite_run

    Trainer(tiny_composite_run(steps=10), tmp_path / "run", progress=False).fit()
    assert main([str(tmp_path), "--cells", "--complexity", "--n", "64"]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    row = json.loads(line)
    run = load_run(tmp_path / "run")
    condensation = query_condensation(run.model, 0)
    assert (row["cell"], row["step"], row["d_model"]) == ("run", 10, run.config.model.d_model)
    assert row["wq_share_aligned"] == round(condensation.share_aligned, 4)
    assert row["wq_mean_abs_cosine"] == round(condensation.mean_abs_cosine, 4)
    assert -1 <= row["cosine_different_target"] <= 1 and -1 <= row["cosine_same_target"] <= 1
    assert 0 < row["embedding_top1"] <= row["embedding_top3"] <= 1
    assert row["verdict"] in ("inferential", "symmetric", "mixed", "unlearned")
    for argv in (["--complexity"], ["--cells", "--mechanism", "--complexity"]):
        with pytest.raises(SystemExit) as refused:
            main([str(tmp_path), *argv])
        assert refused.value.code == 2
