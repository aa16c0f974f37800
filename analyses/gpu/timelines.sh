#!/usr/bin/env bash
# Solution timelines on one GPU (issue 40; analyses/lab/workbench-runs.md, "Solutions through training"): the
# runs whose questions are about *when*, trained side by side with snapshots, then each one's
# `workbench analyze --timeline`.
#
#   bash analyses/gpu/timelines.sh OUT_DIR [DEADLINE_S] [PAPER_S]
#
# - OUT/paper-fp32: composite at the paper's protocol (the composite-paper preset, test keys x mod
#   9, depth 2, seed 0), gamma 0.8, lr 2.5e-4, fp32 compiled: trained PAPER_S seconds (default 330)
#   of its 87,800-step schedule, 24 log-spaced snapshots plus events (loss spikes, held-out rates
#   moving by .2), then its timeline.
# - OUT/matched: the composite-matched sweep at depth 2, gamma 0.5 and 0.9, seeds 0 and 1 (4 cells,
#   4 workers on the GPU), each to its stop rule, then every cell's timeline.
# - OUT/lego-bert, OUT/lego-albert: the lego-three-hops curricula (BERT and ALBERT, seed 0), eager
#   bf16 on the GPU, a snapshot every 200 steps; timelines of stages 1 and 2.
# - OUT/shortcut: plain lego-cpu with every variable supervised (the lego-shortcut study's (a)
#   model, seed 0), a snapshot every 150 steps, and its timeline.
# Every job is stopped DEADLINE_S seconds (default 540) after the start; what finished is kept.
# Env: PYTHON (default python3); DEVICE (default cuda; cpu for a smoke test); EXTRA (--set flags for every
# training command, e.g. EXTRA="--set train.steps=40" for a smoke test).
set -u
out=${1:?usage: timelines.sh OUT_DIR [DEADLINE_S] [PAPER_S]}
deadline=${2:-540}
paper_s=${3:-330}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
read -r -a extra <<<"${EXTRA:-}"
start=$(date +%s)
mkdir -p "$out"
wb=("$py" -m analyses.cli)
watch='train.snapshot_watch=["held_out_inferential","held_out_symmetric"]'
every200="train.snapshots=[$(seq -s, 0 200 6000)]"
every150="train.snapshots=[$(seq -s, 0 150 3000)]"
timeline() {  # timeline RUN: the run's timeline on the device, its log beside it
  OMP_NUM_THREADS=2 "${wb[@]}" analyze "$1" --timeline --device "$device" --no-progress >>"$1.timeline.log" 2>&1
  echo "timeline of $1: exit $? at $(( $(date +%s) - start )) s"
}

paper() {
  timeout -s INT "$paper_s" "${wb[@]}" train --preset composite-paper --device "$device" --no-progress --out "$out/paper-fp32" \
    --set task.key_modulus=9 --set model.init_gamma=0.8 --set train.lr=2.5e-4 --set train.precision=fp32 \
    --set train.compile=true --set train.checkpoint_every=878 --set train.snapshots=24 --set "$watch" \
    "${extra[@]}" >"$out/paper-fp32.log" 2>&1
  echo "paper-fp32 stopped: exit $? at $(( $(date +%s) - start )) s"
  timeline "$out/paper-fp32"
}

matched() {
  "${wb[@]}" sweep --preset composite-matched --grid model.init_gamma=0.5,0.9 train.seed=0,1 --set "$watch" \
    --set train.device="\"$device\"" "${extra[@]}" --workers 4 --no-progress --out "$out/matched" >"$out/matched.log" 2>&1
  echo "matched sweep: exit $? at $(( $(date +%s) - start )) s"
  for cell in "$out"/matched/*/; do timeline "${cell%/}" & done
  wait
}

lego() {  # lego NAME CURRICULUM
  "${wb[@]}" curriculum "$2" --out "$out/$1" --no-progress --set train.compile=false --set "$every200" \
    --set train.device="\"$device\"" "${extra[@]}" >"$out/$1.log" 2>&1
  echo "$1: exit $? at $(( $(date +%s) - start )) s"
  timeline "$out/$1/1-one-hop" & timeline "$out/$1/2-three-hops-n6" &
  wait
}

shortcut() {
  "${wb[@]}" train --preset lego-cpu --device "$device" --no-progress --out "$out/shortcut" \
    --set 'model.planted={}' --set task.supervision=all --set train.compile=false --set "$every150" "${extra[@]}" \
    >"$out/shortcut.log" 2>&1
  echo "shortcut: exit $? at $(( $(date +%s) - start )) s"
  timeline "$out/shortcut"
}

paper & matched & lego lego-bert lego-three-hops & lego lego-albert lego-three-hops-albert & shortcut &
while [ -n "$(jobs -r)" ] && [ $(( $(date +%s) - start )) -lt "$deadline" ]; do sleep 1; done
if [ -n "$(jobs -r)" ]; then
  echo "deadline: stopping what still runs at $(( $(date +%s) - start )) s"
  pkill -INT -f "analyses.cli" ; sleep 3; pkill -KILL -f "analyses.cli"
fi
wait
echo "done at $(( $(date +%s) - start )) s"
