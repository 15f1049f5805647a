#!/usr/bin/env bash
# The whole test suite on a fresh machine: the system packages it needs (installed when
# missing, or the exact install line), then every test of the workspace, the mpirun ones
# included (crates/tessera-mpirun).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-deps.sh
cargo test --workspace "$@"
