"""Every LEGO experiment runs end to end at the tiny scale (models share one pool, so each is
trained once) and writes its report and numbers."""

import json
import os
from pathlib import Path

import pytest

from analyses.cli import main
from analyses.runners.study import StudyContext, all_studies, run_study
from analyses.studies.lego import STUDIES
from analyses.studies.lego_pool import TINY_CURRICULUM, plan, supervised_mask, variant
from models.runs import read_config

LEGO = [study.name for study in STUDIES]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("studies")


@pytest.mark.parametrize("name", LEGO)
def test_each_lego_study_writes_a_report_and_its_numbers(root, name):
    results = run_study(name, root / name, "tiny", progress=False)
    stored = json.loads((root / name / "results.json").read_text())
    assert stored["study"] == name and stored["headline"] == json.loads(json.dumps(results["headline"]))
    page = (root / name / "report.html").read_text()
    assert "<img" in page and f"workbench study {name} --scale tiny" in page


def test_the_models_are_shared_between_studies_and_match_their_names(root):
    run_study("lego-extrapolation", root / "a", "tiny", progress=False)
    pool = root / "lego-runs-tiny"
    assert read_config(pool / "albert-s0").model.tie_layers and not read_config(pool / "bert-s0").model.tie_layers
    assert read_config(pool / "albert-L3-s0").model.n_layers == 3  # the deeper pair
    before = (pool / "bert-L3-s0" / "metrics.jsonl").stat().st_mtime_ns
    run_study("lego-percolation", root / "b", "tiny", progress=False)  # reuses bert-L3-s0, albert-L3-s0
    assert (pool / "bert-L3-s0" / "metrics.jsonl").stat().st_mtime_ns == before


def test_bert_and_albert_are_learned_by_the_scales_curriculum_each_stage_from_the_last(root):
    run_study("lego-extrapolation", root / "a", "tiny", progress=False)
    pool, stages = root / "lego-runs-tiny", TINY_CURRICULUM.stages
    for name in ("bert-s0", "albert-s0", "albert-L3-s0"):
        first, last = read_config(pool / "stages" / f"{name}-{stages[0].name}"), read_config(pool / name)
        assert first.train.init_from is None
        assert last.train.init_from == str(pool / "stages" / f"{name}-{stages[0].name}")
        assert first.model.planted == last.model.planted == {} and first.heads_origin == "learned"
        assert last.heads_origin == "warm-started"  # from the learned first stage: learned too
        assert (first.task.n_vars, first.task.n_supervised, last.task.n_vars, last.task.n_supervised) == (4, 2, 5, 3)
        assert first.model.tie_layers == last.model.tie_layers == name.startswith("albert")
        assert first.model.n_layers == last.model.n_layers == (3 if "L3" in name else 2)
        assert json.loads((pool / name / "init.json").read_text())  # where its starting weights came from
    planned = plan(StudyContext(out=root / "a", scale="cpu"), "albert-sd", 1)[1]
    assert [c.task.n_vars for c in planned] == [6, 6, 8] and all(c.model.min_depth == 2 and c.train.seed == 1
                                                                  and c.model.tie_layers for c in planned)
    lastsup = plan(StudyContext(out=root / "a", scale="cpu"), "bert", 0, None, "lastsup", group="z2",
                   supervision="first+last", n_supervised=4)[1]
    assert supervised_mask(lastsup[-1]) == [True] * 4 + [False] * 3 + [True]
    assert all(c.task.supervision == "first" for c in lastsup[:-1])  # the earlier stages keep the curriculum's
    bert = plan(StudyContext(out=root / "a", scale="cpu"), "bert", 0)[1]  # a last-stage change shares the trunk
    assert lastsup[:-1] == bert[:-1] and lastsup[-1].train.init_from == bert[-1].train.init_from
    s3 = plan(StudyContext(out=root / "a", scale="cpu"), "bert", 0, None, "s3", group="s3")[1]
    assert "bert-s3-s0-" in s3[1].train.init_from and all(c.task.group == "s3" for c in s3)  # its own trunk
    # the pool named by another path (relative vs absolute) is the same pool: nothing retrains
    again = run_study("lego-extrapolation", Path(os.path.relpath(root / "a")), "tiny", progress=False)
    assert set(again["final_acc"]) >= {"bert-s0", "albert-s0"}


def test_variants_differ_only_where_they_say():
    bert, albert, sd = (variant("cpu", kind) for kind in ("bert", "albert", "albert-sd"))
    assert albert.model.tie_layers and not bert.model.tie_layers and sd.model.min_depth == 2
    deep = variant("cpu", "albert-sd", layers=6)
    assert deep.model.n_layers == 6 and deep.model.min_depth == 3 and len(deep.model.planted) == 5
    assert variant("cpu", "standard").model.planted == {} and variant("cpu", "mimic").train.mimic_steps > 0
    assert variant("cpu", "hardcoded").model.planted == {"*.0": "association", "*.1": "manipulation",
                                                         "*.2": "broadcast"}
    last = variant("cpu", "bert", supervision="first+last", n_supervised=2)
    assert supervised_mask(last) == [True, True, False, False, False, True]
    assert variant("paper", "albert").model.n_layers == 12 and variant("paper", "bert").task.n_vars == 12


def test_cli_lists_the_studies_and_rejects_unknown_ones(capsys):
    assert main(["study", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in LEGO) and set(LEGO) <= set(all_studies())
    assert main(["study", "lego-nonsense", "--scale", "tiny"]) == 2
    assert main(["study", "lego-heads", "--scale", "huge"]) == 2


def test_seeds_option_trains_every_seed_and_averages_them(root, capsys):
    out = root / "seeded"
    assert main(["study", "lego-extrapolation", "--scale", "tiny", "--seeds", "0,1", "--out", str(out),
                 "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    pool = root / "lego-runs-tiny"
    assert {"bert-s1", "albert-L3-s1"} <= set(results["final_acc"])
    assert (pool / "bert-s1" / "model.safetensors").exists()
    assert read_config(pool / "bert-s1").train.seed == 1
    rules = results["parity_rules"]["albert-L3-s1"]  # what each model computes, variable by variable
    assert len(rules) == read_config(pool / "albert-L3-s1").task.n_vars
    assert all(0.5 <= r["agreement"] <= 1 for r in rules)
    assert set(results["headline"]["unsupervised_rules"]) == set(results["final_acc"])
    for name, acc in results["final_acc"].items():  # read back from each run's own metrics, by hand
        records = [json.loads(line) for line in (pool / name / "metrics.jsonl").read_text().splitlines()]
        evaluated = [r for r in records if "acc_per_var" in r]
        assert acc == evaluated[-1]["acc_per_var"]
        first = [next((r["step"] for r in evaluated if r["acc_per_var"][i] >= 0.95), None) for i in range(len(acc))]
        assert results["learned_step"][name] == first
    rows = [results["final_acc"][name] for name in ("bert-s0", "bert-s1")]
    mean = [round((a + b) / 2, 4) for a, b in zip(*rows)]
    assert results["headline"]["bert_mean_acc_per_var"] == pytest.approx(mean, abs=1e-4)
    with pytest.raises(SystemExit, match="2"):  # argparse rejects it with a usage message
        main(["study", "lego-mimic", "--scale", "tiny", "--seeds", "1,x"])
    assert "not a comma-separated list of integers" in capsys.readouterr().err
    with pytest.raises(Exception, match="distinct"):
        run_study("lego-mimic", root / "m", "tiny", seeds=[1, 1])
