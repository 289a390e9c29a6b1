#!/usr/bin/env bash
# Installs every Debian package lbbsp needs (idempotent, non-interactive, as root or through sudo) and builds
# into build/ (the binary is build/lbbsp).
#   scripts/setup.sh [--no-build] [--extras] [--build-deps] [--check] [--target T] [-- extra cmake args]
#   --target builds one CMake target (e.g. lbbsp) instead of everything (tests, benchmarks).
#   --extras also installs what experiments, peers and Slurm tests need (PyTorch, stress-ng, Slurm, munge).
#   --build-deps only the packages the build needs (no data, Python, Slurm or clang: e.g. a GPU machine).
#   --check installs and builds nothing: prints "missing packages: ..." and exits 1 when any are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

build=1 extras=0 build_deps=0 check=0 cmake_args=() targets=()
while (($#)); do
  case $1 in
    --no-build) build=0 ;;
    --extras) extras=1 ;;
    --build-deps) build_deps=1 ;;
    --check) check=1 ;;
    --target) targets+=(--target "$2"); shift ;;
    --) shift; cmake_args=("$@"); break ;;
    *) echo "setup.sh: unknown option '$1' (use --no-build, --extras, --build-deps, --check, --target T, -- CMAKE_ARGS)" >&2; exit 2 ;;
  esac
  shift
done

build_packages=(
  build-essential cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-dev libeigen3-dev libopenblas-dev
  libhwloc-dev libcli11-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev zlib1g-dev
)
packages=("${build_packages[@]}"
  git ca-certificates hdf5-tools hwloc libgmock-dev googletest
  dataset-fashion-mnist python3 python3-numpy python3-h5py python3-statsmodels python3-matplotlib stress-ng
  python3-venv python3-pytest python3-pytest-xdist python3-torch ninja-build
  slurm-wlm munge iproute2
  clang libclang-rt-dev clang-format universal-ctags qemu-user
)
if ((build_deps)); then
  packages=("${build_packages[@]}")
elif ((extras)); then
  packages+=(python3-torch slurm-wlm munge iproute2)
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup.sh: run as root or install sudo" >&2; exit 1; }
  sudo=(sudo)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((check)); then
  ((${#missing[@]} == 0)) || { echo "missing packages: ${missing[*]}"; exit 1; }
  exit 0
fi
if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ((build)); then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}"
  cmake --build build -j "$(nproc)" "${targets[@]}"
fi
