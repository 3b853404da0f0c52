#!/usr/bin/env bash
# tools/bench/ab_decode.py: variants side by side, each beside the bound.
#   test_ab_decode.sh MODEL_BENCH MAKE_DEMO TOKENIZER_DIR
#   - the arithmetic, against a stand-in bench that prints known figures
#     (a real bench's figures cannot be known in advance): 1,000 tokens/s
#     at 2 rows and 1 MB a step over 1 GB/s is 0.500x of the 2,000 bound;
#   - a variant whose runs fail is reported, the others still are;
#   - bad specifications and a missing bandwidth: exit 2, the spec named;
#   - --membw: the bandwidth a program prints;
#   - the real shoal-model-bench on the CPU with a demo model.
set -euo pipefail
bench=$1 make_demo=$2 tokdir=$3
here=$(cd "$(dirname "$0")" && pwd)
ab="$here/../../tools/bench/ab_decode.py"
tmp=$(mktemp -d /tmp/shoal-ab.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { # description, then a command that must succeed
  local what=$1
  shift
  if "$@"; then echo "ok $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}

cat > "$tmp/bench.sh" <<'SH'
#!/usr/bin/env bash
if [ -n "${FAIL:-}" ]; then echo "shoal-model-bench: no GPU" >&2; exit 1; fi
printf 'decode: batch 2 at context 8: 2.000 ms a step (median of 3), %s tokens/s; %s\n' \
  "${TPS:-1000.0}" "first step 3.00 ms"
echo "bytes a step: weights 600000, KV 400000"
SH
cat > "$tmp/membw.sh" <<'SH'
#!/usr/bin/env bash
echo "device copy bandwidth: 2.0 GB/s (read + write, 4.0 GiB, best of 10)"
SH
chmod +x "$tmp/bench.sh" "$tmp/membw.sh"

python3 "$ab" --bench "$tmp/bench.sh" --model "$tmp" --bw 1 --reps 2 --shape 2,8,3 \
  --variant tree: --variant fast:TPS=1500 --variant bad:FAIL=1 > "$tmp/out" 2> "$tmp/err"
check "the bound: 2 rows over 1 MB at 1 GB/s" \
  grep -q "bound 2000.0 tokens/s (0.001 GB a step)" "$tmp/out"
check "the reference's row" \
  grep -qF "| tree | 1000.0 / 1000.0 | 1000.0 | 0.500x | +0.0% |" "$tmp/out"
check "a variant's ratio and difference" \
  grep -qF "| fast | 1500.0 / 1500.0 | 1500.0 | 0.750x | +50.0% |" "$tmp/out"
check "a failed variant named with its last line" \
  grep -qF "| bad | failed: exit 1: shoal-model-bench: no GPU |" "$tmp/out"
check "each failed run said on stderr" test "$(grep -c 'bad, run' "$tmp/err")" -eq 2

python3 "$ab" --bench "$tmp/bench.sh" --model "$tmp" --membw "$tmp/membw.sh" --reps 1 \
  --shape 2,8,3 > "$tmp/out"
check "--membw: the bandwidth it prints" grep -q "bound 4000.0 tokens/s" "$tmp/out"
check "--membw: the ratio at it" grep -qF "| tree | 1000.0 | 1000.0 | 0.250x | +0.0% |" "$tmp/out"

refused() { # the message's expected text, then the arguments
  local want=$1 rc=0
  shift
  python3 "$ab" --bench "$tmp/bench.sh" --model "$tmp" "$@" > /dev/null 2> "$tmp/err" || rc=$?
  [ "$rc" -eq 2 ] && grep -qF -- "$want" "$tmp/err"
}
check "a variant without a colon" refused "variant 'nocolon'" --bw 1 --variant nocolon
check "a variable without a value" refused "'X' is not VAR=VALUE" --bw 1 --variant "v:X"
check "a shape of two numbers" refused "shape '1,8'" --bw 1 --shape 1,8
check "a shape of one step" refused "at least 2 steps" --bw 1 --shape 1,8,1
check "no bandwidth" refused "--bw GBPS or --membw PROGRAM" --shape 1,8,3
check "two variants of one name" refused "two variants share a name" --bw 1 \
  --variant a: --variant a:X=1

"$make_demo" --out "$tmp/model" --tokenizer-dir "$tokdir" > /dev/null
python3 "$ab" --bench "$bench" --model "$tmp/model" --device cpu --bw 10 --prefill 8 --reps 1 \
  --shape 2,16,3 --variant tree: --variant same:SHOAL_AB_TEST=1 > "$tmp/out"
check "the real bench: its bound" grep -qE "^batch 2, context 16, 3 steps: bound [0-9.]+ tokens/s" \
  "$tmp/out"
check "the real bench: both variants measured" \
  test "$(grep -cE '^\| (tree|same) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x \|' "$tmp/out")" -eq 2

[ "$fails" -eq 0 ] || { cat "$tmp/out"; exit 1; }
