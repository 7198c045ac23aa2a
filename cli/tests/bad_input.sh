#!/usr/bin/env bash
# cli/tests/bad_input.sh GPUPOOL WORKDIR — `gpupool replay` given bad or odd input (issue 9, findings 7,
# 8, 9 and 13): each case checks the exit status and what the command says. In sanitizer builds a
# leak or undefined behaviour makes the command exit 134 or print "runtime error", which fails the case.
# Prints one line per failed case and exits 1 if any failed.
set -u
gpupool="$1"
work="$2"
mkdir -p "$work"
cd "$work" || exit 1
failures=0
out=out.txt
errf=err.txt

# run EXPECTED_STATUS ARGS...: runs gpupool with ARGS (stdin from /dev/null), keeps stdout and stderr
run() {
    local want="$1"; shift
    timeout 60 "$gpupool" "$@" </dev/null >"$out" 2>"$errf"
    status=$?
    if [ "$status" -ne "$want" ]; then
        echo "FAIL: gpupool $* exited $status, expected $want; stderr: $(head -c 600 "$errf")"
        failures=$((failures + 1))
        return 1
    fi
    if grep -qE "runtime error|Sanitizer" "$errf"; then
        echo "FAIL: gpupool $*: sanitizer report: $(head -c 600 "$errf")"
        failures=$((failures + 1))
        return 1
    fi
    return 0
}

# expect FILE REGEX MESSAGE / refuse FILE REGEX MESSAGE: the last run's output must (not) match
expect() {
    if ! grep -qE -- "$2" "$1"; then
        echo "FAIL: $3: no match for /$2/ in: $(head -c 600 "$1")"
        failures=$((failures + 1))
    fi
}
refuse() {
    if grep -qE -- "$2" "$1"; then
        echo "FAIL: $3: unwanted /$2/ in: $(head -c 600 "$1")"
        failures=$((failures + 1))
    fi
}

header="Thread,Time,Action,Pointer,Size,Stream"
printf '%s\n0,1,allocate,0x1000,4096,0x0\n0,2,free,0x1000,4096,0x0\n' "$header" >small.csv
printf '%s\n' "$header" >header_only.csv

# finding 13: --help and option errors free what they allocated (exit 134 under ASan before)
run 0 replay --help && expect "$out" "usage: gpupool replay" "--help prints the usage"
run 2 replay --no-such-option small.csv && expect "$errf" "unknown option --no-such-option" "unknown option"
run 2 replay --model m=small.csv --repeat 3 && expect "$errf" "--repeat" "--repeat with --model is refused"
run 2 replay --model m=small.csv --plot x.svg && expect "$errf" "--plot" "--plot with --model is refused"
run 2 replay --model m=small.csv --check && expect "$errf" "--check" "--check with --model is refused"
run 2 replay --model a= && expect "$errf" "--model a=: .*trace" "an empty trace path is named"
refuse "$errf" ": : cannot open" "--model a= must not print an empty path"
long=$(printf 'n%.0s' $(seq 1 70))
run 2 replay --model "$long=small.csv" && expect "$errf" "63" "a long model name says the limit"
# configuration errors are not prefixed with a trace path, and name their source
run 2 replay --conf no_such_key:1 small.csv && expect "$errf" "^gpupool replay: --conf: unknown key 'no_such_key'" \
    "--conf error names --conf"
refuse "$errf" "small.csv" "a configuration error is not about the trace"
GPUPOOL_CONF=$'backend:sim,\x01\x02\x1b[2J' run 2 replay small.csv && expect "$errf" "GPUPOOL_CONF" "binary GPUPOOL_CONF"
if LC_ALL=C grep -q $'[\x01\x02\x1b]' "$errf"; then
    echo "FAIL: a binary GPUPOOL_CONF is echoed raw"
    failures=$((failures + 1))
fi
# finding 7: a duration the clock cannot hold is a configuration error, not undefined behaviour
run 2 replay --conf idle_release:1e11 small.csv && expect "$errf" "idle_release" "idle_release:1e11 is refused"
# finding 7: a trace with no replayable event (header only) replays without NULL + 0
run 0 replay header_only.csv && expect "$out" "0 per pass" "header-only trace"
# finding 13: /dev/zero is not a trace, and is not read without bound
run 1 replay /dev/zero && expect "$errf" "/dev/zero.*(NUL|not a text)" "/dev/zero is refused as binary"
# finding 13: more than 256 streams: room is made for every stream
{
    echo "$header"
    for i in $(seq 1 300); do printf '0,%d,allocate,0x%x000,4096,0x%x\n' "$i" "$i" "$i"; done
    for i in $(seq 1 300); do printf '0,%d,free,0x%x000,4096,0x%x\n' "$((i + 400))" "$i" "$i"; done
} >streams300.csv
run 0 replay streams300.csv && expect "$out" "failed allocations +0$" "300 streams replay without failures"
run 1 replay --conf max_streams:100 streams300.csv && expect "$errf" "300 streams.*max_streams:100" \
    "a max_streams below the trace's streams is named"
# finding 8: a free on a stream no allocation used fails, is reported, and leaks nothing
printf '%s\n0,1,allocate,0x1000,4194304,0x0\n0,2,free,0x1000,4194304,0x77\n' "$header" >free_other_stream.csv
run 1 replay free_other_stream.csv && expect "$out" "failed frees +1$" "the text output counts failed frees"
expect "$errf" "free" "stderr says frees failed"
run 1 replay --json --repeat 3 free_other_stream.csv && expect "$out" '"failed_frees":3' "3 failed frees"
expect "$out" '"allocated_bytes_end":0' "nothing leaks across passes"
# finding 9: names and paths are JSON-escaped
cp small.csv 'q"uote.csv'
run 0 replay --json 'q"uote.csv' && expect "$out" 'q\\"uote.csv' "the path is escaped"
run 0 replay --json --model 'q"m=q"uote.csv' && expect "$out" '"name":"q\\"m"' "the model name is escaped"
if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$out" ||
        { echo "FAIL: replay --json --model output does not parse"; failures=$((failures + 1)); }
fi

if [ "$failures" -ne 0 ]; then
    echo "$failures case(s) failed"
    exit 1
fi
echo "all cases passed"
