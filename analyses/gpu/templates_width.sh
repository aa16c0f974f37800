#!/usr/bin/env bash
# Templates at the paper's widths on one GPU (issue 53; analyses/lab/templates.md, "Copy-width at a longer
# budget"): the copy template (one variable) trained to the longer budget's stop rule (up to 3,000 steps),
# plain and identity-augmented attention (a_h, b_h at 10x the lr), n = 4, 16, 64, 256 training symbols,
# at each width of WIDTHS, for the seeds of SEEDS. One sweep per width (OUT_DIR/dWIDTH), so a width's
# cells are written as they finish; same-shape cells train as one ensemble on CUDA (--ensemble auto).
# Every model is learned: nothing planted or mimicked; the token embeddings are fixed at their random init.
#
#   bash analyses/gpu/templates_width.sh OUT_DIR [DEADLINE_S]
#
# A sweep resumes where it stopped (finished cells are skipped, others continue from their checkpoint),
# so running the script again on the same OUT_DIR continues. DEADLINE_S > 0 stops the sweep running at
# that many seconds after the start (SIGTERM: it resumes next time). Then the table of every run
# (python -m analyses.studies.templates OUT_DIR/d*: n, width, variant, test loss and error on unseen
# symbols, |a_h|, |b_h|, the smallest n with error < 0.05). Exit status: 0 when every width finished,
# 3 when the deadline stopped one (run again to resume), 1 when a sweep failed (OUT_DIR/dWIDTH.log).
# Env: PYTHON (default python3), DEVICE (default cuda), WIDTHS (default "256 512 1024"), SEEDS (default
# "0,1"), NS (default "4,16,64,256"), EXTRA (more --set flags for every cell, space-separated, e.g. a
# smoke test's train.steps=20).
set -u
out=${1:?usage: templates_width.sh OUT_DIR [DEADLINE_S]}
deadline=${2:-0}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
start=$(date +%s)
mkdir -p "$out"
sets=(--set task.template=copy --set task.n_vars=1 --set train.steps=3000 --set train.eval_every=200
      --set train.checkpoint_every=200 --set train.plateau_evals=5 --set train.plateau_min_steps=1000
      --set 'train.plateau_watch=["eval_loss"]' --set train.plateau_watch_tol=0.01 --set train.identity_lr_scale=10
      --set train.device="\"$device\"")
read -r -a extra <<<"${EXTRA:-}"
for s in "${extra[@]}"; do sets+=(--set "$s"); done
status=0
for width in ${WIDTHS:-256 512 1024}; do
  left=0
  if [ "$deadline" -gt 0 ]; then
    left=$(( deadline - ($(date +%s) - start) ))
    if [ "$left" -le 0 ]; then status=3; echo "deadline: d$width not started"; continue; fi
  fi
  echo "d$width: started at $(( $(date +%s) - start )) s"
  timeout --signal=TERM "${left}s" "$py" -m analyses.cli sweep --preset templates-cpu "${sets[@]}" \
    --set model.d_model="$width" --grid task.n_train_symbols="${NS:-4,16,64,256}" \
    model.identity_attention=false,true train.seed="${SEEDS:-0,1}" --workers 1 --no-progress \
    --out "$out/d$width" >>"$out/d$width.log" 2>&1
  code=$?
  echo "d$width: exit $code at $(( $(date +%s) - start )) s"
  if [ "$code" = 124 ] || [ "$code" = 143 ]; then status=3; elif [ "$code" != 0 ] && [ "$status" = 0 ]; then status=1; fi
done
"$py" -m analyses.studies.templates "$out"/d*/
if [ "$status" = 3 ]; then echo "stopped at the deadline: run again to resume"; fi
if [ "$status" = 1 ]; then echo "a sweep failed: see its log in $out"; fi
exit "$status"
