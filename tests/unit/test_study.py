"""The study scaffold: cells named in one place, one writer of report.html and results.json."""

import json
from pathlib import Path

import pytest

from analyses.runners.study import Cell, StudyContext, cell_names, default_out


def test_a_cell_is_named_by_kind_tags_and_seed_and_grouped_without_the_seed():
    cell = Cell("albert", 3, ("s3", "L6"))
    assert cell.name == "albert-s3-L6-s3" and cell.group == "albert-s3-L6"
    assert Cell("bert").name == "bert-s0" and Cell("plain", None, ("d64", "n16")).name == "plain-d64-n16"
    assert Cell("bert", 0) == Cell("bert") and len({Cell("bert", 0), Cell("bert", 1)}) == 2


def test_cells_that_would_share_a_folder_are_refused():
    assert cell_names({Cell("bert", 0): 1, "other": 2}) == {"bert-s0": 1, "other": 2}
    with pytest.raises(ValueError, match="share a name"):
        cell_names({Cell("bert", 0): 1, "bert-s0": 2})


def test_finish_writes_the_report_and_results_with_the_command_that_remakes_them(tmp_path):
    ctx = StudyContext(out=tmp_path, study="lego-heads", scale="tiny", seeds=(0, 2), overrides=("model.n_layers=3",))
    results = ctx.finish("A <title>", [("Section <b>", "<p>body</p>")], {"headline": {"x": 1.5}})
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored == results and stored["study"] == "lego-heads" and stored["scale"] == "tiny"
    assert stored["headline"] == {"x": 1.5} and Path(stored["report"]) == tmp_path / "report.html"
    page = (tmp_path / "report.html").read_text()
    assert f"workbench study lego-heads --scale tiny --out {tmp_path} --seeds 0,2 --set model.n_layers=3" in page
    assert "Section &lt;b&gt;" in page and "<p>body</p>" in page
    here = StudyContext(out=default_out("lego-heads", "cpu"), study="lego-heads")
    assert here.command() == "workbench study lego-heads --scale cpu"


def test_every_study_module_declares_every_scale_once_with_its_own_parameter_type():
    """One declaration style for the scales: each study module's SCALES names the same scales, in
    order, and each scale's parameters are an instance of the module's frozen dataclass."""
    import dataclasses
    import importlib
    import pkgutil

    import analyses.studies as package
    from analyses.runners.study import SCALES, Scales

    modules = [importlib.import_module(f"analyses.studies.{m.name}") for m in pkgutil.iter_modules(package.__path__)]
    with_studies = {m.__name__.rsplit(".", 1)[-1]: m for m in modules if getattr(m, "STUDIES", None)}
    assert set(with_studies) == {"composite", "lego", "templates"}
    for name, module in with_studies.items():
        declared = module.SCALES
        assert isinstance(declared, Scales), name
        assert declared.names() == SCALES, name
        assert dataclasses.is_dataclass(declared.params) and declared.params.__dataclass_params__.frozen, name
        for scale in SCALES:
            assert type(declared[scale]) is declared.params, (name, scale)


def test_a_scale_table_must_name_every_scale_with_one_frozen_type():
    from dataclasses import dataclass

    from analyses.runners.study import Scales
    from tasks import ConfigError

    @dataclass(frozen=True)
    class Steps:
        steps: int

    @dataclass
    class Loose:
        steps: int

    table = Scales(Steps, tiny=Steps(1), cpu=Steps(2), gpu=Steps(3), paper=Steps(4))
    assert table["gpu"].steps == 3
    with pytest.raises(ConfigError, match="scale 'huge' is unknown"):
        table["huge"]
    with pytest.raises(ValueError, match="declare \\('tiny', 'cpu', 'gpu', 'paper'\\)"):
        Scales(Steps, tiny=Steps(1), cpu=Steps(2), gpu=Steps(3))
    with pytest.raises(TypeError, match="are not Steps"):
        Scales(Steps, tiny=Steps(1), cpu=Steps(2), gpu=Steps(3), paper=Loose(4))
    with pytest.raises(TypeError, match="frozen dataclass"):
        Scales(Loose, tiny=Loose(1), cpu=Loose(2), gpu=Loose(3), paper=Loose(4))
