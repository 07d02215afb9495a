#!/usr/bin/env bash
# Runs every test of the workspace. Tests that need root and network namespaces run
# when they can and say why they are skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --release "$@"
