#!/usr/bin/env bash
# A coordinator whose port is taken says so at once: it binds before it
# starts any worker, so no model loads and the message names the port.
#   test_port_taken.sh COORDINATOR WORKER MAKE_DEMO TOKENIZER_DIR
set -euo pipefail
coord=$1 worker=$2 make_demo=$3 tokdir=$4
tmp=$(mktemp -d /tmp/shoal-port-taken.XXXXXX)
holder=
cleanup() {
  [ -n "$holder" ] && kill "$holder" 2> /dev/null && { wait "$holder" 2> /dev/null || true; }
  rm -rf "$tmp"
}
trap cleanup EXIT
"$make_demo" --out "$tmp/model" --tokenizer-dir "$tokdir" > /dev/null
# a listener that holds a free port
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
open(sys.argv[1], "w").write(str(s.getsockname()[1])); time.sleep(60)' "$tmp/port" &
holder=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
port=$(cat "$tmp/port")
status=0
start=$(date +%s%N)
if "$coord" --model "$tmp/model" --workers cpu,cpu --port "$port" --worker-path "$worker" \
    --runtime-dir "$tmp/run" > "$tmp/log" 2>&1; then
  echo "FAIL: the coordinator started on a taken port"; status=1
fi
ms=$(( ($(date +%s%N) - start) / 1000000 ))
grep -q "cannot listen on 127.0.0.1 port $port: Address already in use" "$tmp/log" ||
  { echo "FAIL: the message does not name the port"; cat "$tmp/log"; status=1; }
if grep -q "starting workers" "$tmp/log"; then
  echo "FAIL: workers were started before the port was bound"; cat "$tmp/log"; status=1
fi
echo "refused in $ms ms: $(grep 'cannot listen' "$tmp/log")"
[ $status -eq 0 ] && echo "1 passed, 0 failed"
exit $status
