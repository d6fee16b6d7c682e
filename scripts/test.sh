#!/usr/bin/env bash
# The whole test suite: what `npm test` (and so `npm install-test` and CI) runs.
#   1. system packages the tests use (installed when missing; needs root)
#   2. the typecheck
#   3. every test under Node.js: unit tests and the namespace-based system tests
#   4. the unit tests again under Bun
# It ends with one summary line "tests: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-system-deps.sh || exit 1

echo "== typecheck"
npx tsc --noEmit -p . || exit 1

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
status=0

echo "== node $(node --version): unit and system tests"
node --import tsx --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=tap --test-reporter-destination="$logs/node.tap" \
  test/unit/*.test.ts test/system/*.test.ts || status=1

echo "== bun $(npx bun --version): unit tests"
npx bun test --timeout 60000 test/unit 2>&1 | tee "$logs/bun.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

node_pass=$(grep -E '^# pass ' "$logs/node.tap" | awk '{print $3}')
node_fail=$(grep -E '^# fail ' "$logs/node.tap" | awk '{print $3}')
bun_pass=$(grep -E '^ *[0-9]+ pass$' "$logs/bun.txt" | awk '{print $1}')
bun_fail=$(grep -E '^ *[0-9]+ fail$' "$logs/bun.txt" | awk '{print $1}')
passed=$(( ${node_pass:-0} + ${bun_pass:-0} ))
failed=$(( ${node_fail:-0} + ${bun_fail:-0} ))
echo "node: ${node_pass:-0} passed, ${node_fail:-0} failed; bun: ${bun_pass:-0} passed, ${bun_fail:-0} failed"
if (( status != 0 && failed == 0 )); then failed=1; fi
echo "tests: $passed passed, $failed failed"
exit $status
