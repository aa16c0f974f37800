"""An example model factory for `workbench analyze-model` (docs/outside-models.md), with its
prompt pairs in induction_pairs.json beside it:

    workbench analyze-model --model analyses/examples/induction.py:build \
        --prompts analyses/examples/induction_pairs.json --out runs/induction

`build()` returns `interp.toy_induction.hand_set_induction_model()`, a 2-layer attention-only model
whose weights are set by hand: L0H0 a previous-token head feeding L1H0, an induction head, and
two distractors nothing reads. Your own factory does the same for your model: any function of
no arguments returning a HookedTransformer (`HookedTransformer.from_pretrained("gpt2")`, or one
you load from a checkpoint). `python analyses/examples/induction.py` rewrites the pairs file
from `interp.toy_induction.induction_prompt_pairs`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformer_lens import HookedTransformer

from interp.toy_induction import TOY_VOCAB, hand_set_induction_model, induction_prompt_pairs

PAIRS_FILE = Path(__file__).with_name("induction_pairs.json")


def build() -> HookedTransformer:
    """The model to analyse."""
    return hand_set_induction_model()


def pairs_spec(n: int = 16, seed: int = 0) -> dict[str, Any]:
    """`induction_prompt_pairs(n, seed)` in the pairs file's format: tokens by their names in
    `vocab` (the model has no tokenizer), clean `p A B q D C r A` -> B, corrupted
    `p D B q A C r A` -> C."""
    pairs = induction_prompt_pairs(n, seed)
    return {"vocab": TOY_VOCAB, "pairs": [
        {"clean": " ".join(pairs.token_strings(c)), "corrupted": " ".join(pairs.token_strings(k)),
         "answer": TOY_VOCAB[int(a)], "wrong_answer": TOY_VOCAB[int(w)]}
        for c, k, a, w in zip(pairs.clean, pairs.corrupted, pairs.answers, pairs.wrong_answers)]}


def pairs_json(spec: dict[str, Any]) -> str:
    """One pair per line, so that the file reads as a table."""
    rows = ",\n  ".join(json.dumps(pair) for pair in spec["pairs"])
    return f'{{"vocab": {json.dumps(spec["vocab"])},\n "pairs": [\n  {rows}\n ]}}\n'


if __name__ == "__main__":
    PAIRS_FILE.write_text(pairs_json(pairs_spec()))
    print(f"wrote {PAIRS_FILE}")
