#!/usr/bin/env bash
# The thread storm (tests/storm.py) as BENCHMARKS.md's reliability table runs it: 16 threads x
# 50 calls, three runs with a fresh tuning cache each at the default CONVTUNE_SPIN_US (polling
# waits) and three at 0 (waits that block), then three each with CONVTUNE_TUNE=cached (on the
# last run's cache) and CONVTUNE_TUNE=off, at both spins. One closing line per run; stops
# starting runs after LIMIT_S seconds (default 540).
# Usage: benches/storm_runs.sh [threads] [calls]
set -uo pipefail
cd "$(dirname "$0")/.."
threads=${1:-16}
calls=${2:-50}
limit=${LIMIT_S:-540}
start=$SECONDS
fails=0
one() {  # label, then env assignments
  local label=$1; shift
  if (( SECONDS - start > limit )); then echo "$label: not run (time limit)"; return; fi
  local out
  out=$(env "$@" python3 tests/storm.py --threads "$threads" --calls "$calls" 2>&1)
  local rc=$?
  echo "$out" | grep -v '^#\|passed, ' | head -20
  echo "$label: $(echo "$out" | grep '^#' | sed 's/^# //') -> $(echo "$out" | tail -1)"
  (( rc == 0 )) || fails=$((fails + 1))
}
for spin in default 0; do
  for run in 1 2 3; do
    cache=$(mktemp -d)
    if [ "$spin" = default ]; then
      one "spin $spin run $run" CONVTUNE_TUNE=auto CONVTUNE_CACHE_DIR="$cache" CONVTUNE_PROGRESS=0
    else
      one "spin $spin run $run" CONVTUNE_TUNE=auto CONVTUNE_SPIN_US=0 CONVTUNE_CACHE_DIR="$cache" CONVTUNE_PROGRESS=0
    fi
  done
done
for spin in default 0; do
  spin_env=()
  [ "$spin" = default ] || spin_env=(CONVTUNE_SPIN_US=0)
  for run in 1 2 3; do
    one "tune cached spin $spin run $run" CONVTUNE_TUNE=cached CONVTUNE_CACHE_DIR="$cache" "${spin_env[@]}"
    one "tune off spin $spin run $run" CONVTUNE_TUNE=off CONVTUNE_CACHE_DIR="$(mktemp -d)" "${spin_env[@]}"
  done
done
echo "storm runs failed: $fails"
