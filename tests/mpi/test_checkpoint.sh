# Checkpoint / resume: a run stopped at K and resumed ends BIT-IDENTICAL to an uninterrupted one on the same rank
# count (deterministic balancers, lag 0 and 1); on another rank count equal to rounding; a corrupt newest
# checkpoint falls back to the older one; corrupt-only, other model, other global batch, other dataset are refused.
source "$(dirname "$0")/../cli/common.sh"
PY=/usr/bin/python3
COMPARE="$PY $(dirname "$0")/../tools/compare_params.py"
DATA=$SCRATCH/synth.h5
"$LBBSP" data synth --samples 2048 --features 64 --classes 4 --seed 1 --out "$DATA" >/dev/null

identical() {  # identical A.h5 B.h5: every parameter bit equal
  $PY - "$1" "$2" <<'PYEOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    assert sorted(a["params"]) == sorted(b["params"]), "tensor names differ"
    for k in a["params"]:
        x, y = a["params"][k][()], b["params"][k][()]
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), \
            f"{k}: max difference {np.abs(x.astype(float) - y).max()}"
print("bit-identical:", sys.argv[1], sys.argv[2])
PYEOF
}
start_of() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['start_iteration'])" "$1"; }
ckpts() { (cd "$1" && ls ckpt-*.h5 | tr '\n' ' '); }

# train NP MODEL BALANCER LAG MAX_IT [extra...]
train() {
  local np=$1 model=$2 bal=$3 lag=$4 max=$5; shift 5
  mpirun_n "$np" "$LBBSP" train --data "$DATA" --model "$model" --hidden 32 --epochs 1 --global-batch 32 --lr 0.05 \
    --lr-schedule constant --momentum 0.9 --balancer "$bal" --lag "$lag" --max-iterations "$max" --seed "${SEED:-5}" \
    --test-subset 256 --quiet "$@"
}

for cfg in "logreg random:7 0" "mlp random:9 1" "mlp bsp 0"; do
  read -r model bal lag <<<"$cfg"
  tag=$model-${bal//:/}-$lag
  train 2 "$model" "$bal" "$lag" 30 --save-params "$SCRATCH/$tag-full.h5"
  D=$SCRATCH/ck-$tag
  train 2 "$model" "$bal" "$lag" 12 --checkpoint-dir "$D" --checkpoint-every 5
  [[ $(ckpts "$D") == "ckpt-000000000010.h5 ckpt-000000000012.h5 " ]] || fail "keep 2 newest: got $(ckpts "$D")"
  cp -r "$D" "$D.copy"
  train 2 "$model" "$bal" "$lag" 30 --checkpoint-dir "$D" --resume --save-params "$SCRATCH/$tag-resumed.h5" \
    --summary-json "$SCRATCH/$tag.json"
  [[ $(start_of "$SCRATCH/$tag.json") == 12 ]] || fail "$tag: resumed at $(start_of "$SCRATCH/$tag.json"), not 12"
  identical "$SCRATCH/$tag-full.h5" "$SCRATCH/$tag-resumed.h5"
done

# The test can fail: resuming from a checkpoint of the same run with another seed's data order is refused, and
# a resume that skipped the restored momentum would differ: compare the 12-iteration run to the full one.
train 2 logreg random:7 0 12 --save-params "$SCRATCH/short.h5"
if identical "$SCRATCH/logreg-random7-0-full.h5" "$SCRATCH/short.h5" >/dev/null 2>&1; then
  fail "12 and 30 iterations gave identical parameters"
fi

# Another rank count: equal to rounding (the balancer restarts, the parameters and data position continue).
for np in 1 3; do
  cp -r "$SCRATCH/ck-logreg-random7-0.copy" "$SCRATCH/ck-np$np"
  train $np logreg random:7 0 30 --checkpoint-dir "$SCRATCH/ck-np$np" --resume --save-params "$SCRATCH/np$np.h5"
  $COMPARE "$SCRATCH/logreg-random7-0-full.h5" "$SCRATCH/np$np.h5" 1e-5
done

# Corrupt newest checkpoint (bytes of its parameters flipped): named, skipped, the older one is used.
flip() {  # flip FILE DATASET: flips bytes in the middle of the dataset's raw data
  $PY - "$1" "$2" <<'PYEOF'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    d = f[sys.argv[2]]
    off = d.id.get_offset() + d.id.get_storage_size() // 2
with open(sys.argv[1], "r+b") as f:
    f.seek(off); b = f.read(4); f.seek(off); f.write(bytes(x ^ 0x5A for x in b))
PYEOF
}
C=$SCRATCH/ck-corrupt
cp -r "$SCRATCH/ck-logreg-random7-0.copy" "$C"
flip "$C/ckpt-000000000012.h5" params
out=$(train 2 logreg random:7 0 30 --checkpoint-dir "$C" --resume --save-params "$SCRATCH/fallback.h5" \
  --summary-json "$SCRATCH/fallback.json" 2>&1)
grep -q "warning: skipping checkpoint '.*ckpt-000000000012.h5' is corrupt: checksum mismatch" <<<"$out" ||
  fail "the corrupt checkpoint should be named: $out"
[[ $(start_of "$SCRATCH/fallback.json") == 10 ]] || fail "fallback should resume at 10"
identical "$SCRATCH/logreg-random7-0-full.h5" "$SCRATCH/fallback.h5"

# Only corrupt checkpoints: refused, non-zero exit, each named.
C1=$SCRATCH/ck-allbad
mkdir -p "$C1"
cp "$SCRATCH/ck-logreg-random7-0.copy/ckpt-000000000012.h5" "$C1/"
cp "$SCRATCH/ck-logreg-random7-0.copy/ckpt-000000000010.h5" "$C1/"
flip "$C1/ckpt-000000000012.h5" velocity
head -c 3000 "$SCRATCH/ck-logreg-random7-0.copy/ckpt-000000000010.h5" >"$C1/ckpt-000000000010.h5"  # truncated
rc=0
out=$(train 2 logreg random:7 0 30 --checkpoint-dir "$C1" --resume 2>&1) || rc=$?
((rc != 0)) || fail "resuming from corrupt checkpoints only must fail"
for pattern in "no valid checkpoint in '$C1'" "ckpt-000000000012.h5' is corrupt: checksum mismatch" \
  "ckpt-000000000010.h5' is corrupt: not a readable HDF5 file"; do
  grep -qF -- "$pattern" <<<"$out" || fail "expected '$pattern' in: $out"
done
echo "ok: corrupt-only refused (exit $rc)"
# Mismatches are configuration errors: refused even when the file is fine.
G=$SCRATCH/ck-logreg-random7-0.copy
expect_fail "written for model \"logreg\", this run has \"mlp\"" train 2 mlp random:7 0 30 --checkpoint-dir "$G" --resume
expect_fail "written for global batch 32, this run has 64" \
  mpirun_n 2 "$LBBSP" train --data "$DATA" --model logreg --global-batch 64 --checkpoint-dir "$G" --resume --quiet
"$LBBSP" data synth --samples 2048 --features 32 --classes 4 --seed 1 --out "$SCRATCH/other.h5" >/dev/null
expect_fail "written for dataset input shape \[1,8,8\], this run has \[1,1,32\]" \
  mpirun_n 2 "$LBBSP" train --data "$SCRATCH/other.h5" --model logreg --global-batch 32 --checkpoint-dir "$G" \
  --resume --seed 5 --quiet
SEED=6 expect_fail "written for seed 5, this run has 6" train 2 logreg random:7 0 30 --checkpoint-dir "$G" --resume
expect_fail "no checkpoint \(ckpt-\*.h5\) in --checkpoint-dir" train 1 logreg bsp 0 30 \
  --checkpoint-dir "$SCRATCH/empty" --resume
expect_fail "--resume needs --checkpoint-dir" train 1 logreg bsp 0 30 --resume

# The optimiser is part of the checkpoint. A cosine schedule's horizon is the run's length: resumed with the same
# flags from iteration 10 of 30 it ends bit-identical; extended (stopped at 12 of --max-iterations 12, resumed with
# 30) it is refused naming both horizons, and with --allow-optimizer-change it goes on with a warning saying so.
cos_train() {  # cos_train MAX_IT [extra...]: one process (the optimiser check is rank 0's)
  local max=$1; shift
  "$LBBSP" train --data "$DATA" --model mlp --hidden 32 --epochs 1 --global-batch 32 --lr 0.05 --lr-schedule cosine \
    --warmup-iterations 3 --momentum "${MOMENTUM:-0.9}" --max-iterations "$max" --seed 5 --test-subset 256 --quiet "$@"
}
C=$SCRATCH/ck-cos
cos_train 30 --checkpoint-dir "$C" --checkpoint-every 5 --checkpoint-keep 10 --save-params "$SCRATCH/cos-full.h5"
find "$C" -name 'ckpt-*.h5' ! -name ckpt-000000000010.h5 -delete
cos_train 30 --checkpoint-dir "$C" --resume --save-params "$SCRATCH/cos-resumed.h5" --summary-json "$SCRATCH/cos.json"
[[ $(start_of "$SCRATCH/cos.json") == 10 ]] || fail "cosine: resumed at $(start_of "$SCRATCH/cos.json"), not 10"
identical "$SCRATCH/cos-full.h5" "$SCRATCH/cos-resumed.h5"
E=$SCRATCH/ck-extend
cos_train 12 --checkpoint-dir "$E"
expect_fail "written with another optimiser: cosine horizon in iterations \(--epochs, --max-iterations\): 12 in the checkpoint, 30 now.*--allow-optimizer-change" \
  cos_train 30 --checkpoint-dir "$E" --resume
MOMENTUM=0.5 expect_fail "written with another optimiser: momentum \\(--momentum\\): 0.9 in the checkpoint, 0.5 now" \
  cos_train 12 --checkpoint-dir "$E" --resume
out=$(cos_train 30 --checkpoint-dir "$E" --resume --allow-optimizer-change --summary-json "$SCRATCH/ext.json" 2>&1) ||
  fail "--allow-optimizer-change did not resume: $out"
grep -q "warning: --allow-optimizer-change: cosine horizon in iterations (--epochs, --max-iterations): 12 in the checkpoint, 30 now" <<<"$out" ||
  fail "no warning naming the old and new horizon: $out"
$PY -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['start_iteration'] == 12 and s['iterations'] == 30, s" \
  "$SCRATCH/ext.json"
echo "ok: the optimiser is checked on --resume (same flags bit-identical; a changed horizon refused or stated)"
# Disk full while checkpointing (emulated with a 12 MiB file-size limit, above what MPI start-up writes, below the
# 21 MB checkpoint of this MLP; SIGXFSZ ignored so write() fails with EFBIG): a warning, training goes on to the
# end, no partial file is left, the older checkpoints stay as they were.
F=$SCRATCH/ck-full
BIG=(train --data "$DATA" --model mlp --hidden 8192,256 --global-batch 32 --seed 5 --lr-schedule constant
     --checkpoint-dir "$F" --quiet)
"$LBBSP" "${BIG[@]}" --max-iterations 10 --checkpoint-every 5
before=$(md5sum "$F"/ckpt-*.h5)
out=$(trap '' XFSZ; ulimit -f 12288; "$LBBSP" "${BIG[@]}" --max-iterations 20 --checkpoint-every 5 --resume \
  --summary-json "$SCRATCH/full.json" 2>&1 || echo "EXIT $?")
[[ $out != *EXIT* ]] || fail "a failed checkpoint write must not end the run: $out"
grep -q "warning: checkpoint at iteration 15 not written" <<<"$out" || fail "expected a warning, got: $out"
grep -q "warning: checkpoint at iteration 20 not written" <<<"$out" || fail "expected a warning at the end: $out"
$PY -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['iterations'] == 20, s" "$SCRATCH/full.json"
[[ $(ckpts "$F") == "ckpt-000000000005.h5 ckpt-000000000010.h5 " ]] || fail "left behind: $(ls "$F")"
[[ $(md5sum "$F"/ckpt-*.h5) == "$before" ]] || fail "the older checkpoints changed"
echo "ok: disk full while checkpointing: warned, trained on, older checkpoints intact"
echo "checkpoint tests passed"
