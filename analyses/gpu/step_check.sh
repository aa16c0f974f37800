#!/usr/bin/env bash
# The compiled training step on one GPU, in one call (docs/ensembles.md, "On a GPU"): the gpu tests
# of the step (CUDA graphs, no host sync, members vs lone runs), the ensemble benchmark of the
# composite-matched shape at K=64, the 16-cell composite-matched sweep (gamma 0.5/0.9 x seeds 0-7,
# 1,500 steps) as compiled ensembles, and the composite-paper run (gamma 0.8, lr 2.5e-4, bf16,
# compiled) for as long as is left.
#
#   bash analyses/gpu/step_check.sh OUT_DIR [SECONDS]
#
# Every part has its own time limit and writes its log to OUT_DIR; a part that fails does not stop
# the next. SECONDS (default 540) bounds the whole call. Env: PYTHON (default python3).
set -u
out=${1:?usage: step_check.sh OUT_DIR [SECONDS]}
budget=${2:-540}
py=${PYTHON:-python3}
mkdir -p "$out"
start=$(date +%s)
part() {  # part NAME SECONDS COMMAND...: run it with its limit, log to OUT_DIR/NAME.log
  local name=$1 limit=$2 began=$(date +%s)
  shift 2
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "$name: exit $? after $(( $(date +%s) - began )) s" | tee -a "$out/parts.txt"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
part gpu_tests 150 "$py" -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_ensemble_cuda.py
part bench 120 "$py" -m analyses.cli benchmark --ensemble 64 --device cuda --shapes composite-matched
part sweep 100 "$py" -m analyses.cli sweep --preset composite-matched --set train.device=cuda --ensemble on --no-progress \
  --grid model.init_gamma=0.5,0.9 train.seed=0,1,2,3,4,5,6,7 --set train.steps=1500 --set train.compile=true \
  --out "$out/sweep"
left=$(( budget - ($(date +%s) - start) - 10 ))
part paper "$left" "$py" -m analyses.cli train --device cuda --no-progress --preset composite-paper \
  --out "$out/paper-g0.8" --set task.key_modulus=9 --set model.init_gamma=0.8 --set train.lr=2.5e-4 \
  --set train.precision=bf16 --set train.compile=true --set train.snapshots=40
tail -n 3 "$out/paper-g0.8/metrics.jsonl" > "$out/paper_tail.txt" 2>/dev/null
rm -f "$out"/paper-g0.8/train_state.safetensors  # the optimizer state: too large to bring back
