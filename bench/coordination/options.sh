# Shared by the bench/coordination scripts: `source options.sh NAME "$@"` after setting the defaults of ranks,
# iterations, lbbsp and out. Parses --ranks "N ...", --iterations K, --lbbsp PATH and --out DIR, checks the binary,
# and writes the synthetic dataset the runs train on to $out/data.h5 (MNIST-sized, so the gradient is ~1 MB).
bench_name=$1
shift
while (($#)); do
  case $1 in
    --ranks) ranks=$2; shift ;;
    --iterations) iterations=$2; shift ;;
    --lbbsp) lbbsp=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "$bench_name: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
[[ -x $lbbsp ]] || { echo "$bench_name: no lbbsp binary at '$lbbsp' (build first: scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$out"
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
"$lbbsp" data synth --samples 20000 --features 784 --classes 10 --seed 1 --out "$out/data.h5" >/dev/null
