"""`workbench analyze-model`: the analysis on your own HookedTransformer and prompt pairs (analyses/outside.py)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    outside = sub.add_parser("analyze-model", help="the same analysis on your own HookedTransformer and prompt pairs",
                             description=_ANALYZE_MODEL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    outside.add_argument("--model", required=True, metavar="FILE.py:FUNCTION",
                         help="FILE.py:FUNCTION or package.module:FUNCTION; FUNCTION() returns a HookedTransformer")
    outside.add_argument("--prompts", required=True, type=Path, metavar="PAIRS.json",
                         help="the prompt pairs (format: docs/outside-models.md)")
    outside.add_argument("--out", required=True, type=Path, help="folder for analysis.json and report.html")
    outside.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu",
                         help="where the model runs (default: cpu; auto = CUDA when present)")
    outside.add_argument("--seed", type=int, default=0, help="seeds torch before FUNCTION() runs (default 0)")
    outside.set_defaults(run=run)


_ANALYZE_MODEL_HELP = """Patching, path patching, the circuit graph, head scores and the report on any
TransformerLens HookedTransformer, with your own clean/corrupted prompt pairs and no project task
(docs/outside-models.md). FUNCTION() takes no arguments and returns the model; the pairs file
holds {"pairs": [{"clean", "corrupted", "answer", "wrong_answer"}, ...]} with optional "vocab"
and "prepend_bos". Writes OUT/analysis.json and OUT/report.html. Example:
  workbench analyze-model --model analyses/examples/induction.py:build \\
      --prompts analyses/examples/induction_pairs.json --out runs/induction"""


def run(args: argparse.Namespace) -> int:
    from analyses.outside import analyze_outside, summary_lines
    from models.device import resolve_device

    device = resolve_device(args.device, setting="analyze-model --device")
    analysis, written = analyze_outside(args.model, args.prompts, args.out, device, seed=args.seed)
    print("\n".join(summary_lines(analysis)))
    print(f"wrote {' and '.join(map(str, written))} in {analysis.seconds:.1f} s on {device.type}")
    return 0
