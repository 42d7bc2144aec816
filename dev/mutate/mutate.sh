#!/usr/bin/env bash
# dev/mutate/mutate.sh (`make mutate`): mutation testing. Plants each mutant
# of dev/mutate/mutants.txt, one at a time, in a copy of the tree, rebuilds
# what it affects (make's dependencies), runs the test programs the list
# names for it (each with a timeout, stopped at its first FAIL line), and
# says whether one of them killed it. Then the kill rate and the survivors.
#
#   dev/mutate/mutate.sh             every mutant
#   MUTANTS=a,b dev/mutate/mutate.sh those (by name)
#   QUICK=1 dev/mutate/mutate.sh     without the slow test programs
#                                    (test_checkpoint, test_layouts, test_attacks)
#   dev/mutate/mutate.sh --check     only checks that every mutant's text still
#                                    matches, once; builds and runs nothing
#   dev/mutate/mutate.sh --list      the mutants, one a line
#
# Settings (environment): MUTATE_TIMEOUT seconds per test program (900),
# MUTATE_JOBS make's -j (2), MUTATE_KEEP=1 keeps the copy and the tests'
# output (printed at the end), MUTATE_LIST another list file. LLM3D_DATA is
# passed on; unset, it is the checkout's ../shared/data, as the tests' own
# default is from the root.
#
# The copy is of the working tree (tracked files and untracked ones git does
# not ignore, as they are now, uncommitted changes included: a new test
# counts before it is committed) in a directory of its own under $TMPDIR.
# Your files are never written; the copy is removed at the end, also when
# interrupted (Ctrl-C). Not part of `make test` or CI: its first 55 mutants
# took 70 minutes on two busy cores, a third of it the unmutated baseline
# (one run of each test program), most of the rest compiling and
# test_checkpoint; the 32 of the parallel code since then add more, as
# several run test_layouts.
#
# Exit status: 0 when every mutant run was killed or its survival is
# expected (its `expect:` line), 1 when one survived unexpectedly, a pattern
# is stale, a mutant did not build or a test fails unmutated; 2 for a usage
# error. (QUICK's mutants with only slow tests are left out, not counted.)
set -u
shopt -u patsub_replacement 2>/dev/null  # bash 5.2: & in a ${x/a/b} replacement is literal

root=$(cd "$(dirname "$0")/../.." && pwd)
list=${MUTATE_LIST:-$root/dev/mutate/mutants.txt}
timeout_s=${MUTATE_TIMEOUT:-900}
jobs=${MUTATE_JOBS:-2}
slow_tests="test_checkpoint test_layouts test_attacks"
mode=run
case "${1:-}" in
    --check) mode=check ;;
    --list) mode=list ;;
    "") ;;
    *) echo "usage: $0 [--check | --list]   (MUTANTS=a,b  QUICK=1: see the top of $0)" >&2; exit 2 ;;
esac

# ----------------------------------------------------------------------------
# the list

names=(); files=(); finds=(); repls=(); descs=(); tests=(); expects=()
parse_error() { echo "$list:$lineno: $*" >&2; exit 2; }
n=-1; lineno=0
while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    line=${line%$'\r'}
    case "$line" in ''|'#'*) continue ;; esac
    key=${line%%:*}
    [ "$key" != "$line" ] || parse_error "not a 'key: value' line: $line"
    value=${line#*:}; value=${value# }
    if [ "$key" = mutant ]; then
        n=$((n + 1))
        [[ $value =~ ^[A-Za-z0-9-]+$ ]] || parse_error "mutant name '$value': letters, digits and dashes only"
        for i in "${!names[@]}"; do [ "${names[$i]}" != "$value" ] || parse_error "mutant $value is listed twice"; done
        names[n]=$value; files[n]=; finds[n]=; repls[n]=; descs[n]=; tests[n]=; expects[n]=
        continue
    fi
    [ $n -ge 0 ] || parse_error "'$key:' before the first 'mutant:' line"
    case "$key" in
        file) files[n]=$value ;;
        find) finds[n]=$value ;;
        find+) finds[n]=${finds[n]}$'\n'$value ;;
        repl) repls[n]=$value ;;
        repl+) repls[n]=${repls[n]}$'\n'$value ;;
        desc) descs[n]=$value ;;
        tests) tests[n]=$value ;;
        expect) expects[n]=$value ;;
        *) parse_error "unknown key '$key'" ;;
    esac
done < "$list"
[ $n -ge 0 ] || { echo "$list: no mutants" >&2; exit 2; }
for i in "${!names[@]}"; do
    for k in files finds descs tests; do
        eval "v=\${$k[$i]}"
        [ -n "$v" ] || { echo "$list: mutant ${names[$i]} has no '${k%s}:' line" >&2; exit 2; }
    done
    for t in ${tests[$i]}; do
        [[ $t =~ ^test_[a-z0-9_]+$ ]] || { echo "$list: mutant ${names[$i]}: '$t' is not a test program's name" >&2; exit 2; }
    done
done

if [ "$mode" = list ]; then
    for i in "${!names[@]}"; do printf '%-24s %-28s %s\n' "${names[$i]}" "${files[$i]}" "${descs[$i]}"; done
    exit 0
fi

# the test programs: where each is built (a make target), its source, and
# the programs it runs (./train_gpt2 and the like, found in its source),
# which are built too, so that it never skips them as not built
test_target() { case $1 in test_gpt2) echo test_gpt2 ;; *) echo "dev/test/$1" ;; esac; }
test_source() {
    case $1 in test_gpt2|test_gpt2_*) echo "test_gpt2.c" ;; *) echo "dev/test/$1.c" ;; esac
}
test_programs() {
    grep -oE '\./(train_gpt2|prepare_data|export_hf|plot_log|dev/compare_logs)\b' "$1" 2>/dev/null | sort -u | sed 's|^\./||'
}

# the selection: MUTANTS by name, QUICK without the slow tests
selected=()
if [ -n "${MUTANTS:-}" ]; then
    IFS=', ' read -r -a want <<< "$MUTANTS"
    for w in "${want[@]}"; do
        [ -n "$w" ] || continue
        found=
        for i in "${!names[@]}"; do [ "${names[$i]}" = "$w" ] && found=$i; done
        [ -n "$found" ] || { echo "MUTANTS: no mutant '$w' in $list (dev/mutate/mutate.sh --list)" >&2; exit 2; }
        selected+=("$found")
    done
else
    selected=("${!names[@]}")
fi
declare -A run_tests
for i in "${selected[@]}"; do
    ts=
    for t in ${tests[$i]}; do
        if [ -n "${QUICK:-}" ] && [ "${QUICK}" != 0 ] && [[ " $slow_tests " == *" $t "* ]]; then continue; fi
        ts="$ts $t"
    done
    run_tests[$i]=${ts# }
done

# ----------------------------------------------------------------------------
# text replacement, exactly (no patterns, no escapes)

# load_text FILE: the file's bytes, trailing newlines included, in $text
load_text() { text=$(cat "$1"; printf x); text=${text%x}; }
# occurrences of $2 in the text $1: 0, 1 or 2 (meaning 2 or more)
count_in() {
    local text=$1 pat=$2 c=0
    while [ $c -lt 2 ] && [[ $text == *"$pat"* ]]; do c=$((c + 1)); text=${text#*"$pat"}; done
    echo $c
}
# why mutant $1 cannot be planted in tree $2 (empty: it can)
stale_reason() {
    local i=$1 tree=$2 f=${files[$1]}
    [ -f "$tree/$f" ] || { echo "no file $f"; return; }
    local text c; load_text "$tree/$f"; c=$(count_in "$text" "${finds[$i]}")
    [ "$c" = 1 ] && return
    [ "$c" = 0 ] && echo "its text is no longer in $f" || echo "its text occurs more than once in $f"
}

if [ "$mode" = check ]; then
    bad=0
    for i in "${selected[@]}"; do
        why=$(stale_reason "$i" "$root")
        if [ -n "$why" ]; then printf '%-24s stale: %s\n' "${names[$i]}" "$why"; bad=1; fi
        for t in ${tests[$i]}; do
            [ -f "$root/$(test_source "$t")" ] || { printf '%-24s no test %s (%s)\n' "${names[$i]}" "$t" "$(test_source "$t")"; bad=1; }
        done
    done
    [ $bad = 0 ] && echo "${#selected[@]} mutants: every text matches once, every test exists"
    exit $bad
fi

# ----------------------------------------------------------------------------
# the copy, and its removal however the script ends

command -v git >/dev/null && command -v timeout >/dev/null || { echo "$0: needs git and timeout" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/llm3d-mutate.XXXXXX") || exit 2
tree=$work/tree
child=  # the make or test running now, leader of its own process group
stop_child() {
    [ -n "$child" ] || return 0
    kill -TERM -- "-$child" 2>/dev/null || kill -TERM "$child" 2>/dev/null
    wait "$child" 2>/dev/null
    child=
}
cleanup() {
    stop_child
    if [ -n "${MUTATE_KEEP:-}" ] && [ "${MUTATE_KEEP}" != 0 ]; then
        echo "kept: $work (the copy in tree/, each test's output in logs/)"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'echo; echo "interrupted: your files were never touched; the copy goes"; exit 130' INT TERM HUP

mkdir -p "$tree" "$work/logs" "$work/pristine"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf -) 2>/dev/null |
    tar -xf - -C "$tree" || { echo "$0: could not copy the tree" >&2; exit 2; }
if [ -z "${LLM3D_DATA:-}" ] && [ -d "$root/../shared/data" ]; then export LLM3D_DATA=$(cd "$root/../shared/data" && pwd); fi
unset MAKEFLAGS MFLAGS MAKELEVEL  # our own make, not a child of `make mutate`'s jobserver

# the targets of a list of tests: theirs and the programs they run
targets_of() {
    local t out=
    for t in "$@"; do out="$out $(test_target "$t") $(test_programs "$tree/$(test_source "$t")" | tr '\n' ' ')"; done
    echo "$out" | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ' '
}

build() {  # targets... > $work/build.log; 0 or make's status
    setsid -w make -C "$tree" -j"$jobs" "$@" > "$work/build.log" 2>&1 &
    child=$!; wait "$child"; local rc=$?; child=
    return $rc
}

# runs test $1 with its output in $2; sets verdict (pass, fail, timeout,
# crash) and why (the first FAIL line, or how it ended). Stopped at the
# first FAIL line: a failing check is enough, and the rest of a slow test
# would only cost time.
run_test() {
    local t=$1 out=$2 bin rc
    bin=./$(test_target "$t")
    (cd "$tree" && exec timeout -k 10 "$timeout_s" "$bin") > "$out" 2>&1 < /dev/null &
    child=$!
    local stopped=0
    while kill -0 "$child" 2>/dev/null; do
        if grep -q '^FAIL' "$out" 2>/dev/null; then kill -TERM -- "-$child" 2>/dev/null; stopped=1; break; fi
        sleep 1
    done
    wait "$child" 2>/dev/null; rc=$?; child=  # (no "Aborted" line from bash for a test that crashes)
    local first; first=$(grep -m1 '^FAIL' "$out" | cut -c1-150)
    if [ -n "$first" ]; then verdict=fail; why=$first
    elif [ $stopped = 0 ] && [ $rc = 124 ]; then verdict=timeout; why="no end after ${timeout_s} s"
    elif [ $rc -gt 128 ]; then verdict=crash; why="ended by signal $((rc - 128))"
    elif ! grep -qE '^[0-9]+ passed, [0-9]+ failed' "$out"; then verdict=crash; why="exit $rc, no summary line"
    elif [ $rc != 0 ]; then verdict=fail; why="exit $rc"
    else verdict=pass; why=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
    fi
}

# ----------------------------------------------------------------------------
# stale patterns first (before any build), then the unmutated baseline

start=$(date +%s)
echo "mutate: ${#selected[@]} mutants from ${list#$root/}, in a copy of the working tree at $tree"
[ -n "${QUICK:-}" ] && [ "$QUICK" != 0 ] && echo "mutate: QUICK: without $slow_tests"
declare -A result detail
todo=()
for i in "${selected[@]}"; do
    why=$(stale_reason "$i" "$tree")
    if [ -n "$why" ]; then result[$i]=stale; detail[$i]=$why
    elif [ -z "${run_tests[$i]}" ]; then result[$i]=skipped; detail[$i]="QUICK: only slow tests listed"
    else todo+=("$i")
    fi
done

all_tests=$(for i in "${todo[@]}"; do echo ${run_tests[$i]}; done | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ' ')
declare -A baseline_bad
nbad=0
if [ ${#todo[@]} -gt 0 ]; then
    echo "mutate: building the unmutated tree: $(targets_of $all_tests)"
    if ! build $(targets_of $all_tests); then
        tail -n 30 "$work/build.log"; echo "mutate: the unmutated tree does not build"; exit 1
    fi
    for t in $all_tests; do
        s=$(date +%s)
        run_test "$t" "$work/logs/baseline_$t.txt"
        printf 'mutate: baseline %-18s %-5s %4d s  %s\n' "$t" "$verdict" $(($(date +%s) - s)) "$why"
        [ "$verdict" = pass ] || { baseline_bad[$t]=1; nbad=$((nbad + 1)); }
    done
fi

# ----------------------------------------------------------------------------
# the mutants, one at a time

k=0
for i in "${todo[@]}"; do
    k=$((k + 1))
    s=$(date +%s)
    f=${files[$i]}
    cp -p "$tree/$f" "$work/pristine/file"
    touch "$work/stamp"
    sleep 1  # whatever builds from here on is newer than the stamp, to the second
    load_text "$tree/$f"
    printf '%s' "${text/"${finds[$i]}"/"${repls[$i]}"}" > "$tree/$f"
    ts=()
    for t in ${run_tests[$i]}; do [ -z "${baseline_bad[$t]:-}" ] && ts+=("$t"); done
    if [ ${#ts[@]} -eq 0 ]; then
        result[$i]=untested; detail[$i]="its tests fail unmutated: ${run_tests[$i]}"
    elif ! build $(targets_of "${ts[@]}"); then
        result[$i]=nobuild; detail[$i]=$(grep -m1 -E 'error' "$work/build.log" | cut -c1-150)
    else
        result[$i]=survived; detail[$i]="passed: ${ts[*]}"
        for t in "${ts[@]}"; do
            run_test "$t" "$work/logs/${names[$i]}_$t.txt"
            if [ "$verdict" != pass ]; then result[$i]=killed; detail[$i]="$t ($verdict): $why"; break; fi
        done
    fi
    # the file back as it was, its time too, and what was built from the
    # mutant gone, so that make rebuilds it from the original next time
    cp -p "$work/pristine/file" "$tree/$f"
    for tg in $(targets_of ${run_tests[$i]}); do
        [ -e "$tree/$tg" ] && [ -n "$(find "$tree/$tg" -newer "$work/stamp")" ] && rm -f "$tree/$tg"
    done
    note=
    [ -n "${expects[$i]}" ] && [ "${result[$i]}" = survived ] && note="  (expected: ${expects[$i]%%:*})"
    [ -n "${expects[$i]}" ] && [ "${result[$i]}" = killed ] && note="  (listed as expected to survive: update its expect line)"
    printf '[%2d/%d] %-24s %-8s %4d s  %s%s\n' $k ${#todo[@]} "${names[$i]}" "${result[$i]}" $(($(date +%s) - s)) \
        "${detail[$i]}" "$note"
done

# ----------------------------------------------------------------------------
# the summary

killed=0; survived=0; unexpected=0; problems=0; skipped=0
for i in "${selected[@]}"; do
    case ${result[$i]} in
        killed) killed=$((killed + 1)) ;;
        skipped) skipped=$((skipped + 1)) ;;
        survived) survived=$((survived + 1)); [ -n "${expects[$i]}" ] || unexpected=$((unexpected + 1)) ;;
        *) problems=$((problems + 1)) ;;
    esac
done
echo
echo "mutate: ${#selected[@]} mutants: $killed killed, $survived survived, $problems not run (stale, not built or" \
     "untested)$([ $skipped = 0 ] || echo ", $skipped left out by QUICK")" \
     "in $(( ($(date +%s) - start) / 60 )) min"
if [ $((killed + survived)) -gt 0 ]; then
    echo "mutate: kill rate $killed/$((killed + survived)) = $(awk -v a=$killed -v b=$((killed + survived)) 'BEGIN{printf "%.1f%%", 100*a/b}');" \
         "$((survived - unexpected)) of the $survived survivors expected (their expect: lines), $unexpected not"
fi
if [ $survived -gt 0 ]; then
    echo "survivors:"
    for i in "${selected[@]}"; do
        [ "${result[$i]}" = survived ] || continue
        printf '  %-24s %s: %s\n' "${names[$i]}" "${files[$i]}" "${descs[$i]}"
        if [ -n "${expects[$i]}" ]; then printf '  %-24s   %s\n' "" "${expects[$i]}"
        else printf '  %-24s   not expected: a test should kill it, or its expect line say why it cannot\n' ""
        fi
    done
fi
if [ $problems -gt 0 ]; then
    echo "not run:"
    for i in "${selected[@]}"; do
        case ${result[$i]} in killed|survived|skipped) continue ;; esac
        printf '  %-24s %-8s %s\n' "${names[$i]}" "${result[$i]}" "${detail[$i]}"
    done
fi
[ $nbad -eq 0 ] || for t in "${!baseline_bad[@]}"; do echo "mutate: $t fails without any mutant: its kills could not count"; done
[ $unexpected -eq 0 ] && [ $problems -eq 0 ] && [ $nbad -eq 0 ]
