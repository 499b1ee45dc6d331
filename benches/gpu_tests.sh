#!/usr/bin/env bash
# The whole test suite on a GPU machine, its test ids spread round-robin over N processes
# (one GPU takes many at once; one process would take hours with CONVTUNE_EXHAUSTIVE=1),
# each with its own tuning cache. Writes each process's log into OUTDIR and prints one
# summary line per process, every failure, and the totals.
# PYTHON picks the interpreter (default python3).
# Usage: benches/gpu_tests.sh [processes=16] [outdir=gpu_tests_out] [seconds per process=900] [pytest paths...]
set -uo pipefail
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."
n=${1:-16}; out=${2:-gpu_tests_out}; limit=${3:-900}
shift $(( $# < 3 ? $# : 3 ))
paths=("$@"); [ ${#paths[@]} -gt 0 ] || paths=(tests)
export CONVTUNE_EXHAUSTIVE=${CONVTUNE_EXHAUSTIVE:-1} CONVTUNE_PROGRESS=0
mkdir -p "$out"
"$py" -m pytest -q --co -p no:cacheprovider "${paths[@]}" 2>/dev/null | grep '::' > "$out/ids.txt"
echo "# $(wc -l < "$out/ids.txt") tests over $n processes, $limit s each"
for s in $(seq 0 $((n - 1))); do
  awk -v n="$n" -v s="$s" '(NR - 1) % n == s' "$out/ids.txt" > "$out/ids_$s.txt"
  (
    mapfile -t ids < "$out/ids_$s.txt"
    [ ${#ids[@]} -gt 0 ] || exit 0
    # SIGINT at the limit: pytest stops as on Ctrl-C and still prints its summary (counts and
    # failures so far); SIGKILL 30 s later if a test does not let go.
    CONVTUNE_CACHE_DIR=$(mktemp -d) timeout -s INT -k 30 "$limit" "$py" -m pytest -q -p no:cacheprovider -rfE "${ids[@]}" > "$out/log_$s.txt" 2>&1
    echo "exit status $?" >> "$out/log_$s.txt"
  ) &
done
wait
"$py" - "$out" "$n" <<'PY'
import glob, re, sys
out, n = sys.argv[1], int(sys.argv[2])
total = {}
for s in range(n):
    try:
        lines = open(f"{out}/log_{s}.txt").read().splitlines()
    except FileNotFoundError:
        continue
    summary = next((l for l in reversed(lines) if re.search(r"\d+ (passed|failed|error)", l)), "(no summary: timed out?)")
    print(f"process {s}: {summary.strip('= ')} ({lines[-1] if lines else ''})")
    for l in lines:
        if l.startswith(("FAILED", "ERROR")):
            print("  " + l)
    # The failures' assertion lines too (a machine that sends back few files keeps them).
    errs = [l for l in lines if l.startswith("E  ")]
    for l in errs[:12]:
        print("    " + l[:300])
    for k_n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary):
        total[k] = total.get(k, 0) + int(k_n)
print("TOTAL", total)
PY
