#!/usr/bin/env bash
# No function in runtime/, balancer/, predictors/, models/ is longer than 150 lines (docs/architecture.md,
# "Reading the code"). Universal Ctags gives each function's first and last line. CLI flag tables are the
# exception: add_*_command functions that only define flags (runtime/cli/*.cpp).
#   test_function_length.sh [LBBSP (unused)] [SCRATCH (unused)]   MAX_LINES=150 overrides the limit
set -euo pipefail
cd "${LBBSP_SOURCE_DIR:-$(dirname "$0")/../..}"
max=${MAX_LINES:-150}
command -v ctags >/dev/null || { echo "FAIL: ctags not found (apt-get install universal-ctags; scripts/setup.sh)"; exit 1; }
ctags --version | grep -q "Universal Ctags" || { echo "FAIL: ctags is not Universal Ctags (needs end: fields)"; exit 1; }

# One line per function: LENGTH NAME FILE:LINE
lengths=$(ctags --fields=+ne --kinds-c++=+f -R -f - runtime balancer predictors models |
  awk -F'\t' '{ line = ""; end = ""; kind = ""
    for (i = 4; i <= NF; i++) {
      if ($i ~ /^line:/) line = substr($i, 6)
      else if ($i ~ /^end:/) end = substr($i, 5)
      else if ($i == "f") kind = "f"
    }
    if (kind == "f" && end != "") print end - line + 1, $1, $2 ":" line }')
count=$(wc -l <<<"$lengths")
((count > 200)) || { echo "FAIL: ctags found only $count functions; the scan is broken"; exit 1; }
too_long=$(awk -v max="$max" '$1 > max && !($2 ~ /^add_[a-z_]+_command$/ && $3 ~ /^runtime\/cli\//)' <<<"$lengths" | sort -rn)
if [[ -n $too_long ]]; then
  echo "FAIL: functions over $max lines (split them into named steps):"
  echo "$too_long"
  exit 1
fi
longest=$(sort -rn <<<"$lengths" | awk 'NR == 1')  # awk reads it all: head would SIGPIPE sort (pipefail)
echo "ok: $count functions, none over $max lines (longest: $longest)"
