#!/usr/bin/env bash
# Runs every test of the workspace (what CI runs). Tests that need root and network
# namespaces run when they can and say why they are skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --release "$@" 2>&1 | tee "$log" || status=$?
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1); if ($i ~ /^ignored;?$/) s += $(i-1) } }
     END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' "$log"
grep -h "^SKIPPED" "$log" || true
exit $status
