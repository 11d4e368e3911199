#!/usr/bin/env bash
# Proof of stability: the README's test command N times in a row from one fresh clone of this
# checkout's HEAD, then the process drills alone M times, each run's time and failures printed.
#
#   bash scripts/soak.sh N [M] [--load]
#
# --load keeps one core busy with a CPU burner for the whole soak (a second load, as CI's
# machine may have). The clone's first run sets up its virtual environment (pip's cache keeps
# what was built before); its time is printed apart. Exit status: the number of failed runs
# (0 when every run passed).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
runs="${1:?usage: soak.sh N [M] [--load]}"
drills=0
load=0
for arg in "${@:2}"; do
  case "$arg" in
    --load) load=1 ;;
    *) drills="$arg" ;;
  esac
done
DRILLS=(tests/test_engine_drills.py tests/test_engine_sigstop.py tests/test_engine_fencing.py
        tests/test_fenced_takeover.py tests/test_background.py tests/test_engine_wake.py
        tests/test_engine_orphans.py tests/test_regrade_engine.py tests/test_regrade_outage.py)

work="$(mktemp -d /tmp/rubric-soak.XXXXXX)"
git clone --quiet "$here" "$work/clone"
cd "$work/clone"
echo "soak: $runs full run(s), $drills drill run(s), load: $load, clone: $work/clone at" \
  "$(git rev-parse --short HEAD)"

burner=""
if [ "$load" = 1 ]; then
  python3 -c 'while True: pass' &
  burner=$!
  trap 'kill "$burner" 2>/dev/null' EXIT
fi

failed=0
summary() {  # the last line pytest printed: "N passed, M failed in S s"
  grep -E "^(=+ )?[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s" "$1" | tail -1
}
for i in $(seq 1 "$runs"); do
  log="$work/full-$i.log"
  start=$(date +%s)
  bash scripts/test.sh -q -p no:cacheprovider >"$log" 2>&1
  code=$?
  took=$(( $(date +%s) - start ))
  [ "$code" = 0 ] || failed=$((failed + 1))
  echo "full run $i: exit $code in ${took} s: $(summary "$log")"
  grep -E "^(FAILED|ERROR) " "$log" | sed 's/^/    /'
done
for i in $(seq 1 "$drills"); do
  log="$work/drills-$i.log"
  start=$(date +%s)
  .venv/bin/python -m pytest -q -p no:cacheprovider -n auto --dist load --maxschedchunk 1 \
    "${DRILLS[@]}" >"$log" 2>&1
  code=$?
  took=$(( $(date +%s) - start ))
  [ "$code" = 0 ] || failed=$((failed + 1))
  echo "drill run $i: exit $code in ${took} s: $(summary "$log")"
  grep -E "^(FAILED|ERROR) " "$log" | sed 's/^/    /'
done
echo "soak: $failed failed run(s); logs in $work"
exit "$failed"
