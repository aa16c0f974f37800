"""`workbench demo` trains the quick-start preset on a shorter schedule, which --set overrides."""

from analyses.cli.demo import DEMO_SETTINGS, demo_config
from analyses.cli.parser import build_parser
from models.presets import get_preset, quick_start_preset


def test_the_demo_trains_the_quick_start_preset_for_600_steps_with_12_snapshots_unless_set():
    preset = get_preset(quick_start_preset())
    demo = demo_config(build_parser().parse_args(["demo"]))
    assert DEMO_SETTINGS == ["train.steps=600", "train.snapshots=12"]
    assert (demo.train.steps, demo.train.snapshots) == (600, 12)
    assert demo.model == preset.model and demo.task == preset.task and demo.train.lr == preset.train.lr
    chosen = demo_config(build_parser().parse_args(["demo", "--set", "train.steps=40", "--set", "train.seed=3"]))
    assert (chosen.train.steps, chosen.train.snapshots, chosen.train.seed) == (40, 12, 3)
