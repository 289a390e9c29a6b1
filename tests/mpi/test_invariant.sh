# The balancing invariant: the same parameters for -np 1, 2 and 4 under random per-iteration batch vectors
# (zero-size slices included), up to float summation order. Logistic regression over a whole epoch; MLP and CNN
# over 10 iterations (momentum amplifies rounding chaotically beyond that).
source "$(dirname "$0")/../cli/common.sh"
DATA=$SCRATCH/synth.h5
"$LBBSP" data synth --samples 4096 --features 784 --classes 10 --seed 3 --out "$DATA" >/dev/null
COMPARE="/usr/bin/python3 $(dirname "$0")/../tools/compare_params.py"

run() {  # run NP MODEL ITERATIONS BALANCER OUT
  mpirun_n "$1" "$LBBSP" train --data "$DATA" --model "$2" --epochs 1 --global-batch 64 --lr 0.05 --momentum 0.9 \
    --max-iterations "$3" --balancer "$4" --seed 11 --quiet --save-params "$5" --test-subset 256
}

# Logistic regression over a full epoch (4096/64 = 64 iterations).
run 1 logreg 0 bsp "$SCRATCH/logreg1.h5"
for np in 2 4; do
  run $np logreg 0 random:$np "$SCRATCH/logreg$np.h5"
  $COMPARE "$SCRATCH/logreg1.h5" "$SCRATCH/logreg$np.h5" 1e-5
done

for model in mlp cnn; do
  run 1 $model 10 bsp "$SCRATCH/${model}1.h5"
  for np in 2 4; do
    run $np $model 10 random:$((np + 5)) "$SCRATCH/$model$np.h5"
    $COMPARE "$SCRATCH/${model}1.h5" "$SCRATCH/$model$np.h5" 1e-5
  done
done

# The test can fail: a different seed must give different parameters.
mpirun_n 1 "$LBBSP" train --data "$DATA" --model logreg --epochs 1 --global-batch 64 --lr 0.05 --max-iterations 10 \
  --seed 12 --quiet --save-params "$SCRATCH/other.h5" --test-subset 256
if $COMPARE "$SCRATCH/logreg1.h5" "$SCRATCH/other.h5" 1e-5 >/dev/null; then fail "different seeds gave equal parameters"; fi
echo "invariant holds"
