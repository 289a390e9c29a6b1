#!/usr/bin/env bash
# Packs a CUDA build of lbbsp made on this Debian machine into one folder for a GPU machine that cannot build it:
# no network to install our Debian packages there (Open MPI, HDF5, hwloc, OpenBLAS), only a CUDA image.
#   dev/gpu_bundle.sh BUILD_DIR BUNDLE_DIR [V4_BUILD_DIR]
# BUNDLE_DIR/bin holds lbbsp, test_gpu_models, bench_gpu, bench_models and test_models_kernels (and stress-ng, for the co-tenants of
# dev/device_check.sh, when it is installed here); BUNDLE_DIR/wheels the Python package for python3.12;
# BUNDLE_DIR/root mirrors, at their absolute paths, every
# shared library they need (and Open MPI's launcher, plugins and help files), except glibc, libstdc++/libgcc and the
# CUDA libraries, which the GPU machine's own image provides (same CUDA major version: check `nvcc --version` on both).
# BUNDLE_DIR.tar.xz packs the folder. On the GPU machine, `dev/gpu_check.sh --bundle BUNDLE_DIR[.tar.xz]` copies root/ onto / without overwriting anything
# (a library already there with the same soname is ABI-compatible and wins), runs ldconfig and uses bin/.
# Build with -DLBBSP_PORTABLE=ON so that no -march=native code from this CPU reaches the other one.
# V4_BUILD_DIR (optional): a build configured with -DLBBSP_PORTABLE=ON -DCMAKE_CXX_FLAGS=-march=x86-64-v4 (the AVX-512
# kernels; it need not run here), whose bench_models and test_models_kernels go to BUNDLE_DIR/bin/x86-64-v4/ for
# device_check.sh's kernels step on a CPU with AVX-512:
#   cmake -S . -B build-v4 -DCMAKE_BUILD_TYPE=Release -DLBBSP_PORTABLE=ON -DCMAKE_CXX_FLAGS=-march=x86-64-v4 \
#     -DLBBSP_WITH_CUDA=OFF && cmake --build build-v4 --target bench_models test_models_kernels
set -euo pipefail
build=${1:?usage: gpu_bundle.sh BUILD_DIR BUNDLE_DIR}
bundle=${2:?usage: gpu_bundle.sh BUILD_DIR BUNDLE_DIR}
v4=${3:-}
bins=("$build/lbbsp" "$build/tests/test_gpu_models" "$build/bench/bench_gpu" "$build/bench/bench_models"
      "$build/tests/test_models_kernels")
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "gpu_bundle: $b missing: build it with: cmake --build $build --target lbbsp test_gpu_models bench_gpu bench_models test_models_kernels" >&2; exit 1; }
done
grep -q 'LBBSP_PORTABLE:BOOL=ON' "$build/CMakeCache.txt" ||
  echo "gpu_bundle: warning: $build was not configured with -DLBBSP_PORTABLE=ON (-march=native code may not run there)" >&2

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/root"
cp "${bins[@]}" "$bundle/bin/"
if [[ -n $v4 ]]; then
  v4_bins=("$v4/bench/bench_models" "$v4/tests/test_models_kernels")
  for b in "${v4_bins[@]}"; do [[ -x $b ]] || { echo "gpu_bundle: $b missing (see V4_BUILD_DIR above)" >&2; exit 1; }; done
  mkdir -p "$bundle/bin/x86-64-v4" && cp "${v4_bins[@]}" "$bundle/bin/x86-64-v4/"
  bins+=("${v4_bins[@]}")  # their libraries travel too
fi
# The Python package for the GPU machine's python3 (3.12 in its image; LBBSP_BUNDLE_PYTHON=PY for another): a
# portable wheel in BUNDLE_DIR/wheels, for lbbsp.torch's CUDA tests and benchmark (device_check.sh's torch step).
bundle_py=${LBBSP_BUNDLE_PYTHON:-}
if [[ -z $bundle_py ]]; then
  for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    "$c" -c 'import sys' 2>/dev/null && bundle_py=$c && break
  done
fi
wheel_libs=()
if [[ -z $bundle_py ]]; then
  echo "gpu_bundle: warning: no python3.12 here (LBBSP_BUNDLE_PYTHON=PY): the bundle has no lbbsp wheel" >&2
else
  "$bundle_py" -m pip wheel -q --no-deps -w "$bundle/wheels" "$(dirname "$0")/.." ||
    { echo "gpu_bundle: building the lbbsp wheel with $bundle_py failed" >&2; exit 1; }
  "$bundle_py" -m zipfile -e "$(ls "$bundle"/wheels/lbbsp-*.whl)" "$bundle/wheels/so"
  mapfile -t wheel_libs < <(find "$bundle/wheels/so" -name '*.so')  # its libraries (libgomp) travel too
fi
tools=()  # optional programs that travel with their libraries
command -v stress-ng >/dev/null && tools+=("$(command -v stress-ng)") && cp "${tools[@]}" "$bundle/bin/"
((${#tools[@]})) || echo "gpu_bundle: warning: no stress-ng here (apt-get install stress-ng): the bundle has none" >&2
root=$(realpath "$bundle/root")
# The commit the binaries were built from, for the results' provenance (the GPU machine's copy has no .git).
git -C "$(dirname "$0")/.." describe --always --dirty --abbrev=12 >"$bundle/commit.txt" 2>/dev/null || echo unknown >"$bundle/commit.txt"

# Open MPI as Debian lays it out: launcher, daemon, plugin and help-file folders (plugins are dlopen()ed from
# these compiled-in paths, so they keep them).
mpi_paths=(/usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info /usr/lib/x86_64-linux-gnu/openmpi
           /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi /usr/share/pmix /etc/openmpi)
for p in "${mpi_paths[@]}"; do
  # relative to / (cp -a --parents with absolute sources fails on the parent folders' attributes in coreutils 9.1)
  [[ -e $p ]] && (cd / && cp -a --parents "${p#/}" "$root/")
done

# Every shared library those programs and plugins load, by the name the loader asks for (symlinks resolved).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libpthread|libdl\.so|librt\.so|libutil|libresolv|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libnvidia)'
objects=("${bins[@]}" "${tools[@]}" "${wheel_libs[@]}" /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info)
mapfile -t plugins < <(find /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 -name '*.so' -type f)
objects+=("${plugins[@]}")
missing=()
while read -r name path; do
  [[ $name =~ $skip ]] && continue
  if [[ $path == "not" || -z $path ]]; then missing+=("$name"); continue; fi
  dest="$root$(realpath "$(dirname "$path")")/$name"  # /lib/... -> /usr/lib/...: /lib is a link on merged-/usr systems
  [[ -e $dest ]] || { mkdir -p "$(dirname "$dest")"; cp -L "$path" "$dest"; }
done < <(for o in "${objects[@]}"; do ldd "$o" 2>/dev/null; done | awk '$2 == "=>" {print $1, $3}' | sort -u)
# Plugins of optional transports (e.g. a PSM/UCX library absent here) may miss libraries; Open MPI skips them.
((${#missing[@]})) && echo "gpu_bundle: not found here (their plugins will be skipped): ${missing[*]}" >&2
find "$root" -name '*.a' -delete  # static archives of the copied folders: nothing loads them
rm -rf "$bundle/wheels/so"
# One compressed file to carry to the GPU machine (the folder is ~90 MB, most of it OpenBLAS's kernels).
tar -C "$(dirname "$bundle")" -cJf "$bundle.tar.xz" "$(basename "$bundle")"
echo "gpu_bundle: $bundle ($(du -sh "$bundle" | cut -f1), $(find "$root" -type f | wc -l) files under root/)" \
  "and $bundle.tar.xz ($(du -sh "$bundle.tar.xz" | cut -f1))"
