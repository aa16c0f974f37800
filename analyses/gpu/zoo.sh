#!/usr/bin/env bash
# Build zoo entries side by side on one GPU (issue 41): by default the four 12-layer LEGO models
# (lego12-bert-s0/s1, lego12-albert-s0/s1), whose curricula take hours on a CPU.
#
#   bash analyses/gpu/zoo.sh [NAME ...]
#
# Each is `workbench zoo build NAME --device $DEVICE`: its stages go to runs/zoo-stages/NAME (they
# checkpoint, so running the script again continues them), its kept files to zoo/NAME, its log to
# runs/zoo-stages/NAME.log. Env: PYTHON (default python3), DEVICE (default cuda), DEADLINE_S (> 0
# stops every build that many seconds after the start). Exit status: 0 when every entry was built,
# 3 when the deadline stopped some (run again to resume them), 1 when one failed (see its log).
set -u
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
deadline=${DEADLINE_S:-0}
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(lego12-bert-s0 lego12-bert-s1 lego12-albert-s0 lego12-albert-s1)
start=$(date +%s)
mkdir -p runs/zoo-stages
pids=()
for name in "${names[@]}"; do
  OMP_NUM_THREADS=2 "$py" -m analyses.cli zoo build "$name" --device "$device" --no-progress \
    >>"runs/zoo-stages/$name.log" 2>&1 &
  pids+=($!)
  echo "started $name (pid $!)"
done
stopped=0
while [ -n "$(jobs -pr)" ]; do  # the builds still running
  if [ "$deadline" -gt 0 ] && [ $(( $(date +%s) - start )) -ge "$deadline" ]; then
    echo "deadline: stopping the builds at $(( $(date +%s) - start )) s"
    kill -TERM $(jobs -pr) 2>/dev/null
    stopped=1
    break
  fi
  sleep 1
done
failed=0
for i in "${!names[@]}"; do
  wait "${pids[$i]}" || failed=1
  echo "== ${names[$i]}: $(tail -n 1 "runs/zoo-stages/${names[$i]}.log")"
done
[ "$stopped" = 0 ] || { echo "stopped at the deadline: run again to resume"; exit 3; }
[ "$failed" = 0 ] || { echo "a build failed: see its log in runs/zoo-stages"; exit 1; }
