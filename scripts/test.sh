#!/usr/bin/env bash
# The whole test suite: what `npm test` (and so `npm install-test` and CI) runs.
#   1. system packages the tests use (installed when missing; needs root)
#   2. the typecheck
#   3. the unit tests under Node.js and, side by side (each keeps about one of CI's two cores busy,
#      and neither measures time), the unit tests again under Bun
#   4. the namespace-based system tests under Node.js, alone on the machine (they wait on timers
#      and traffic, and a busy machine stretches them)
# It ends with one summary line "tests: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-system-deps.sh || exit 1
# The native helpers need the C compiler that the line above may just have installed.
node scripts/build-native.mjs --require || exit 1

echo "== typecheck"
npx tsc --noEmit -p . || exit 1

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
status=0

node_tests() {
  local name=$1; shift
  node --import tsx --test --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$logs/node-$name.tap" "$@"
}

echo "== node $(node --version): unit tests; bun $(npx bun --version): unit tests, side by side (bun's output follows node's)"
npx bun test --timeout 60000 test/unit > "$logs/bun.txt" 2>&1 &
bun_pid=$!
node_tests unit test/unit/*.test.ts || status=1
wait "$bun_pid" || status=1
echo "== bun: unit tests"
cat "$logs/bun.txt"

echo "== node: system tests"
node_tests system test/system/*.test.ts || status=1

node_pass=$(grep -hE '^# pass ' "$logs"/node-*.tap | awk '{n += $3} END {print n}')
node_fail=$(grep -hE '^# fail ' "$logs"/node-*.tap | awk '{n += $3} END {print n}')
bun_pass=$(grep -E '^ *[0-9]+ pass$' "$logs/bun.txt" | awk '{print $1}')
bun_fail=$(grep -E '^ *[0-9]+ fail$' "$logs/bun.txt" | awk '{print $1}')
passed=$(( ${node_pass:-0} + ${bun_pass:-0} ))
failed=$(( ${node_fail:-0} + ${bun_fail:-0} ))
echo "node: ${node_pass:-0} passed, ${node_fail:-0} failed; bun: ${bun_pass:-0} passed, ${bun_fail:-0} failed"
if (( status != 0 && failed == 0 )); then failed=1; fi
echo "tests: $passed passed, $failed failed"
exit $status
