# Graceful stop (runtime/train/stop_signal.hpp): SIGTERM to one rank (as Slurm sends at a time limit) stops every rank
# after the same iteration with a checkpoint, exit 143 and `stopped_by` in the summary; --resume then loses
# nothing (bit for bit equal to an uninterrupted run). SIGUSR1 to mpirun (forwarded to the ranks; `sbatch
# --signal=USR1@120`) does the same with exit 138; SIGINT on one process without --checkpoint-dir still writes
# the summary; a second signal more than 2 s after the first ends the process at once, one sooner is ignored.
source "$(dirname "$0")/../cli/common.sh"
DATA=$SCRATCH/synth.h5
"$LBBSP" data synth --samples 2048 --features 64 --classes 4 --seed 1 --out "$DATA" >/dev/null
BASE=(train --data "$DATA" --model mlp --hidden 32 --epochs 500 --global-batch 32 --lr 0.05 --lr-schedule constant --seed 646464
      --test-subset 64 --progress-every 1)
# An emulated slow device keeps the run going while we signal it (5 ms per iteration at least).
SLOW=(--straggle "static:1;gpu=0.005:1000000:0:1000000")
expect_exit() { # expect_exit JOB STATUS WHAT: the background job ends within 30 s with STATUS
  local rc=0 start=$SECONDS
  wait "$1" || rc=$?
  ((rc == $2)) || fail "$3: exit $rc, expected $2"
  ((SECONDS - start <= 30)) || fail "$3: took $((SECONDS - start)) s to stop"
  echo "ok: $3 ended with exit $rc in $((SECONDS - start)) s"
}

# 1. SIGTERM to one rank of two.
mpirun_n 2 "$LBBSP" "${BASE[@]}" "${SLOW[@]}" --checkpoint-dir "$SCRATCH/ck" --summary-json "$SCRATCH/term.json" \
  >"$SCRATCH/term.log" 2>&1 &
job=$!
victim=$(find_rank_pid "--seed 646464")
wait_for_iteration "$SCRATCH/term.log" 30
kill -TERM "$victim"
expect_exit $job 143 "SIGTERM to rank pid $victim"
stopped=$(grep -oE 'SIGTERM: stopped after iteration [0-9]+ of 32000; checkpoint in' "$SCRATCH/term.log" |
  grep -oE 'iteration [0-9]+' | grep -oE '[0-9]+') || fail "no stop message: $(cat "$SCRATCH/term.log")"
[[ -f $SCRATCH/ck/$(printf 'ckpt-%012d.h5' "$stopped") ]] ||
  fail "no checkpoint of iteration $stopped: $(ls "$SCRATCH/ck")"
/usr/bin/python3 -c "
import json, sys; s = json.load(open('$SCRATCH/term.json'))
assert s['stopped_by'] == 'SIGTERM' and s['iterations'] == $stopped, s"
echo "ok: stopped after iteration $stopped with its checkpoint and summary"

# 2. --resume continues there and ends where an uninterrupted run ends, bit for bit.
mpirun_n 2 "$LBBSP" "${BASE[@]}" --checkpoint-dir "$SCRATCH/ck" --resume --max-iterations $((stopped + 20)) --quiet \
  --summary-json "$SCRATCH/resumed.json" --save-params "$SCRATCH/resumed.h5"
mpirun_n 2 "$LBBSP" "${BASE[@]}" --max-iterations $((stopped + 20)) --quiet --save-params "$SCRATCH/straight.h5"
/usr/bin/python3 - "$SCRATCH" "$stopped" <<'PY'
import json, sys, h5py
d, stopped = sys.argv[1], int(sys.argv[2])
s = json.load(open(d + "/resumed.json"))
assert s["start_iteration"] == stopped and s["stopped_by"] is None, s
with h5py.File(d + "/straight.h5", "r") as a, h5py.File(d + "/resumed.h5", "r") as b:
    for k in a["params"]:
        assert a["params"][k][()].tobytes() == b["params"][k][()].tobytes(), f"{k} differs after stop + resume"
print(f"ok: resumed at iteration {stopped}, nothing lost; equal to the uninterrupted run bit for bit")
PY

# 3. SIGUSR1 to mpirun, which forwards it to every rank.
mpirun_n 2 "$LBBSP" "${BASE[@]}" "${SLOW[@]}" --checkpoint-dir "$SCRATCH/ck_usr1" >"$SCRATCH/usr1.log" 2>&1 &
job=$!
wait_for_iteration "$SCRATCH/usr1.log" 30
launcher=$(pgrep -f -- "^[^ ]*$(basename "$MPIEXEC") -n 2 .*ck_usr1" | head -n 1)
[[ -n $launcher ]] || fail "could not find the $MPIEXEC process of the SIGUSR1 run"
kill -USR1 "$launcher"
expect_exit $job 138 "SIGUSR1 to mpirun (pid $launcher)"
grep -qE 'SIGUSR1: stopped after iteration [0-9]+' "$SCRATCH/usr1.log" ||
  fail "no SIGUSR1 stop: $(cat "$SCRATCH/usr1.log")"
compgen -G "$SCRATCH/ck_usr1/ckpt-*.h5" >/dev/null || fail "SIGUSR1 stop wrote no checkpoint"

# 4. SIGINT, one process, no --checkpoint-dir: the summary says so; the message says what is lost.
"$LBBSP" "${BASE[@]}" "${SLOW[@]}" --summary-json "$SCRATCH/int.json" >"$SCRATCH/int.log" 2>&1 &
job=$!
wait_for_iteration "$SCRATCH/int.log" 30
kill -INT $job
expect_exit $job 130 "SIGINT to a single process"
grep -q 'SIGINT: stopped after iteration .* no --checkpoint-dir' "$SCRATCH/int.log" || fail "$(cat "$SCRATCH/int.log")"
# Stopped inside the first epoch, before any evaluation: no "test accuracy nan" in the last line.
grep -qE '^stopped: [0-9]+ iterations .*, no test evaluation yet$' "$SCRATCH/int.log" || fail "$(cat "$SCRATCH/int.log")"
/usr/bin/python3 -c "
import json; s = json.load(open('$SCRATCH/int.json')); assert s['stopped_by'] == 'SIGINT', s"

# 5. Another signal more than 2 s after the first does not wait for the iteration (6 s each here): the process dies
#    without a summary. One sooner (at a Slurm time limit each srun-launched rank gets SIGTERM twice in a moment) is
#    the same stop and must not kill it: that run (1-s iterations) stops gracefully. Both side by side.
"$LBBSP" "${BASE[@]}" --straggle "static:1;gpu=6:1000000:0:1000000" --summary-json "$SCRATCH/twice.json" \
  >"$SCRATCH/twice.log" 2>&1 &
job=$!
"$LBBSP" "${BASE[@]}" --straggle "static:1;gpu=1:1000000:0:1000000" --summary-json "$SCRATCH/dup.json" \
  >"$SCRATCH/dup.log" 2>&1 &
dup=$!
# Signal inside the second iteration: set-up can outlast a fixed sleep (ASan on a loaded machine), and a signal
# then would kill the process before the handler is installed, passing this check without testing it.
wait_for_iteration "$SCRATCH/dup.log" 1
sleep 0.2
kill -TERM $dup
sleep 0.1
kill -TERM $dup
expect_exit $dup 143 "two SIGTERMs 0.1 s apart"
/usr/bin/python3 -c "
import json; s = json.load(open('$SCRATCH/dup.json')); assert s['stopped_by'] == 'SIGTERM', s" ||
  fail "a SIGTERM 0.1 s after the first killed the run: $(cat "$SCRATCH/dup.log")"
wait_for_iteration "$SCRATCH/twice.log" 1
sleep 0.5
kill -TERM $job
sleep 2.5
kill -TERM $job
rc=0
wait $job || rc=$?
((rc == 143)) || fail "twice: exit $rc, expected 143 (killed by SIGTERM)"
[[ ! -e $SCRATCH/twice.json ]] || fail "a SIGTERM 2.5 s after the first waited for the iteration to end"
echo "stop signal test passed"
