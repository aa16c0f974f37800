#!/usr/bin/env bash
# LEGO in the paper's shape on one GPU (issue 27): 12 layers for 12 variables, #0-#5 supervised, by the
# curricula lego-n12 (BERT) and lego-n12-albert (tied layers): the three stages of lego-three-hops, then
# #0-#5 of n = 12 with twelve letters. Plain models: nothing planted, mimicked or warm-started.
#
#   bash analyses/gpu/lego12.sh OUT_DIR [DEADLINE_S]
#
# analyses/gpu/lego8.sh with LAYERS=12 and these runs (RUNS overrides them, as there):
#   bert-s0 albert-s0 bert-s1 albert-s1; ALBERT with stochastic depth, the paper's 6..12 of 12 blocks,
#   is RUNS="albertsd-s0:lego-n12-albert:0:6". Exit status, resuming and the other env as lego8.sh.
export LAYERS=12
export RUNS="${RUNS:-bert-s0:lego-n12:0:- albert-s0:lego-n12-albert:0:- bert-s1:lego-n12:1:- albert-s1:lego-n12-albert:1:-}"
exec bash "$(dirname "$0")/lego8.sh" "$@"
