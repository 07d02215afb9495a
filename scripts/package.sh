#!/usr/bin/env bash
# Builds the Debian package (docs/install.md): the release binary, then the man pages
# and shell completions generated from it (the same clap definitions as --help), then
# `cargo deb`, which packages them with the systemd unit and the example configs
# (crates/braid/Cargo.toml, [package.metadata.deb]). Extra arguments go to cargo deb
# (e.g. --output DIR). The package lands in $CARGO_TARGET_DIR/debian (default
# target/debian). Needs cargo-deb: cargo install cargo-deb --locked.
# BRAID_PACKAGE_NO_BUILD=1 packages the binary already in $CARGO_TARGET_DIR/release.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo deb --version >/dev/null 2>&1; then
    echo "scripts/package.sh: cargo-deb is not installed (cargo install cargo-deb --locked)" >&2
    exit 1
fi
target=${CARGO_TARGET_DIR:-target}
if [ -z "${BRAID_PACKAGE_NO_BUILD:-}" ]; then
    cargo build --release --locked -p braid
fi
bin="$target/release/braid"
assets="$target/release/package"
rm -rf "$assets"
mkdir -p "$assets/man" "$assets/completions"
"$bin" man "$assets/man"
gzip -9n "$assets"/man/*.1
"$bin" completions bash > "$assets/completions/braid.bash"
"$bin" completions zsh > "$assets/completions/_braid"
"$bin" completions fish > "$assets/completions/braid.fish"
cargo deb -p braid --no-build --strip "$@"
