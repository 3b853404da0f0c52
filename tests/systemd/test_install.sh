#!/usr/bin/env bash
# `cmake --install` into a fresh prefix puts everything a systemd setup
# needs in place: the three binaries, the units in lib/systemd/system naming
# the installed binaries (and --cluster shoal), shoal.env.example in
# share/shoal; the installed units pass systemd-analyze verify as they are.
#   test_install.sh BUILD_DIR
set -euo pipefail
build=$1
tmp=$(mktemp -d /tmp/shoal-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" > "$tmp/install.log"
fail=0
for f in bin/shoal-coordinator bin/shoal-worker bin/shoalctl; do
  [ -x "$prefix/$f" ] || { echo "FAIL: $f not installed (or not executable)"; fail=1; }
done
for f in lib/systemd/system/shoal.target lib/systemd/system/shoal-coordinator.service \
         lib/systemd/system/shoal-worker@.service share/shoal/shoal.env.example; do
  [ -f "$prefix/$f" ] || { echo "FAIL: $f not installed"; fail=1; }
done
units=$prefix/lib/systemd/system
if [ $fail -eq 0 ]; then
  grep -q "^ExecStart=$prefix/bin/shoal-coordinator .*" "$units/shoal-coordinator.service" ||
    { echo "FAIL: the coordinator unit does not run $prefix/bin/shoal-coordinator"; fail=1; }
  grep -q "^ExecStart=$prefix/bin/shoal-worker .*" "$units/shoal-worker@.service" ||
    { echo "FAIL: the worker unit does not run $prefix/bin/shoal-worker"; fail=1; }
  if grep -rq "/usr/local/" "$units"; then
    echo "FAIL: an installed unit still names /usr/local/:"; grep -rn "/usr/local/" "$units"; fail=1
  fi
  grep -q -- "--cluster shoal" "$units/shoal-worker@.service" ||
    { echo "FAIL: the installed worker unit lacks --cluster shoal"; fail=1; }
  "$prefix/bin/shoalctl" --help | grep -q pages ||
    { echo "FAIL: the installed shoalctl does not list pages"; fail=1; }
  if command -v systemd-analyze > /dev/null; then
    cd "$units"
    out=$(systemd-analyze verify --man=no ./shoal.target ./shoal-coordinator.service \
      ./shoal-worker@0.service 2>&1) && rc=0 || rc=$?
    if [ $rc -ne 0 ] || echo "$out" | grep -q "shoal"; then
      echo "FAIL: systemd-analyze verify on the installed units:"; echo "$out"; fail=1
    fi
  fi
fi
echo "installed:"; (cd "$prefix" && find . -type f | sort | sed 's/^/  /')
if [ $fail -ne 0 ]; then echo "0 passed, 1 failed"; exit 1; fi
echo "1 passed, 0 failed"
