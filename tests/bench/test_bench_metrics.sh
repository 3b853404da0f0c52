#!/usr/bin/env bash
# shoal-bench for a few seconds against a real CPU cluster (two workers,
# warmed up first), and its report checked against the server's own
# /metrics: requests, prompt tokens and generated tokens must agree exactly.
#   test_bench_metrics.sh COORDINATOR WORKER BENCH MAKE_DEMO TOKENIZER_DIR
set -euo pipefail
coord=$1 worker=$2 bench=$3 make_demo=$4 tokdir=$5
tmp=$(mktemp -d /tmp/shoal-bench-test.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2> /dev/null && wait "$pid" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
"$make_demo" --out "$tmp/model" --tokenizer-dir "$tokdir" > /dev/null
"$coord" --model "$tmp/model" --workers cpu,cpu --port 0 --port-file "$tmp/port" \
  --worker-path "$worker" --runtime-dir "$tmp/run" --kv-pages 128 --parallel 8 --threads 1 \
  --warmup on > "$tmp/coordinator.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ -s "$tmp/port" ] && break
  kill -0 "$pid" 2> /dev/null || { cat "$tmp/coordinator.log"; exit 1; }
  sleep 0.1
done
[ -s "$tmp/port" ] || { echo "coordinator did not start"; cat "$tmp/coordinator.log"; exit 1; }
url="http://127.0.0.1:$(cat "$tmp/port")"

metric() { # name and label filter -> summed value
  curl -sf "$url/metrics" | awk -v m="$1" -v f="$2" \
    'index($1, m) == 1 && index($0, f) > 0 { s += $2 } END { printf "%d\n", s }'
}
before_req=$(metric 'shoal_http_requests_total{' 'route="/v1/completions",status="200"')
before_prompt=$(metric shoal_prompt_tokens_total '')
before_gen=$(metric shoal_generation_tokens_total '')
# --warmup on: each worker warmed up before it served, and none of that
# counts as a request or as tokens
for w in 0 1; do
  grep -q "worker $w: warmed up in" "$tmp/coordinator.log" ||
    { echo "FAIL: worker $w did not warm up"; cat "$tmp/coordinator.log"; exit 1; }
done
[ "$before_req$before_prompt$before_gen" = 000 ] || {
  echo "FAIL: the warm-up was counted: $before_req requests, $before_prompt + $before_gen tokens"
  exit 1
}

"$bench" --url "$url" --model "$tmp/model" --workload shared-prefix --duration 3 \
  --concurrency 6 --input-len 48 --prefix-len 32 --output-len 10 --vocab 150000 \
  --json "$tmp/report.json"

field() { python3 -c "import json,sys; print(int(json.load(open('$tmp/report.json'))['$1']))"; }
ok=$(field requests_ok)
failed=$(field requests_failed)
out=$(field output_tokens)
prompt=$(field prompt_tokens)
# The server counts a request when its connection is done with it, which
# can come a moment after the client has read the last byte: read the
# counters until they stop changing (at most 5 s).
read_server() {
  req=$(metric 'shoal_http_requests_total{' 'route="/v1/completions",status="200"')
  req=$((req - before_req))
  gen=$(( $(metric shoal_generation_tokens_total '') - before_gen ))
  ptok=$(( $(metric shoal_prompt_tokens_total '') - before_prompt ))
}
read_server
for _ in $(seq 50); do
  [ "$req" -eq "$ok" ] && [ "$gen" -eq "$out" ] && [ "$ptok" -eq "$prompt" ] && break
  sleep 0.1
  read_server
done
echo "bench: $ok ok, $failed failed, $out output tokens, $prompt prompt tokens"
echo "server: $req requests with status 200, $gen generated tokens, $ptok prompt tokens"
status=0
[ "$ok" -gt 0 ] || { echo "FAIL: no request completed"; status=1; }
[ "$failed" -eq 0 ] || { echo "FAIL: $failed requests failed"; status=1; }
[ "$ok" -eq "$req" ] || { echo "FAIL: requests differ"; status=1; }
[ "$out" -eq "$gen" ] || { echo "FAIL: generated tokens differ"; status=1; }
[ "$prompt" -eq "$ptok" ] || { echo "FAIL: prompt tokens differ"; status=1; }

# Without --model the bench asks /v1/models and runs on the first.
if "$bench" --url "$url" --requests 2 --concurrency 2 --input-len 8 --output-len 2 \
    --vocab 150000 > "$tmp/auto.out" 2> "$tmp/auto.err"; then
  grep -q "model '$tmp/model' (the server's first)" "$tmp/auto.err" ||
    { echo "FAIL: no --model: the served model was not named"; cat "$tmp/auto.err"; status=1; }
else
  echo "FAIL: no --model: the bench failed"; cat "$tmp/auto.out" "$tmp/auto.err"; status=1
fi
# --range-ratio varies the shared-prefix tails: 6 prompts of 32 + 16 tokens
# with the ratio 0 sum to 288, with 0.9 to anything else (almost surely).
for ratio in 0 0.9; do
  "$bench" --url "$url" --workload shared-prefix --requests 6 --concurrency 3 --input-len 48 \
    --prefix-len 32 --output-len 2 --vocab 150000 --range-ratio $ratio \
    --json "$tmp/range$ratio.json" > /dev/null 2>&1 || { echo "FAIL: range $ratio"; status=1; }
done
p0=$(python3 -c "import json; print(int(json.load(open('$tmp/range0.json'))['prompt_tokens']))")
p9=$(python3 -c "import json; print(int(json.load(open('$tmp/range0.9.json'))['prompt_tokens']))")
[ "$p0" -eq 288 ] || { echo "FAIL: range 0: $p0 prompt tokens, not 288"; status=1; }
[ "$p9" -ne 288 ] || { echo "FAIL: --range-ratio 0.9 left every tail at 16 tokens"; status=1; }
echo "shared-prefix prompt tokens: $p0 at range 0, $p9 at range 0.9"
# A model the server does not serve: every request fails, the bench says
# the server's error and exits non-zero.
if "$bench" --url "$url" --model no-such-model --requests 2 --concurrency 2 --input-len 8 \
    --output-len 2 --vocab 150000 > "$tmp/bad.out" 2>&1; then
  echo "FAIL: every request failed and the bench exited 0"; status=1
fi
grep -q "first error: HTTP 404: .*no-such-model" "$tmp/bad.out" ||
  { echo "FAIL: the server's error body is not shown"; cat "$tmp/bad.out"; status=1; }
[ $status -eq 0 ] && echo "1 passed, 0 failed"
exit $status
