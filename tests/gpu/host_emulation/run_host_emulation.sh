#!/usr/bin/env bash
# Checks the CUDA backend's logic on a machine WITHOUT a GPU: builds tests/gpu/test_gpu_models.cpp against
# models/cuda/ with the CUDA runtime and cuBLAS emulated on the host (include/: memory is host memory, kernels run
# thread by thread on the CPU, cublasSgemm is OpenBLAS's column-major sgemm) and runs it. It checks indexing,
# layouts, the row-major/column-major GEMM mapping, buffer sizes and the CudaModel orchestration against the CPU
# models; it cannot check real GPU behaviour (races, launch limits, performance), which needs dev/gpu_check.sh.
#   tests/gpu/host_emulation/run_host_emulation.sh CPU_ONLY_BUILD_DIR [WORK_DIR] [-- gtest args]
# CPU_ONLY_BUILD_DIR: a build configured with -DLBBSP_WITH_CUDA=OFF where lbbsp_models is built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
build=$(cd "${1:?usage: run_host_emulation.sh CPU_ONLY_BUILD_DIR [WORK_DIR] [-- gtest args]}" && pwd)
work=${2:-$build/cuda_host_emulation}
shift $(($# >= 2 ? 2 : 1))
[[ ${1:-} == -- ]] && shift
lib=$build/models/liblbbsp_models.a
[[ -f $lib ]] || { echo "run_host_emulation: $lib missing (cmake --build $build --target lbbsp_models)" >&2; exit 1; }
if grep -q "LBBSP_WITH_CUDA:STRING=ON" "$build/CMakeCache.txt" 2>/dev/null; then
  echo "run_host_emulation: $build has the CUDA backend ON; give a -DLBBSP_WITH_CUDA=OFF build" >&2
  exit 1
fi
mkdir -p "$work"
flags=(-std=c++20 -O2 -fopenmp -I"$here/include" -I"$repo" $(pkg-config --cflags openblas))
objects=()
compile() {  # SRC OBJ [extra flags]
  local src=$1 obj=$2
  shift 2
  if [[ ! -f $obj || $src -nt $obj || $(find "$here/include" "$repo/models/cuda" -newer "$obj" | head -n 1) ]]; then
    g++ "${flags[@]}" "$@" -c "$src" -o "$obj"
  fi
  objects+=("$obj")
}
for cu in "$repo"/models/cuda/*.cu; do
  name=$(basename "$cu" .cu)
  python3 "$here/cu_to_host.py" "$cu" >"$work/$name.cu.cpp"
  compile "$work/$name.cu.cpp" "$work/$name.cu.o"
done
for cpp in "$repo"/models/cuda/*.cpp; do compile "$cpp" "$work/$(basename "$cpp" .cpp).o"; done
compile "$here/emu_dispatch.cpp" "$work/emu_dispatch.o"
compile "$repo/tests/gpu/test_gpu_models.cpp" "$work/test_gpu_models.o" -Dmake_model=emu_make_model
g++ -fopenmp "${objects[@]}" "$lib" $(pkg-config --libs openblas) -lgtest -lgtest_main -lpthread \
  -o "$work/test_gpu_models_emulated"
"$work/test_gpu_models_emulated" "$@"
