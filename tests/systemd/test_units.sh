#!/usr/bin/env bash
# systemd-analyze verify on shoal's units, with ExecStart pointed at this
# build's binaries (verify checks that each command exists). A unit with a
# bad directive or a missing command fails.
#   test_units.sh SOURCE_DIR COORDINATOR WORKER
set -euo pipefail
src=$1 coord=$2 worker=$3
if ! command -v systemd-analyze > /dev/null; then
  echo "systemd-analyze not found: tools/setup installs systemd"
  exit 1
fi
tmp=$(mktemp -d /tmp/shoal-units.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for u in shoal.target shoal-coordinator.service shoal-worker@.service; do
  sed -e "s#/usr/local/bin/shoal-coordinator#$coord#" -e "s#/usr/local/bin/shoal-worker#$worker#" \
    "$src/systemd/$u" > "$tmp/$u"
done
fail=0
# both command lines name the cluster: the worker joins its segment, shoalctl
# finds it (/dev/shm/shoal.shoal)
for u in shoal-coordinator.service shoal-worker@.service; do
  line=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$src/systemd/$u" | grep '^ExecStart=')
  if ! echo "$line" | grep -q -- '--cluster shoal\b'; then
    echo "FAIL: $u: ExecStart lacks --cluster shoal: $line"
    fail=1
  fi
done
# the coordinator is ready only once a worker registered: a worker ordered
# after it would wait for that forever
if grep -Eq '^After=.*shoal-coordinator' "$src/systemd/shoal-worker@.service"; then
  echo "FAIL: shoal-worker@.service is ordered After= the coordinator (a start deadlock)"
  fail=1
fi
cd "$tmp"
out=$(systemd-analyze verify --man=no ./shoal.target ./shoal-coordinator.service \
  ./shoal-worker@0.service ./shoal-worker@1.service 2>&1) && rc=0 || rc=$?
echo "$out"
# any complaint naming one of our units is a failure, whatever the exit code
if [ $rc -ne 0 ] || [ $fail -ne 0 ] || echo "$out" | grep -q "shoal"; then
  echo "0 passed, 1 failed"
  exit 1
fi
echo "1 passed, 0 failed"
