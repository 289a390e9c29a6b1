# Bad input everywhere: every `lbbsp train` flag, spec, trace file, dataset path and subcommand given a wrong value
# must fail with a non-zero exit and a message naming it (what test_train.sh and test_data.sh do not cover yet).
source "$(dirname "$0")/common.sh"
DATA=$SCRATCH/d.h5
"$LBBSP" data synth --samples 256 --features 16 --classes 3 --seed 1 --out "$DATA" >/dev/null
T=(train --data "$DATA" --global-batch 16 --max-iterations 2 --quiet)
"$LBBSP" "${T[@]}" || fail "the baseline command must succeed"  # so each failure below is the bad value's

# Numbers out of range (CLI11 checks and the trainer's own).
expect_fail "threads: 0 must be > 0" "$LBBSP" "${T[@]}" --threads 0
expect_fail "epochs: 0 must be > 0" "$LBBSP" "${T[@]}" --epochs 0
expect_fail "lr: -1 must be > 0" "$LBBSP" "${T[@]}" --lr -1
expect_fail "lr: 'nan' is not a finite number" "$LBBSP" "${T[@]}" --lr nan
expect_fail "lr: 'inf' is not a finite number" "$LBBSP" "${T[@]}" --lr inf
expect_fail "momentum: Value 2 not in range" "$LBBSP" "${T[@]}" --momentum 2
expect_fail "weight-decay: -1 must be >= 0" "$LBBSP" "${T[@]}" --weight-decay -1
expect_fail "warmup-iterations: -5 must be >= 0" "$LBBSP" "${T[@]}" --warmup-iterations -5
expect_fail "hidden: widths must be positive, got 0" "$LBBSP" "${T[@]}" --hidden 0
expect_fail "Could not convert: --hidden = 32,abc" "$LBBSP" "${T[@]}" --hidden 32,abc
expect_fail "bind: socket not in \{core,none\}" "$LBBSP" "${T[@]}" --bind socket
expect_fail "device: tpu not in" "$LBBSP" "${T[@]}" --device tpu
# Idle kernel threads spin a bounded time unless the user chose how they wait (runtime/platform/kernel_env.hpp).
SPIN_INFO=$(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$LBBSP" info)
grep -Eq "^blas kernels: OpenBLAS [A-Za-z0-9]+; idle OpenMP threads: spin [0-9]+ times, then sleep$" <<<"$SPIN_INFO" ||
  fail "lbbsp info does not show the bounded spin of idle kernel threads: $SPIN_INFO"
OMP_WAIT_POLICY=passive "$LBBSP" info | grep -q "idle OpenMP threads: passive$" ||
  fail "lbbsp info does not keep the user's OMP_WAIT_POLICY=passive"
# --device cuda where it cannot run: the message says why and what to do instead.
INFO=$("$LBBSP" info)
grep -q "^mpi and GPU memory: " <<<"$INFO" || fail "lbbsp info does not say whether MPI can reduce GPU memory"
grep -q "^nodes: 1, ranks per node 1-1$" <<<"$INFO" || fail "lbbsp info on one process: expected 'nodes: 1, ranks per node 1-1'"
if grep -q "^cuda backend: not built" <<<"$INFO"; then
  expect_fail "device cuda: lbbsp was built without CUDA \(configure with -DLBBSP_WITH_CUDA=ON" "$LBBSP" "${T[@]}" --device cuda
elif grep -q "^cuda backend: built, 0 GPU" <<<"$INFO"; then
  expect_fail "device cuda: no CUDA GPU visible .*or train with --device cpu" "$LBBSP" "${T[@]}" --device cuda
fi  # a visible GPU: --device cuda trains (tests/gpu, dev/gpu_check.sh)
expect_fail "gpu-params: gpu not in" "$LBBSP" "${T[@]}" --gpu-params gpu
expect_fail "gpu-allreduce: nccl not in" "$LBBSP" "${T[@]}" --gpu-allreduce nccl
expect_fail "gpu-allreduce cuda-aware needs the gradient on the GPU: use it with --gpu-params device" \
  "$LBBSP" "${T[@]}" --gpu-params host --gpu-allreduce cuda-aware
expect_fail "eval-every: -1 must be >= 0" "$LBBSP" "${T[@]}" --eval-every -1
expect_fail "iteration-timeout: 0 must be > 0" "$LBBSP" "${T[@]}" --iteration-timeout 0
expect_fail "checkpoint-every: 0 must be > 0" "$LBBSP" "${T[@]}" --checkpoint-every 0
expect_fail "checkpoint-keep: 0 must be > 0" "$LBBSP" "${T[@]}" --checkpoint-keep 0
expect_fail "max-iterations: -1 must be >= 0" "$LBBSP" "${T[@]}" --max-iterations -1
expect_fail "train-subset: -3 must be >= 0" "$LBBSP" "${T[@]}" --train-subset -3
expect_fail "min-batch: -1 must be >= 0" "$LBBSP" "${T[@]}" --min-batch -1
expect_fail "target-accuracy: Value 1.5 not in range" "$LBBSP" "${T[@]}" --target-accuracy 1.5
expect_fail "global-batch: 'abc' is not a finite number" "$LBBSP" "${T[@]}" --global-batch abc
expect_fail "seed: -1 must be >= 0" "$LBBSP" "${T[@]}" --seed -1
expect_fail "min batch 100 x 1 workers exceeds the global batch 16" "$LBBSP" "${T[@]}" --min-batch 100
expect_fail "--lr-schedule: EVERY must be positive \(in .step:0:0.1." "$LBBSP" "${T[@]}" --lr-schedule step:0:0.1
expect_fail "inject-fault: expected RANK:ITERATION:KIND \(in 'x'" "$LBBSP" "${T[@]}" --inject-fault x
expect_fail "inject-fault: KIND must be .*\(in '0:1:explode'" "$LBBSP" "${T[@]}" --inject-fault 0:1:explode
expect_fail "checkpoint-every needs --checkpoint-dir" "$LBBSP" "${T[@]}" --checkpoint-every 5
expect_fail "resume needs --checkpoint-dir" "$LBBSP" "${T[@]}" --resume
expect_fail "allow-optimizer-change applies to --resume only" "$LBBSP" "${T[@]}" --allow-optimizer-change
touch "$SCRATCH/afile"
expect_fail "checkpoint-dir: cannot create folder '$SCRATCH/afile/ck'" "$LBBSP" "${T[@]}" --checkpoint-dir "$SCRATCH/afile/ck"
expect_fail "save-params: cannot write .*does not exist" "$LBBSP" "${T[@]}" --save-params /nonexistent/p.h5
expect_fail "timeline: cannot write .*does not exist" "$LBBSP" "${T[@]}" --timeline /nonexistent/t.json
expect_fail "timeline-iterations needs --timeline FILE" "$LBBSP" "${T[@]}" --timeline-iterations 0:5
expect_fail "timeline-iterations '5': expected FIRST:END" "$LBBSP" "${T[@]}" --timeline "$SCRATCH/t.json" \
  --timeline-iterations 5
expect_fail "timeline-iterations '9:3': END must be larger than FIRST" "$LBBSP" "${T[@]}" \
  --timeline "$SCRATCH/t.json" --timeline-iterations 9:3
# Counts ride in the float reduction buffer: exact only up to 2^24, so a larger global batch is refused up front.
expect_fail "global-batch 16777217 is above 16777216 \(2\^24\)" "$LBBSP" train --data "$DATA" \
  --global-batch 16777217 --max-iterations 2 --quiet
expect_fail "log-dir: cannot create .*afile.: Not a directory" "$LBBSP" "${T[@]}" --log-dir "$SCRATCH/afile"

# Straggle specs.
expect_fail "straggle: empty spec" "$LBBSP" "${T[@]}" --straggle ""
expect_fail "straggle: option 'scale' needs KEY=VALUE" "$LBBSP" "${T[@]}" --straggle "static:1;scale"
expect_fail "straggle: unknown option 'speed'" "$LBBSP" "${T[@]}" --straggle "static:1;speed=2"
expect_fail "straggle: scale must be > 0" "$LBBSP" "${T[@]}" --straggle "static:1;scale=0"
expect_fail "straggle: noise must be >= 0" "$LBBSP" "${T[@]}" --straggle "static:1;noise=-1"
expect_fail "straggle: static needs factors" "$LBBSP" "${T[@]}" --straggle "static:"
expect_fail "straggle: static factor 0 must be in \(0, 1\]" "$LBBSP" "${T[@]}" --straggle "static:1,0"
expect_fail "straggle: gpu profile '1:2:3' must be FLOOR:SAT:SLOPE:CAP" "$LBBSP" "${T[@]}" --straggle "static:1;gpu=1:2:3"
expect_fail "straggle: gpu profile .0.1:-4:0.001:100. needs FLOOR, SAT, SLOPE >= 0 and CAP >= 1" "$LBBSP" "${T[@]}" --straggle "static:1;gpu=0.1:-4:0.001:100"
expect_fail "straggle: .*'x' is not a number" "$LBBSP" "${T[@]}" --straggle "static:1;gpu=x:1:1:1"
expect_fail "straggle: stress rank 5 is not in 0..0" "$LBBSP" "${T[@]}" --straggle "stress:5=50"
expect_fail "straggle: stress load must be 1..100 percent" "$LBBSP" "${T[@]}" --straggle "stress:0=200"
expect_fail "straggle: stress entry '0' must be RANK=LOAD" "$LBBSP" "${T[@]}" --straggle "stress:0"

# Trace files: NaN, Inf, empty, header only, missing file.
printf 'time_s,capacity\n0,0.5\n1,nan\n' >"$SCRATCH/nan.csv"
: >"$SCRATCH/empty.csv"
printf 'time_s,capacity\n' >"$SCRATCH/header.csv"
expect_fail "nan.csv:3: bad capacity value .nan." "$LBBSP" "${T[@]}" --straggle "trace:$SCRATCH/nan.csv"
printf 'time_s,capacity\n0,inf\n' >"$SCRATCH/inf.csv"
expect_fail "inf.csv:2: bad capacity value 'inf'" "$LBBSP" "${T[@]}" --straggle "trace:$SCRATCH/inf.csv"
# (A negative capacity in a plain CSV is clamped to the floor, as README documents, not refused.)
expect_fail "empty.csv: empty trace file" "$LBBSP" "${T[@]}" --straggle "trace:$SCRATCH/empty.csv"
expect_fail "header.csv:1: csv file has a header but no rows" "$LBBSP" "${T[@]}" --straggle "trace:$SCRATCH/header.csv"
expect_fail "no such trace file or directory" "$LBBSP" "${T[@]}" --straggle "trace:$SCRATCH/missing.csv"

# Dataset paths and files.
expect_fail "data: File does not exist" "$LBBSP" train --data "$SCRATCH/none.h5"
expect_fail "data: File is actually a directory" "$LBBSP" train --data "$SCRATCH"
: >"$SCRATCH/empty.h5"
expect_fail "empty.h5' is not a readable HDF5 file" "$LBBSP" train --data "$SCRATCH/empty.h5"
expect_fail "--data is required" "$LBBSP" train --model logreg

# Subcommands and flags that do not exist.
expect_fail "A subcommand is required" "$LBBSP" nosuch
expect_fail "frobnicate" "$LBBSP" "${T[@]}" --frobnicate
expect_fail "samples: 0 must be > 0" "$LBBSP" data synth --samples 0 --features 4 --out "$SCRATCH/x.h5"
expect_fail "out.*required" "$LBBSP" data synth --samples 10 --features 4
echo "bad input tests passed"
