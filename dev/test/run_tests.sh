#!/usr/bin/env bash
# Runs each test program given on the command line, shows its output, and adds
# up their closing lines "N passed, N failed[, N skipped]" into one such line.
# A program that crashes or prints no closing line counts as one failure.
set -u
passed=0; failed=0; skipped=0
for t in "$@"; do
    echo "== $t"
    out=$(mktemp)
    "$t" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
    rm -f "$out"
    if [ -z "$line" ]; then
        echo "FAIL  $t exited with status $rc and printed no summary line"
        failed=$((failed + 1)); continue
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p'); s=${s:-0}
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL  $t exited with status $rc"
        failed=$((failed + 1))
    fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
