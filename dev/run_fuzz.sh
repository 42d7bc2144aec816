#!/usr/bin/env bash
# usage: dev/run_fuzz.sh SECONDS dev/fuzz/fuzz_NAME...
# For each libFuzzer target: replay its seed corpus dev/fuzz/corpus/NAME (every
# file must run clean), then fuzz for SECONDS from that corpus into a scratch
# copy (the committed corpus is not changed). Any crash fails the run.
set -eu
seconds=$1; shift
for fuzzer in "$@"; do
    name=$(basename "$fuzzer"); name=${name#fuzz_}
    corpus=dev/fuzz/corpus/$name
    scratch=$(mktemp -d)
    echo "== $fuzzer: replaying $(ls "$corpus" | wc -l) seeds from $corpus"
    "$fuzzer" -runs=0 "$corpus" 2>&1 | tail -n 2
    cp "$corpus"/* "$scratch"/
    echo "== $fuzzer: fuzzing for $seconds s"
    "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$scratch/" "$scratch" 2>&1 | tail -n 3
    rm -rf "$scratch"
done
echo "fuzz: all targets ran clean"
