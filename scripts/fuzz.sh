#!/usr/bin/env bash
# Builds the coverage-guided fuzz targets in fuzz/ with the stable toolchain and runs
# each for SECONDS (default 60) on its committed corpus. Exits non-zero if a target
# crashes, hangs or runs out of memory; the input is left in fuzz/artifacts/TARGET/.
#
#   scripts/fuzz.sh                 # every target, 60 s each
#   scripts/fuzz.sh 600 session     # one target, 10 minutes
#
# No nightly and no cargo-fuzz needed: libfuzzer-sys builds libFuzzer with the C++
# compiler, and the coverage instrumentation is stable rustc codegen options (the
# ones cargo-fuzz passes). Address sanitizer is not used: braid-proto has no unsafe
# code, so a memory error cannot happen in it; panics, hangs and memory growth are
# what the targets catch.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(wire reseq handshake session)
command -v c++ >/dev/null || { echo "fuzz.sh: needs a C++ compiler (apt-get install g++)" >&2; exit 1; }
host=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# --target keeps the instrumentation out of build scripts and proc macros.
cargo build --release --quiet --target "$host" --bins
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log=$(mktemp)
    echo "== fuzz $t for ${secs}s"
    if ! "target/$host/release/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="artifacts/$t/" "corpus/$t" >"$log" 2>&1; then
        status=1
        echo "fuzz $t: FAILED; the last lines:"
        tail -40 "$log"
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz $t: ${runs:-?} executions in ${secs}s, ${cov:-cov: ?}, corpus $(ls "corpus/$t" | wc -l) inputs"
    rm -f "$log"
done
exit $status
