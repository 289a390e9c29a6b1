# `lbbsp data`: Fashion-MNIST import (real files from Debian's dataset-fashion-mnist), synth, and bad input.
source "$(dirname "$0")/common.sh"
SRC=/usr/share/datasets/fashion-mnist
[[ -f $SRC/train-images-idx3-ubyte.gz ]] || fail "Debian's dataset-fashion-mnist is missing; run scripts/setup.sh"

"$LBBSP" data import-fashion-mnist --out "$SCRATCH/f.h5"
h5dump -H "$SCRATCH/f.h5" >"$SCRATCH/header.txt"
grep -q 'DATASET "images"' "$SCRATCH/header.txt" || fail "no images dataset"
/usr/bin/python3 - "$SCRATCH/f.h5" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
assert f["train/images"].shape == (60000, 28, 28) and f["train/images"].dtype == np.uint8, f["train/images"]
assert f["train/labels"].shape == (60000,) and f["test/images"].shape == (10000, 28, 28)
labels = f["train/labels"][:]
assert labels.max() == 9 and np.all(np.bincount(labels) == 6000), np.bincount(labels)
names = [n.decode() if isinstance(n, bytes) else n for n in f.attrs["class_names"]]
assert names[0] == "T-shirt/top" and names[9] == "Ankle boot", names
assert "Fashion-MNIST" in (f.attrs["source"].decode() if isinstance(f.attrs["source"], bytes) else f.attrs["source"])
print("fashion-mnist HDF5 layout ok")
PY

"$LBBSP" data synth --samples 500 --features 20 --classes 3 --seed 5 --out "$SCRATCH/s.h5"
"$LBBSP" data synth --samples 50 --features 4 --classes 2 --out "$SCRATCH/new/folder/n.h5"  # folders created
[[ -f $SCRATCH/new/folder/n.h5 ]] || fail "synth into a missing folder wrote nothing"
/usr/bin/python3 - "$SCRATCH/s.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r")
assert f["train/images"].shape == (500, 20), f["train/images"].shape
assert set(f["train/labels"][:]) == {0, 1, 2}
print("synth layout ok")
PY

# Bad input: each names the file and the problem, exit non-zero.
mkdir -p "$SCRATCH/bad"
cp $SRC/*.gz "$SCRATCH/bad/"
head -c 100000 $SRC/train-images-idx3-ubyte.gz >"$SCRATCH/bad/train-images-idx3-ubyte.gz"
expect_fail "train-images-idx3-ubyte.gz.*(truncated|not a valid)" "$LBBSP" data import-fashion-mnist --src "$SCRATCH/bad" --out "$SCRATCH/x.h5"
cp $SRC/train-labels-idx1-ubyte.gz "$SCRATCH/bad/train-images-idx3-ubyte.gz"
expect_fail "train-images-idx3-ubyte.gz.*bad magic" "$LBBSP" data import-fashion-mnist --src "$SCRATCH/bad" --out "$SCRATCH/x.h5"
expect_fail "no 'train-images-idx3-ubyte\[.gz\]' in '/nonexistent'" "$LBBSP" data import-fashion-mnist --src /nonexistent --out "$SCRATCH/x.h5"
[[ ! -e $SCRATCH/x.h5 ]] || fail "a failed import left an output file"
touch "$SCRATCH/plainfile"
expect_fail "cannot create the folder '$SCRATCH/plainfile/sub'" "$LBBSP" data synth --samples 10 --features 4 --classes 2 --out "$SCRATCH/plainfile/sub/z.h5"
expect_fail "classes" "$LBBSP" data synth --samples 10 --features 4 --classes 1 --out "$SCRATCH/y.h5"

# Training on broken datasets.
echo "not hdf5" >"$SCRATCH/garbage.h5"
expect_fail "garbage.h5' is not a readable HDF5 file" "$LBBSP" train --data "$SCRATCH/garbage.h5" --model logreg
head -c 3000 "$SCRATCH/s.h5" >"$SCRATCH/trunc.h5"
expect_fail "trunc.h5" "$LBBSP" train --data "$SCRATCH/trunc.h5" --model logreg
/usr/bin/python3 - "$SCRATCH" <<'PY'
import sys, h5py, numpy as np
d = sys.argv[1]
with h5py.File(d + "/labels.h5", "w") as f:  # a label out of range for the declared classes
    f["train/images"] = np.zeros((10, 4), np.uint8); f["train/labels"] = np.array([0, 1, 7] + [0] * 7, np.uint8)
    f["test/images"] = np.zeros((2, 4), np.uint8); f["test/labels"] = np.zeros(2, np.uint8)
    f.attrs["num_classes"] = 3
with h5py.File(d + "/shape.h5", "w") as f:  # labels do not match images
    f["train/images"] = np.zeros((10, 4), np.uint8); f["train/labels"] = np.zeros(9, np.uint8)
    f["test/images"] = np.zeros((2, 4), np.uint8); f["test/labels"] = np.zeros(2, np.uint8)
with h5py.File(d + "/notest.h5", "w") as f:
    f["train/images"] = np.zeros((10, 4), np.uint8); f["train/labels"] = np.arange(10, dtype=np.uint8) % 2
PY
expect_fail "labels.h5.*/train/labels\[2\] = 7 is out of range for num_classes = 3" "$LBBSP" train --data "$SCRATCH/labels.h5" --model logreg --global-batch 2
expect_fail "shape.h5.*/train/labels must have shape \(10,\)" "$LBBSP" train --data "$SCRATCH/shape.h5" --model logreg
expect_fail "notest.h5' has no dataset '/test/images'" "$LBBSP" train --data "$SCRATCH/notest.h5" --model logreg

# export-traces: the replay's reader, as CSV (times in the trace's own clock, capacities clamped to [0.02, 1] as read).
mkdir -p "$SCRATCH/tr/pl"
printf "0\n50\n100\n" >"$SCRATCH/tr/pl/vm,a"
printf "m_1,600,25,40,,,1,1,1\nm_1,60,75,40,,,1,1,1\nm_2,60,0,40,,,1,1,1\n" | gzip >"$SCRATCH/tr/alibaba.csv.gz"
"$LBBSP" data export-traces --traces "$SCRATCH/tr" --out "$SCRATCH/tr.csv" || fail "export-traces failed"
got=$(cat "$SCRATCH/tr.csv")
want="series,family,time_s,capacity
\"$SCRATCH/tr/alibaba.csv.gz#m_1\",alibaba,60,0.25
\"$SCRATCH/tr/alibaba.csv.gz#m_1\",alibaba,600,0.75
\"$SCRATCH/tr/alibaba.csv.gz#m_2\",alibaba,60,1
\"$SCRATCH/tr/pl/vm,a\",planetlab,0,1
\"$SCRATCH/tr/pl/vm,a\",planetlab,300,0.5
\"$SCRATCH/tr/pl/vm,a\",planetlab,600,0.02"
[[ $got == "$want" ]] || fail "export-traces wrote:
$got
expected:
$want"
[[ $("$LBBSP" data export-traces --traces "$SCRATCH/tr/pl") == "$(grep -e '^series' -e planetlab "$SCRATCH/tr.csv")" ]] ||
  fail "export-traces to standard output differs from --out"
expect_fail "cannot write '/nonexistent/x.csv' \(--out\)" "$LBBSP" data export-traces --traces "$SCRATCH/tr" \
  --out /nonexistent/x.csv
expect_fail "/nonexistent/traces" "$LBBSP" data export-traces --traces /nonexistent/traces
echo "ok: data export-traces"
echo "data tests passed"
