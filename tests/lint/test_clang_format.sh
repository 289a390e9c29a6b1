#!/usr/bin/env bash
# The tracked C++ and CUDA sources (*.cpp *.hpp *.h *.cu *.cuh) are formatted as .clang-format says: Debian's
# clang-format 14 (apt-get install clang-format; scripts/setup.sh), `--dry-run --Werror` on each file.
#   test_clang_format.sh [LBBSP (unused)] [SCRATCH (unused)]   CLANG_FORMAT=path overrides the binary
# Fix what it names with `clang-format -i FILE` (the same major version: another one formats some lines otherwise).
set -euo pipefail
cd "${LBBSP_SOURCE_DIR:-$(dirname "$0")/../..}"
CF=${CLANG_FORMAT:-clang-format}
command -v "$CF" >/dev/null || { echo "FAIL: $CF not found (apt-get install clang-format; scripts/setup.sh)"; exit 1; }
mapfile -t files < <(git ls-files -- '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh')
((${#files[@]} > 100)) || { echo "FAIL: git ls-files found only ${#files[@]} C++ files; the scan is broken"; exit 1; }
bad=()
for f in "${files[@]}"; do
  "$CF" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "FAIL: ${#bad[@]} of ${#files[@]} files not formatted as .clang-format says ($("$CF" --version)); run clang-format -i on:"
  printf '  %s\n' "${bad[@]}"
  echo "first differences:"
  "$CF" --dry-run "${bad[0]}" 2>&1 | head -20
  exit 1
fi
echo "ok: ${#files[@]} files formatted ($("$CF" --version))"
