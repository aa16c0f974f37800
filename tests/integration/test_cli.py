"""The `workbench` command as a user types it (called in-process through `main`)."""

import json
import re

import pytest

from analyses.cli import main
from models.presets import all_presets
from models.runs import read_metrics
from tests.helpers import folder_bytes

TINY = ["--set", "model.n_layers=2", "--set", "model.planted={}", "--set", "model.d_model=32",
        "--set", "model.d_mlp=64", "--set", "train.steps=12", "--set", "train.batch_size=16",
        "--set", "train.eval_every=6", "--set", "train.eval_size=64", "--set", "train.warmup_steps=2", "--no-progress"]


def test_train_writes_the_run_folder_and_report(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--task", "lego", "--out", str(out), "--report", *TINY, "--set", "model.n_heads=2"]) == 0
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "train_state.safetensors",
                                               "metrics.jsonl", "report.html"}
    assert [m["step"] for m in read_metrics(out)] == [6, 12]
    assert "trained 12 steps" in capsys.readouterr().out


def test_report_is_offline_and_inlines_the_bundle_once(tmp_path):
    out = tmp_path / "run"
    main(["train", "--preset", "composite-cpu", "--out", str(out), "--report", *TINY])
    page = (out / "report.html").read_text()
    assert "unpkg.com" not in page and "cdn.jsdelivr" not in page and "<script src" not in page
    assert page.count("var CircuitsVis") == 1
    assert page.count("CircuitsVis.AttentionHeads") == 2 * 2  # 2 examples x 2 layers
    assert len(re.findall(r"data:image/png;base64,", page)) == 1 + 2  # the curves, each example's heads
    assert (out / "report.html").stat().st_size < 3_000_000


def test_bad_config_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--task", "lego", "--out", str(out), "--set", "task.n_vars=30"]) == 2
    assert not out.exists()
    assert "n_vars=30" in capsys.readouterr().err
    assert main(["train", "--preset", "nope", "--out", str(out)]) == 2
    assert main(["train", "--task", "composite", "--preset", "lego-cpu", "--out", str(out)]) == 2
    assert not out.exists()


def test_existing_run_needs_resume_and_resume_needs_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--task", "lego", "--out", str(out), *TINY]) == 0
    assert main(["train", "--task", "lego", "--out", str(out), *TINY]) == 2
    assert main(["train", "--out", str(tmp_path / "empty"), "--resume"]) == 2
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0  # already finished: nothing to do


def test_divergence_exits_3_and_is_recorded(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--task", "lego", "--out", str(out), *TINY, "--set", "train.lr=1e30",
                 "--set", "train.grad_clip=null", "--set", "train.warmup_steps=0"])
    assert code == 3
    assert "diverged" in capsys.readouterr().err
    assert read_metrics(out)[-1]["diverged"] is True


def test_help_for_every_command(capsys):
    for command in ["train", "demo", "report", "presets", "benchmark"]:
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
    assert "--resume" in capsys.readouterr().out


def test_presets_lists_one_line_each_and_json_on_request(capsys):
    assert main(["presets"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(all_presets())
    assert "lego-cpu           lego       4L d64 4h, 3,000 steps x 128" in "\n".join(lines)
    assert main(["presets", "--json"]) == 0
    blocks = re.split(r"^== .*$", capsys.readouterr().out, flags=re.M)[1:]
    assert len(blocks) == len(all_presets()) and all(json.loads(b)["task"]["name"] for b in blocks)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_and_an_out_that_is_a_file_exit_2_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--task", "lego", "--out", str(out), "--device", "cuda", *TINY]) == 2
    assert not out.exists() and "no CUDA device" in capsys.readouterr().err
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    assert main(["train", "--task", "lego", "--out", str(a_file), *TINY]) == 2
    assert a_file.read_text() == "mine" and "is a file" in capsys.readouterr().err


def test_train_and_demo_never_write_over_or_delete_files_that_are_not_a_runs(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "model.safetensors").write_text("not weights")  # a run file's name, but no config.json
    assert main(["train", "--task", "lego", "--out", str(folder), *TINY]) == 2
    assert (folder / "model.safetensors").read_text() == "not weights"
    (folder / "notes.txt").write_text("keep me")
    assert main(["demo", "--out", str(folder), *TINY]) == 2
    assert {p.name for p in folder.iterdir()} == {"model.safetensors", "notes.txt"}
    assert "not a run's (notes.txt)" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--task", "lego", "--out", "", *TINY]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_demo_replaces_only_a_demo_run(tmp_path, capsys):
    """The demo retrains a folder it recognises as its own run (its demo.json records the config
    the folder holds), and refuses any other run, whatever its task, with exit 2 and nothing
    changed."""
    composite = tmp_path / "composite"
    assert main(["train", "--preset", "composite-cpu", "--out", str(composite), *TINY]) == 0
    lego = tmp_path / "lego"
    # the demo's preset, but not a demo run
    assert main(["train", "--preset", "lego-cpu", "--out", str(lego), *TINY]) == 0
    for run in (composite, lego):
        before = folder_bytes(run)
        capsys.readouterr()
        assert main(["demo", "--out", str(run), *TINY]) == 2
        assert "not a demo run" in capsys.readouterr().err
        assert folder_bytes(run) == before
    demo = tmp_path / "demo"
    few = ["--set", "train.snapshots=2", "--no-learned"]  # a timeline of 3 moments: the folder rules are the point
    assert main(["demo", "--out", str(demo), *TINY, *few]) == 0
    first = (demo / "model.safetensors").read_bytes()
    assert (demo / "timeline.json").exists()
    # its own run: replaced; without snapshots, no timeline, and the report written after the analysis
    assert main(["demo", "--out", str(demo), *TINY, "--set", "train.seed=1", "--set", "train.snapshots=0",
                 "--no-learned"]) == 0
    assert (demo / "model.safetensors").read_bytes() != first
    assert json.loads((demo / "config.json").read_text())["train"]["seed"] == 1
    assert (demo / "report.html").exists() and not (demo / "timeline.json").exists()


@pytest.mark.slow  # the learned model's full LEGO analysis: a minute or two
def test_the_demo_analyses_the_zoos_learned_model_beside_its_own_and_links_the_reports(tmp_path):
    demo = tmp_path / "demo"
    assert main(["demo", "--out", str(demo), *TINY]) == 0
    learned = tmp_path / "demo-learned"  # the zoo's learned three-hop model, analyzed beside it, the reports linked
    assert json.loads((learned / "analysis.json").read_text())["task"] == "lego"
    assert '<a href="../demo-learned/report.html">' in (demo / "report.html").read_text()
    assert '<a href="../demo/report.html">' in (learned / "report.html").read_text()
