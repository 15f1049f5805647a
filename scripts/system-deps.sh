#!/usr/bin/env bash
# The system packages the test suite builds and runs against: Open MPI and libclang (the `mpi`
# feature's build: mpi-sys runs bindgen) and Graphviz (`Lowered::svg`). Present: nothing to
# do. Missing: installed here as root with apt-get, or this fails with the exact install line.
set -euo pipefail

packages=(libopenmpi-dev openmpi-bin libclang-dev graphviz)

have_all() {
    command -v mpirun >/dev/null 2>&1 &&
        command -v mpicc >/dev/null 2>&1 &&
        command -v dot >/dev/null 2>&1 &&
        compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null
}

if have_all; then
    exit 0
fi
line="sudo apt-get update && sudo apt-get install -y ${packages[*]}"
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "scripts/system-deps.sh: the test suite needs Open MPI, libclang and Graphviz; install them with:" >&2
    echo "  $line" >&2
    exit 1
fi
echo "scripts/system-deps.sh: installing ${packages[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Under `timeout`: a held dpkg lock or a dead mirror fails the run instead of hanging it.
timeout 600 apt-get update -qq
timeout 1200 apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
if ! have_all; then
    echo "scripts/system-deps.sh: apt-get ran, but Open MPI, libclang or Graphviz is still missing; install them with:" >&2
    echo "  $line" >&2
    exit 1
fi
