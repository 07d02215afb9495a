#!/usr/bin/env bash
# Runs every test of the workspace (what CI runs). Tests that need root, network
# namespaces or outside tools run when they can; when they cannot, they record why in
# $BRAID_SKIP_LOG and this script counts them as skipped, not passed.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
BRAID_SKIP_LOG=$(mktemp)
export BRAID_SKIP_LOG
trap 'rm -f "$log" "$BRAID_SKIP_LOG"' EXIT
status=0
cargo test --workspace --release "$@" 2>&1 | tee "$log" || status=$?
# One closing line for the whole run, summed over every test binary; a test that
# returned early because it could not run is moved from passed to skipped.
skipped_here=$(grep -c . "$BRAID_SKIP_LOG" || true)
if [ "$skipped_here" -gt 0 ]; then
    echo "skipped (could not run here):"
    sed 's/^/  /' "$BRAID_SKIP_LOG"
fi
awk -v extra="$skipped_here" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1); if ($i ~ /^ignored;?$/) s += $(i-1) } }
     END { printf "%d passed, %d failed, %d skipped\n", p - extra, f, s + extra }' "$log"
exit $status
