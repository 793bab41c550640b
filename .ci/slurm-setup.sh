#!/usr/bin/env bash
# Idempotent install of the SLURM toolchain (Debian packages) for the test suite, plus iproute2
# (`ip`), which the two-node tests use to make network namespace hosts (tests/netns_hosts.py).
# The suite's fixtures start the daemons themselves (config in a temp dir); this script only
# makes the binaries available. It must never fail a CI run: when it cannot install
# (not root, no apt, no network) it says why and exits 0, and the SLURM tests then skip with a reason.
set -u

PACKAGES="slurmctld slurmd slurm-client munge iproute2"
BINARIES="slurmctld slurmd sinfo sbatch srun scontrol squeue scancel munged munge ip"

missing_binaries() {
    local missing=""
    for b in $BINARIES; do
        if ! command -v "$b" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$b" ] && [ ! -x "/sbin/$b" ]; then
            missing="$missing $b"
        fi
    done
    echo "$missing"
}

missing="$(missing_binaries)"
if [ -z "$missing" ]; then
    echo "slurm-setup: SLURM, munge and iproute2 already installed"
    exit 0
fi
echo "slurm-setup: missing:$missing"
# nsenter, unshare and mount (util-linux, mount) are essential packages on Debian: always there.

if [ "$(id -u)" != "0" ]; then
    echo "slurm-setup: not root, cannot install $PACKAGES; SLURM tests will skip"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "slurm-setup: apt-get not available, cannot install $PACKAGES; SLURM tests will skip"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -qq; then
    echo "slurm-setup: apt-get update failed; SLURM tests will skip"
    exit 0
fi
# shellcheck disable=SC2086
if ! apt-get install -y -qq --no-install-recommends $PACKAGES; then
    echo "slurm-setup: apt-get install $PACKAGES failed; SLURM tests will skip"
    exit 0
fi

missing="$(missing_binaries)"
if [ -n "$missing" ]; then
    echo "slurm-setup: still missing after install:$missing; SLURM tests will skip"
else
    echo "slurm-setup: installed $PACKAGES"
fi
exit 0
