#!/bin/bash
# The worker and the minimal client run by hand against the burst mock, each under a tool, for
# the per-token breakdowns of docs/performance.md ("Client CPU per output token").
#
#   bench/by_hand.sh OUT_DIR REQUESTS TOOL...        (from the repository root, after
#                                                    cargo build --release -p llm-replay-cli -p llm-replay-worker -p llm-replay-bench)
#   bench/by_hand.sh target/hand 2560 strace -f -c -o            # system calls
#   bench/by_hand.sh target/hand 2560 perf stat -e task-clock,raw_syscalls:sys_enter -o
#   bench/by_hand.sh target/hand 512 valgrind --tool=callgrind --callgrind-out-file=
#
# TOOL's last word takes the output file name appended: OUT_DIR/worker.out, OUT_DIR/minimal.out
# (a word ending in `=` is joined to it, any other is followed by it). The mock runs on core 0,
# the coordinator, the worker and the minimal client on core 1 (c = 128, 256 tokens a response).
set -euo pipefail
out=$1 requests=$2
shift 2
bin=${BIN:-target/release}
mkdir -p "$out"
python3 -c "import sys; sys.path.insert(0, 'bench'); import run; run.write_recording('$out/recording.jsonl', $requests)"
taskset -c 0 "$bin/llm-replay" mock --listen 127.0.0.1:0 --http1-only --ttft 0ms --itl 0ms \
    --tokens 256 >"$out/mock.out" 2>"$out/mock.log" &
mock=$!
trap 'kill $mock 2>/dev/null || true' EXIT
for _ in $(seq 50); do grep -q listening "$out/mock.out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/.*listening on //p' "$out/mock.out" | head -1)
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
with_tool() {  # with_tool FILE COMMAND...: COMMAND under TOOL writing FILE
    local file=$1 last=${tool[-1]}
    shift
    if [[ $last == *= ]]; then
        taskset -c 1 "${tool[@]:0:${#tool[@]}-1}" "$last$file" "$@"
    else
        taskset -c 1 "${tool[@]}" "$file" "$@"
    fi
}
tool=("$@")
taskset -c 1 "$bin/llm-replay" run "$out/recording.jsonl" --target "$url" --baseline none \
    --warmup 0 --concurrency 128 --requests "$requests" --listen "127.0.0.1:$port" \
    --expect-workers 1 --report-json "$out/report.json" >"$out/coordinator.log" 2>&1 &
coordinator=$!
sleep 1
with_tool "$out/worker.out" "$bin/llm-replay-worker" --coordinator "127.0.0.1:$port" --once \
    >"$out/worker.log" 2>&1
wait $coordinator || true
with_tool "$out/minimal.out" "$bin/minimal-client" --target "$url" --concurrency 128 \
    --requests "$requests" >"$out/minimal.log" 2>&1
python3 -c "import json; r = json.load(open('$out/report.json'))['requests']; print('llm-replay:', r['succeeded'], 'of', r['total'], 'succeeded')"
echo "minimal-client: $(grep "^{" "$out/minimal.log" | tail -1)"
echo "tool output: $out/worker.out, $out/minimal.out"
