"""The zoo: small trained run folders committed in `zoo/`, so that tests, notebooks and examples
look at real trained models in seconds. Each entry is a preset plus overrides, rebuilt by
`workbench zoo build NAME` (one torch thread, so a rebuild gives the committed weights on a CPU
of the same kind; the trainer is deterministic on CPU). A zoo folder keeps `config.json`,
`model.safetensors`, `metrics.jsonl` (and `mimic.json`), not the train state.

Every entry says how its heads came to be, because that decides what an analysis of it shows:
- planted: some heads' attention patterns are hardcoded; the classifier finds what we put in;
- mimicked: heads pre-trained to imitate association/conv patterns on random tokens, then
  trained on the task (the LEGO paper's mimicking);
- learned: nothing planted or mimicked; whatever the heads do, training found.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import interp.tasks  # noqa: F401 (registers each task's presets and curricula)
from models.config import RunConfig
from models.curriculum import get_curriculum, train_curriculum
from models.presets import get_preset
from models.runs import (
    CONFIG,
    INIT,
    METRICS,
    MIMIC,
    WEIGHTS,
    RunFolderError,
    WeightsStamp,
    read_config,
    save_weights,
    verified_weights,
    weights_digest,
)
from tasks import ConfigError

ZOO_DIR = Path(__file__).resolve().parents[1] / "zoo"
KEPT_FILES = (CONFIG, WEIGHTS, METRICS, MIMIC, INIT)
MAX_WEIGHT_BYTES = 2_000_000  # a committed weights file; larger fp32 weights are kept in float16 (`_fit_weights`)


STAGES_DIR = Path("runs/zoo-stages")  # a curriculum entry's earlier stages (not committed), under the repository


@dataclass(frozen=True)
class ZooEntry:
    name: str
    preset: str
    overrides: tuple[str, ...]
    about: str
    # trained by this curriculum (a task declares it: `workbench curriculum --list`), `overrides`
    # applying to every stage; the zoo keeps the last stage. Its train.init_from names where the
    # stage before it was trained,
    # which is not part of the recipe, so `status` leaves it out of the comparison.
    curriculum: str | None = None

    def config(self) -> RunConfig:
        if self.curriculum is None:
            return get_preset(self.preset).with_overrides(list(self.overrides))
        course = get_curriculum(self.curriculum)
        return course.configs(course.folders(STAGES_DIR / self.name), self.overrides)[-1]

    @property
    def origin(self) -> str:
        """learned, mimicked or planted: read from the config (RunConfig.heads_origin)."""
        return self.config().heads_origin

    def command(self) -> str:
        return f"workbench zoo build {self.name}"

    def recipe(self, cfg: RunConfig) -> dict:
        """What `status` compares: the config, without train.device (where it was built) and, for
        a curriculum's stage, train.init_from."""
        data = cfg.to_dict()
        data["train"] = {**data["train"], "device": None}
        if self.curriculum is not None:
            data["train"] = {**data["train"], "init_from": None}
        return data


ENTRIES = [
    ZooEntry("lego-planted", "lego-cpu", (),
             "the demo's model: one planted association head in each of layers 1-3; fits #0-#2"),
    ZooEntry("lego-mimic", "lego-cpu", ("model.planted={}", "train.mimic_steps=300", "train.seed=1"),
             "no planted heads; 300 steps of mimicking pre-training, then the lego-cpu recipe (seed 1): a "
             "mimicked association head (L0H1), learned manipulation heads, and the #2 plateau (#2 at chance, "
             "zero-hop rule x0 + g0 + gk)"),
    ZooEntry("lego-mimic-long", "lego-cpu",
             ("model.planted={}", "train.mimic_steps=1500", "train.eval_size=1000"),
             "no planted heads; 1,500 steps of mimicking pre-training, then the lego-cpu recipe (seed 0): "
             "passes the #2 plateau (mimicking for 1,500 steps does so with two seeds of four)"),
    ZooEntry("lego-six-letters", "lego-cpu",
             ("model.planted={}", "task.n_letters=6", "train.steps=10000", "train.eval_every=500",
              "train.checkpoint_every=500", "train.eval_size=1000"),
             "no planted heads, no mimicking: variables named from six letters, 10,000 steps (about 50 minutes "
             "on one thread): a learned, partial hop. #2 = 0.68, right whenever the parent is the letter d "
             "(the hop learned for one letter of six; python -m analyses.research.plateau --breakdown). Seed 0; seed "
             "1 of the same recipe learns no letter"),
    ZooEntry("lego-association", "lego-cpu",
             ("model.planted={}", "task.n_letters=6", "train.batch_size=512", "train.steps=2500",
              "train.eval_every=250", "train.checkpoint_every=250", "train.eval_size=1000", "train.seed=1"),
             "no planted or mimicked heads: six letters at batch 512, 2,500 steps (about 30 minutes on one "
             "thread): the hop learned for every letter (#2 = 1.00 from step 2,000, seed 1); the classifier "
             "labels L2H3 association and L1H2 manipulation, and exact patching of the hop runs through "
             "L1H3, L3H2 and L2H3"),
    ZooEntry("lego-three-hops-n6", "lego-cpu",
             ("model.planted={}", "task.n_letters=6", "task.n_supervised=5", "train.init_from=zoo/lego-association",
              "train.batch_size=512", "train.steps=3000", "train.warmup_steps=100", "train.eval_every=250",
              "train.checkpoint_every=250", "train.eval_size=1000", "train.compile=true", "train.precision=bf16"),
             "a curriculum of plain models, nothing planted or mimicked: lego-association's weights (one hop, "
             "#0-#2) trained on #0-#4 of the same six-letter task, 3,000 steps (about 16 minutes on one thread; "
             "compiled bf16, so a rebuild needs a CPU with bf16 kernels and is close to, not bit-equal to, these "
             "weights): #0-#4 = 1.00 from step 1,750, three hops for #4"),
    ZooEntry("lego-three-hops", "lego-cpu",
             ("model.planted={}", "task.n_vars=8", "task.n_letters=8", "task.n_supervised=5",
              "train.init_from=zoo/lego-three-hops-n6", "train.batch_size=512", "train.steps=3000",
              "train.warmup_steps=100", "train.eval_every=250", "train.checkpoint_every=250", "train.eval_size=1000",
              "train.compile=true", "train.precision=bf16"),
             "the curriculum's last step: lego-three-hops-n6's weights on n = 8 with eight letters, #0-#4 "
             "supervised (three association hops for #4, #5-#7 never supervised), 3,000 steps (compiled bf16, as "
             "above): #0-#4 >= 0.99 by step 250"),
    ZooEntry("lego-three-hops-albert", "lego-cpu", ("train.seed=1",),
             "ALBERT (one block shared by all four layers), learned by the lego-three-hops-albert curriculum, "
             "nothing planted or mimicked: one hop with six letters (6,000 steps), #0-#4 of n = 6, then #0-#4 of "
             "n = 8 with eight letters (seed 1; the last stage of the cpu-scale lego-extrapolation study's "
             "albert-s1, compiled bf16, so a rebuild is close to, not bit-equal to, these weights)",
             curriculum="lego-three-hops-albert"),
    *(ZooEntry(f"lego12-{arch}-s{seed}", "lego-cpu", ("model.n_layers=12", "train.precision=fp32",
                                                      f"train.seed={seed}"),
               f"{'ALBERT (one block shared by all 12 layers)' if arch == 'albert' else 'BERT'}, 12 layers for 12 "
               f"variables, #0-#5 supervised (the LEGO paper's shape at d_model 64), seed {seed}: nothing planted or "
               f"mimicked; the {curriculum} curriculum's four stages, each warm-started from the one before. Trained "
               "on a GPU (`bash analyses/gpu/zoo.sh`: the four side by side took 12 minutes on one H100; a CPU build "
               f"takes hours); kept in float16 where fp32 would pass 2 MB",
               curriculum=curriculum)
      for arch, curriculum in (("bert", "lego-n12"), ("albert", "lego-n12-albert")) for seed in (0, 1)),
    *(ZooEntry(f"composite-matched-{kind}", "composite-matched",
               (f"model.init_gamma={gamma}", "train.seed=1", "train.compile=true"),
               f"2 layers under the matched protocol (the composite-matched preset, compiled fp32, seed 1), gamma "
               f"{gamma}, trained to the stop rule: the {kind} corner of the pair that finding 2 compares "
               f"(analyses/lab/composite-mechanism.md, \"Findings 2-4 on one protocol's pair\")")
      for kind, gamma in (("inferential", 0.9), ("symmetric", 0.5))),
    ZooEntry("composite-symmetric", "composite-cpu", ("train.steps=600", "model.init_gamma=0.5"),
             "2 layers, gamma 0.5: answers held-out pairs symmetrically (cpu phase diagram)"),
    ZooEntry("composite-inferential", "composite-cpu", ("train.steps=600", "model.init_gamma=0.7"),
             "2 layers, gamma 0.7: composes the primitives on held-out pairs (cpu phase diagram)"),
]
ZOO = {entry.name: entry for entry in ENTRIES}


def zoo_entry(name: str) -> ZooEntry:
    if name not in ZOO:
        raise ConfigError(f"zoo entry {name!r} is unknown; use one of {sorted(ZOO)}")
    return ZOO[name]


def zoo_path(name: str, zoo_dir: Path = ZOO_DIR) -> Path:
    return zoo_dir / zoo_entry(name).name


def build(name: str, zoo_dir: Path = ZOO_DIR, progress: bool = True, device: str | None = None) -> Path:
    """Train the entry on one thread in a scratch folder, then replace `zoo_dir/name` with its
    kept files. An entry warm-started from another (`train.init_from=zoo/NAME`, a curriculum)
    reads that folder relative to the repository root, whatever the current folder. `device`
    (e.g. "cuda") trains it there: the weights are then close to, not bit-equal to, a CPU build.
    Weights over MAX_WEIGHT_BYTES in fp32 are kept in float16 (`_fit_weights`)."""
    from models.train import train

    entry, threads, cwd = zoo_entry(name), torch.get_num_threads(), Path.cwd()
    overrides = (*entry.overrides, f'train.device="{device}"') if device else entry.overrides
    target = (zoo_dir / entry.name).resolve()
    torch.set_num_threads(1)
    os.chdir(ZOO_DIR.parent)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            if entry.curriculum is None:
                run_dir = Path(scratch) / entry.name
                cfg = get_preset(entry.preset).with_overrides(list(overrides))
                train(cfg, run_dir, progress=progress)
            else:  # the stages in runs/zoo-stages/NAME (resumable), the last one kept
                run_dir = train_curriculum(get_curriculum(entry.curriculum), STAGES_DIR / entry.name,
                                           overrides, progress=progress)[-1].folder
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            for file in KEPT_FILES:
                if (run_dir / file).exists():
                    shutil.copy2(run_dir / file, target / file)
            _fit_weights(target)
    finally:
        torch.set_num_threads(threads)
        os.chdir(cwd)
    return target


def _fit_weights(folder: Path) -> None:
    """Keep a weights file over MAX_WEIGHT_BYTES in float16, with its own digest, so that every
    committed entry stays small; what the model computes then differs from the fp32 weights by
    float16 rounding (a 12-layer LEGO BERT: 2.4 MB in fp32). Loading casts back to fp32."""
    if (folder / WEIGHTS).stat().st_size <= MAX_WEIGHT_BYTES:
        return
    tensors, stamp = verified_weights(folder)
    half = {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}
    save_weights(folder, half, WeightsStamp(stamp.step, weights_digest(half)))


def status(name: str, zoo_dir: Path = ZOO_DIR) -> str:
    """`built` (weights of this entry's config), `stale` (another config), `damaged` (weights
    that fail `verified_weights`: their tensors do not hash to their recorded digest) or `missing`."""
    folder = zoo_dir / zoo_entry(name).name
    if not (folder / WEIGHTS).exists():
        return "missing"
    try:
        verified_weights(folder)
    except RunFolderError:
        return "damaged"
    entry = ZOO[name]
    return "built" if entry.recipe(read_config(folder)) == entry.recipe(entry.config()) else "stale"


DEMO_LEARNED = "lego-three-hops"  # the zoo model whose analysis the demo's report links to


def demo_learned(out: Path, analyze: Callable[[argparse.Namespace], int]) -> Path | None:
    """Beside the demo run, analyze a copy of the zoo's learned three-hop LEGO model in
    OUT-learned (under a minute), and link the two reports. The copy is made under a temporary
    name and renamed, so an interrupted copy is never taken for one.
    `analyze`: the `workbench analyze` command (analyses.cli.analyze's run), given its parsed
    arguments."""
    from models.runs import CONFIG, read_regular

    source, learned = zoo_path(DEMO_LEARNED), out.with_name(f"{out.name}-learned")
    if learned.exists() and (not (learned / CONFIG).is_file()
                             or read_regular(learned / CONFIG) != read_regular(source / CONFIG)):
        print(f"warning: {learned} holds something other than a copy of zoo/{DEMO_LEARNED}; the learned model's "
              "report is not written", file=sys.stderr)
        return None
    if not learned.exists():
        partial = learned.with_name(f".{learned.name}.copying")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source, partial)
        partial.rename(learned)
    analyze(argparse.Namespace(run_dir=learned, samples=512, seed=0, device="cpu"))
    _link_reports(out, learned)
    return learned


def _link_reports(demo: Path, learned: Path) -> None:
    """Rewrite both reports with a paragraph after the summary that points at the other."""
    from interp.run_report import build_run_report
    from models.runs import REPORT, load_run, run_lock

    notes = {demo: (learned, "For a LEGO model that learned to follow a chain of three association hops, with nothing "
                             "planted or mimicked, see"),
             learned: (demo, f"A copy of zoo/{DEMO_LEARNED}: a plain model taught three association hops by the "
                             "lego-three-hops curriculum. For the demo's own model (the composite task, learned, with "
                             "its timeline), see")}
    for run_dir, (other, words) in notes.items():
        with run_lock(run_dir):
            report = build_run_report(load_run(run_dir))
            report.sections.insert(1, ("See also", f'<p>{words} <a href="../{other.name}/report.html">'
                                                   f"{other.name}/report.html</a>.</p>"))
            report.write(run_dir / REPORT)
