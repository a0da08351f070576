#!/bin/sh
# Install R with the flexmix, mixtools and MASS packages from Debian when they are missing.
# Never fails: when R cannot be installed it says why, and `python -m bench.peers` then skips.
packages="r-base-core r-cran-flexmix r-cran-mixtools r-cran-mass"
check='suppressPackageStartupMessages({library(flexmix); library(mixtools); library(MASS)})'

if command -v Rscript >/dev/null 2>&1 && Rscript -e "$check" >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "bench-peers: R with flexmix and mixtools is missing and apt-get is not available"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "bench-peers: R with flexmix and mixtools is missing; installing it needs root" \
        "(apt-get install $packages)"
    exit 0
fi
echo "bench-peers: installing $packages"
log=$(mktemp)
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
if ! apt-get install -y --no-install-recommends $packages >"$log" 2>&1; then
    # shellcheck disable=SC2086
    if ! { apt-get update >>"$log" 2>&1 &&
        apt-get install -y --no-install-recommends $packages >>"$log" 2>&1; }; then
        echo "bench-peers: apt-get could not install R: $(tail -n 1 "$log")"
    fi
fi
rm -f "$log"
exit 0
