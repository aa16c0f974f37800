#!/usr/bin/env bash
# Composite at the paper's protocol on one GPU (issue 27; analyses/RESULTS.md, "Composite at the
# paper's protocol"): the composite-paper preset (d_model 400, one head of d_k 200, ReLU FFN 1200,
# post-LN, no biases, 900k fixed samples, batch 2048, AdamW, 10-epoch warm-up, cosine over 200
# epochs = 87,800 steps), test keys split by x mod 9 as the group's public code, depth 2, seed 0,
# bf16 and compiled. Cells: init_gamma 0.5 and 0.8 (the paper's mechanism pair) x peak lr 2.5e-4
# (the paper's text) and 1e-4 (the low end of its phase-diagram lrs), trained side by side.
#
#   bash analyses/gpu/composite_paper.sh OUT_DIR [DEADLINE_S]
#
# DEADLINE_S > 0 stops every run that many seconds after the start (a run keeps its last
# checkpoint, every 2 epochs); running the script again on the same OUT_DIR resumes them.
# A run that dies before its first checkpoint (a compile failure, say) starts once more, eager
# (train.compile=false), its folder kept as NAME.failed-<time>; one that dies after a checkpoint
# is left as it is, for the next call to resume. Env: PYTHON (default python3), DEVICE (default
# cuda), LAYERS (default 2), CELLS (default "0.5:2.5e-4 0.8:2.5e-4 0.5:1e-4 0.8:1e-4", gamma:lr
# pairs), EXTRA (more --set flags; new runs only: a resumed run keeps its config).
set -u
out=${1:?usage: composite_paper.sh OUT_DIR [DEADLINE_S]}
deadline=${2:-0}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
start=$(date +%s)
mkdir -p "$out"
layers=${LAYERS:-2}
read -r -a cells <<<"${CELLS:-0.5:2.5e-4 0.8:2.5e-4 0.5:1e-4 0.8:1e-4}"
cell_name() { echo "d${layers}-g${1%%:*}-lr${1##*:}"; }
fallback=()
declare -A log_start
launch() {  # launch CELL: start (or resume) its run in the background; its pid goes to $pid
  local gamma=${1%%:*} lr=${1##*:} name
  name=$(cell_name "$1")
  if [ -f "$out/$name/train_state.safetensors" ]; then
    args=(--out "$out/$name" --resume)
  else
    args=(--preset composite-paper --out "$out/$name" --set task.key_modulus=9 --set model.init_gamma="$gamma"
          --set model.n_layers="$layers" --set train.lr="$lr" --set train.precision=bf16 --set train.compile=true
          --set train.checkpoint_every=878 ${EXTRA:-} "${fallback[@]}")
  fi
  log_start[$1]=$(( $(stat -c %s "$out/$name.log" 2>/dev/null || echo 0) + 1 ))
  OMP_NUM_THREADS=2 "$py" -m analyses.cli train --device "$device" --no-progress "${args[@]}" >>"$out/$name.log" 2>&1 &
  pid=$!
  echo "started $name (pid $pid) ${fallback[*]}"
}
# whether CELL's run ended by finishing, read from what this call appended to its log
finished() { tail -c "+${log_start[$1]}" "$out/$(cell_name "$1").log" 2>/dev/null | grep -q "^trained"; }
retry_eager() {  # a run that died before its first checkpoint starts again without compile, once
  local name
  name=$(cell_name "$1")
  echo "$name died unfinished (its log's end follows)"
  tail -n 5 "$out/$name.log"
  if [ -f "$out/$name/train_state.safetensors" ]; then
    echo "$name has a checkpoint: left as it is, for the next call to resume"
    pid=""
    return
  fi
  echo "$name trains again eager"
  [ -e "$out/$name" ] && mv "$out/$name" "$out/$name.failed-$(date +%s)"
  fallback=(--set train.compile=false)
  launch "$1"
}
declare -A pids retried
for i in "${!cells[@]}"; do
  launch "${cells[$i]}"
  pids[${cells[$i]}]=$pid
  if [ "$i" -eq 0 ] && [ "${#cells[@]}" -gt 1 ]; then
    # the first run compiles alone; the others then find its kernels in the compile cache
    sleep "${FIRST_ALONE_S:-40}"
    if ! kill -0 "$pid" 2>/dev/null && ! finished "${cells[0]}"; then
      retry_eager "${cells[0]}"; pids[${cells[0]}]=$pid; retried[${cells[0]}]=1
    fi
  fi
done
while :; do
  alive=0
  for cell in "${cells[@]}"; do
    if [ -n "${pids[$cell]}" ] && kill -0 "${pids[$cell]}" 2>/dev/null; then alive=1
    elif ! finished "$cell" && [ -z "${retried[$cell]:-}" ]; then
      retry_eager "$cell"; pids[$cell]=$pid; retried[$cell]=1; alive=1
    fi
  done
  [ "$alive" -eq 0 ] && break
  if [ "$deadline" -gt 0 ] && [ $(( $(date +%s) - start )) -ge "$deadline" ]; then
    echo "deadline: stopping the runs at $(( $(date +%s) - start )) s"
    for pid in "${pids[@]}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null; done
    break
  fi
  sleep 1
done
wait
for cell in "${cells[@]}"; do
  name=$(cell_name "$cell")
  echo "== $name: $(tail -n 2 "$out/$name.log" | tr '\n' ' ')"
  [ -s "$out/$name/metrics.jsonl" ] && tail -n 1 "$out/$name/metrics.jsonl" | "$py" -c 'import json,sys
r=json.loads(sys.stdin.read()); print({k: r[k] for k in ("step","elapsed_s","acc_seen","held_out_inferential","held_out_symmetric","held_out_other") if k in r})'
done
