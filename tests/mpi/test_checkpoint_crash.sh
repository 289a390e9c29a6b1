# SIGKILL of one rank while checkpointing every N iterations: the job ends promptly with a non-zero exit, and
# --resume continues from the newest checkpoint, losing at most the N iterations since it.
source "$(dirname "$0")/../cli/common.sh"
DATA=$SCRATCH/synth.h5
"$LBBSP" data synth --samples 2048 --features 64 --classes 4 --seed 1 --out "$DATA" >/dev/null
EVERY=20
BASE=(train --data "$DATA" --model mlp --hidden 32 --epochs 500 --global-batch 32 --lr 0.05 --lr-schedule constant --seed 737373
      --test-subset 64 --progress-every 1)
TRAIN=("${BASE[@]}" --checkpoint-dir "$SCRATCH/ck" --checkpoint-every $EVERY)
# An emulated slow device keeps the run going while we kill it (5 ms per iteration at least).
SLOW=(--straggle "static:1;gpu=0.005:1000000:0:1000000")

mpirun_n 2 "$LBBSP" "${TRAIN[@]}" "${SLOW[@]}" >"$SCRATCH/kill.log" 2>&1 &
job=$!
victim=$(find_rank_pid "--seed 737373")
# Kill once two checkpoints exist and the run is past the second (iteration 40): between two checkpoints.
two_checkpoints() { (($(ls "$SCRATCH/ck" 2>/dev/null | grep -c '^ckpt-.*\.h5$') >= 2)); }
wait_until 120 two_checkpoints || fail "no two checkpoints within 120 s: $(ls "$SCRATCH/ck" 2>&1; tail -n 3 "$SCRATCH/kill.log")"
wait_for_iteration "$SCRATCH/kill.log" $((2 * EVERY + EVERY / 2)) 120
kill_rank_expect_prompt_end "$victim" $job
last=$(grep -oE '^iteration [0-9]+/' "$SCRATCH/kill.log" | tail -n 1 | grep -oE '[0-9]+')
[[ -n $last ]] || fail "no progress line before the kill: $(cat "$SCRATCH/kill.log")"
echo "ok: the killed run got past iteration $last"

mpirun_n 2 "$LBBSP" "${TRAIN[@]}" --resume --max-iterations $((last + 30)) --quiet \
  --summary-json "$SCRATCH/resumed.json" --save-params "$SCRATCH/resumed.h5"
/usr/bin/python3 - "$SCRATCH/resumed.json" "$last" "$EVERY" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
last, every = int(sys.argv[2]), int(sys.argv[3])
start = s["start_iteration"]
assert start % every == 0 and start >= last - every and start > 0, (start, last, every)
assert s["iterations"] == last + 30, s["iterations"]
print(f"resumed at iteration {start} (last progress line {last}, checkpoint every {every}): lost {last - start}")
PY
# The killed-and-resumed run equals an uninterrupted one bit for bit (bsp: the split does not depend on speed).
mpirun_n 2 "$LBBSP" "${BASE[@]}" --max-iterations $((last + 30)) --quiet --save-params "$SCRATCH/straight.h5"
cmp "$SCRATCH/straight.h5" "$SCRATCH/resumed.h5" >/dev/null ||
  /usr/bin/python3 - "$SCRATCH/straight.h5" "$SCRATCH/resumed.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    for k in a["params"]:
        assert a["params"][k][()].tobytes() == b["params"][k][()].tobytes(), f"{k} differs after kill + resume"
print("killed + resumed == uninterrupted, bit for bit")
PY
echo "crash test passed"
