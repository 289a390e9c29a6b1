#!/usr/bin/env bash
# The installable core as a downstream project sees it: a core-only build configures with MPI and HDF5 hidden,
# `cmake --install` puts lbbsp::core, its headers and the CMake package into a prefix, and examples/consumer
# (find_package(lbbsp 0.1 CONFIG REQUIRED), target_link_libraries(... lbbsp::core)) builds and runs against it.
# $1 = lbbsp (unused), $2 = scratch folder.
set -euo pipefail
SRC=${LBBSP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
SCRATCH=$2
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
fail() { echo "FAIL: $*" >&2; exit 1; }

# Core only, with find_package(MPI) and find_package(HDF5) made to fail if anything still asks for them.
cmake -S "$SRC" -B "$SCRATCH/core" -DCMAKE_BUILD_TYPE=Release -DLBBSP_CORE_ONLY=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_HDF5=ON -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON >"$SCRATCH/core-configure.log" || {
  cat "$SCRATCH/core-configure.log"; fail "core-only configure"; }
cmake --build "$SCRATCH/core" -j "$(nproc)" >"$SCRATCH/core-build.log" || { tail -30 "$SCRATCH/core-build.log"; fail "core build"; }
cmake --install "$SCRATCH/core" --prefix "$SCRATCH/prefix" >"$SCRATCH/install.log"

P=$SCRATCH/prefix
for f in include/lbbsp/core.hpp include/lbbsp/version.hpp include/lbbsp/balancer/balancer.hpp \
  include/lbbsp/balancer/sampling.hpp include/lbbsp/predictors/predictor.hpp lib/liblbbsp_core.a \
  lib/cmake/lbbsp/lbbspConfig.cmake lib/cmake/lbbsp/lbbspConfigVersion.cmake lib/cmake/lbbsp/lbbspTargets.cmake; do
  [[ -f $P/$f ]] || fail "not installed: $f ($(cd "$P" && find . -type f | tr '\n' ' '))"
done
[[ ! -e $P/bin/lbbsp ]] || fail "a core-only install holds the lbbsp command"
# The link interface a consumer inherits: OpenMP only, no MPI, HDF5, hwloc, CLI11, JSON or Eigen.
iface=$(grep -A3 'INTERFACE_LINK_LIBRARIES' "$P/lib/cmake/lbbsp/lbbspTargets.cmake")
grep -q OpenMP <<<"$iface" || fail "lbbsp::core's interface should name OpenMP: $iface"
if grep -qiE 'mpi|hdf5|hwloc|cli11|nlohmann|eigen' <<<"$iface"; then fail "lbbsp::core leaks a dependency: $iface"; fi
if grep -rqE '#include [<"](mpi|hdf5|CLI|nlohmann|Eigen)' "$P/include"; then fail "installed headers include a runtime dependency"; fi

cmake -S "$SRC/examples/consumer" -B "$SCRATCH/consumer" -DCMAKE_PREFIX_PATH="$P" >"$SCRATCH/consumer-configure.log" ||
  { cat "$SCRATCH/consumer-configure.log"; fail "consumer configure"; }
grep -q "found lbbsp 0.1" "$SCRATCH/consumer-configure.log" || fail "consumer did not report the found version"
cmake --build "$SCRATCH/consumer" >"$SCRATCH/consumer-build.log" || { cat "$SCRATCH/consumer-build.log"; fail "consumer build"; }
out=$("$SCRATCH/consumer/balance_loop") || fail "consumer checks: $out"
grep -q "consumer checks passed" <<<"$out" || fail "consumer output: $out"

# The version file refuses an incompatible request (0.x: same major.minor only).
if cmake -S "$SRC/examples/consumer" -B "$SCRATCH/consumer-v9" -DCMAKE_PREFIX_PATH="$P" -DLBBSP_WANT_VERSION=9.0 \
  >"$SCRATCH/v9.log" 2>&1; then fail "find_package(lbbsp 9.0) succeeded against 0.1"; fi
grep -q "with requested version \"9.0\"" "$SCRATCH/v9.log" || fail "version refusal message: $(tail -5 "$SCRATCH/v9.log")"
echo "install consumer test passed: $out"
