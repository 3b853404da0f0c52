#!/usr/bin/env bash
# shoal-bench's count of streams whose tokens leave no text. A real model
# cannot be made to pick only special tokens on demand, so a small server
# here streams what one would (the fault this injects): SSE chunks of empty
# text, then usage with TOKENS completion tokens.
#   test_bench_no_text.sh BENCH
#   - 5 tokens a stream, no text: every request ok, counted without text,
#     its tokens in the output count, no TTFT sample;
#   - 0 tokens, no text: every request failed (the edge).
set -euo pipefail
bench=$1
tmp=$(mktemp -d /tmp/shoal-bench-notext.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2> /dev/null && wait "$pid" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
cat > "$tmp/server.py" <<'PY'
import http.server, json, os, sys
TOKENS = int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        def ev(obj):
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        for _ in range(TOKENS):
            ev({"choices": [{"index": 0, "text": ""}]})
        ev({"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": TOKENS,
                                     "total_tokens": 8 + TOKENS}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
open(sys.argv[1], "w").write(str(s.server_address[1]))
s.serve_forever()
PY
status=0
for tokens in 5 0; do
  rm -f "$tmp/port" "$tmp/r.json"
  python3 "$tmp/server.py" "$tmp/port" "$tokens" &
  pid=$!
  for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
  "$bench" --url "http://127.0.0.1:$(cat "$tmp/port")" --model fake --requests 4 --concurrency 2 \
    --input-len 8 --output-len 5 --json "$tmp/r.json" > "$tmp/out.txt" 2>&1 || true
  kill "$pid" && wait "$pid" 2> /dev/null || true
  pid=
  read -r ok failed notext out ttft < <(python3 -c "
import json; r = json.load(open('$tmp/r.json'))
print(r['requests_ok'], r['requests_failed'], r['requests_without_text'], int(r['output_tokens']),
      r['ttft_ms']['p50'])")
  echo "$tokens tokens a stream: $ok ok, $failed failed, $notext without text," \
    "$out output tokens, TTFT p50 $ttft"
  if [ "$tokens" -gt 0 ]; then
    [ "$ok" -eq 4 ] && [ "$failed" -eq 0 ] && [ "$notext" -eq 4 ] && [ "$out" -eq 20 ] &&
      [ "$ttft" = 0 ] ||
      { echo "FAIL: streams of tokens without text"; cat "$tmp/out.txt"; status=1; }
  else
    [ "$ok" -eq 0 ] && [ "$failed" -eq 4 ] && [ "$notext" -eq 0 ] ||
      { echo "FAIL: streams without tokens"; cat "$tmp/out.txt"; status=1; }
  fi
done
[ $status -eq 0 ] && echo "2 passed, 0 failed"
exit $status
