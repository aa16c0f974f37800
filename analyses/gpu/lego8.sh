#!/usr/bin/env bash
# LEGO with as many layers as variables on one GPU (issue 27; analyses/lab/lego-depth.md, "8 layers for 8
# variables"): plain models (nothing planted, mimicked or warm-started) taught by the curriculum,
# n = 8, #0-#4 supervised, 8 layers, fp32 as the CPU runs, trained side by side, then each analysed
# (`workbench analyze` on its last stage: per-variable accuracy, parity rules, percolation).
#
#   bash analyses/gpu/lego8.sh OUT_DIR [DEADLINE_S]
#
# Runs (RUNS overrides, as NAME:CURRICULUM:SEED:MIN_DEPTH; MIN_DEPTH "-" for a fixed depth):
#   bert-s0 bert-s1        lego-three-hops
#   albert-s0 albert-s1    lego-three-hops-albert (tied layers)
#   albertsd-s0 albertsd-s1  the same with stochastic depth: each batch runs 4..8 blocks, as the
#                          paper's 6..12 of 12; evaluation uses all 8
# A curriculum resumes where it stopped (stages checkpoint every 250 steps), so running the script
# again on the same OUT_DIR continues. DEADLINE_S > 0 stops everything that many seconds after the
# start. Exit status: 0 when every run trained (and was analysed), 3 when the deadline stopped some
# (run again to resume them), 1 when one failed (its log, OUT_DIR/NAME.log, says why). Env: PYTHON (default python3), DEVICE (default cuda), EXTRA (more --set flags for every
# stage, space-separated, e.g. a smoke test's train.steps=20), ANALYZE (default 1; 0 trains only), LAYERS (default 8;
# analyses/gpu/lego12.sh sets 12). The analysis writes
# an HTML report too, so the machine needs the project's dependencies, circuitsvis included.
set -u
out=${1:?usage: lego8.sh OUT_DIR [DEADLINE_S]}
deadline=${2:-0}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
start=$(date +%s)
mkdir -p "$out"
read -r -a runs <<<"${RUNS:-bert-s0:lego-three-hops:0:- bert-s1:lego-three-hops:1:- \
albert-s0:lego-three-hops-albert:0:- albert-s1:lego-three-hops-albert:1:- \
albertsd-s0:lego-three-hops-albert:0:4 albertsd-s1:lego-three-hops-albert:1:4}"

one() {  # one NAME CURRICULUM SEED MIN_DEPTH: train the curriculum, then analyse its last stage
  local name=$1 curriculum=$2 seed=$3 min_depth=$4 sets=()
  sets=(--set model.n_layers="${LAYERS:-8}" --set train.precision=fp32 --set train.seed="$seed" --set train.device="\"$device\"")
  [ "$min_depth" != "-" ] && sets+=(--set model.min_depth="$min_depth")
  local extra=()
  read -r -a extra <<<"${EXTRA:-}"
  for s in "${extra[@]}"; do sets+=(--set "$s"); done
  OMP_NUM_THREADS=2 "$py" -m analyses.cli curriculum "$curriculum" --no-progress --out "$out/$name" "${sets[@]}" || return
  local last
  last=$(ls -d "$out/$name"/[0-9]-* | tail -n 1)  # the last stage
  [ "${ANALYZE:-1}" = 0 ] || [ -f "$last/analysis.json" ] || OMP_NUM_THREADS=2 "$py" -m analyses.cli analyze "$last" --device "$device"
}

pids=()
stopped=0
for r in "${runs[@]}"; do
  IFS=: read -r name curriculum seed min_depth <<<"$r"
  one "$name" "$curriculum" "$seed" "$min_depth" >>"$out/$name.log" 2>&1 &
  pids+=($!)
  echo "started $name (pid $!)"
done
while :; do
  alive=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  [ "$alive" -eq 0 ] && break
  if [ "$deadline" -gt 0 ] && [ $(( $(date +%s) - start )) -ge "$deadline" ]; then
    echo "deadline: stopping at $(( $(date +%s) - start )) s"
    for pid in "${pids[@]}"; do pkill -TERM -P "$pid" 2>/dev/null; kill "$pid" 2>/dev/null; done
    stopped=1
    break
  fi
  sleep 1
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
for r in "${runs[@]}"; do
  name=${r%%:*}
  echo "== $name: $(tail -n 1 "$out/$name.log")"
  for f in "$out/$name"/*/metrics.jsonl; do
    [ -s "$f" ] && echo "   $(basename "$(dirname "$f")"): $(tail -n 1 "$f" | "$py" -c 'import json,sys
r=json.loads(sys.stdin.read()); print({k: r[k] for k in ("step","elapsed_s","acc_per_var") if k in r})')"
  done
done
if [ "$stopped" = 1 ]; then echo "stopped at the deadline: run again to resume"; exit 3; fi
if [ "$failed" = 1 ]; then echo "a run failed: see its log in $out"; exit 1; fi
