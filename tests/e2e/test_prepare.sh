#!/bin/sh
# Test of build/prepare: text in, shards out. Checks shard sizes, that train + val shards hold
# exactly the input bytes in order, that stale shards of an earlier run are removed, and that
# bad arguments fail with a message. Usage: tests/e2e/test_prepare.sh PATH/TO/prepare
set -u
prepare=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/test_prepare_XXXXXX")
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0
expect() {  # expect DESCRIPTION COMMAND...
  d=$1; shift
  if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $d" >&2; fi
}
size() { wc -c < "$1" | tr -d ' '; }
# Token values of shards (uint16 after the 64-byte header) and byte values of text, one a line.
tokens() { for f in "$@"; do tail -c +65 "$f" | od -An -v -tu2; done | tr -s ' \n' '\n\n' | sed '/^$/d'; }
bytes() { cat "$@" | od -An -v -tu1 | tr -s ' \n' '\n\n' | sed '/^$/d'; }

printf 'In the beginning was the byte.\n' > "$dir/a.txt"
i=0
while [ $i -lt 40 ]; do printf 'line %d: caf\303\251 na\303\257ve \342\202\254\n' $i; i=$((i + 1)); done > "$dir/b.txt"
n=$(cat "$dir/a.txt" "$dir/b.txt" | wc -c | tr -d ' ')
nval=$(awk -v n="$n" 'BEGIN { printf "%d", n * 0.1 }')
ntrain=$((n - nval))

out=$("$prepare" --out "$dir/out/sub" --val-fraction 0.1 --shard-tokens 300 "$dir/a.txt" "$dir/b.txt")
expect "prepare exits 0" [ $? -eq 0 ]
expect "prints token counts" sh -c "echo \"\$1\" | grep -q 'train_000.bin: 300 tokens'" _ "$out"
nshard=$(( (ntrain + 299) / 300 ))
expect "$nshard train shards" [ "$(ls "$dir/out/sub" | grep -c '^train_...\.bin$')" -eq "$nshard" ]
expect "first shard is 64 + 2*300 bytes" [ "$(size "$dir/out/sub/train_000.bin")" -eq 664 ]
expect "val shard is 64 + 2*$nval bytes" [ "$(size "$dir/out/sub/val_000.bin")" -eq $((64 + 2 * nval)) ]
expect "header magic TRNTOK" [ "$(head -c 6 "$dir/out/sub/train_000.bin")" = "TRNTOK" ]
tokens "$dir"/out/sub/train_*.bin "$dir/out/sub/val_000.bin" > "$dir/tok"
bytes "$dir/a.txt" "$dir/b.txt" > "$dir/byt"
expect "train + val tokens equal the input bytes" cmp -s "$dir/tok" "$dir/byt"
tokens "$dir/out/sub/val_000.bin" > "$dir/valtok"
tail -n "$nval" "$dir/byt" > "$dir/valbyt"
expect "val holds the last bytes" cmp -s "$dir/valtok" "$dir/valbyt"

# Bigger shards, no val: the earlier run's extra train shards and its val shard must go.
"$prepare" --out "$dir/out/sub" --val-fraction 0 --shard-tokens 100000 "$dir/a.txt" "$dir/b.txt" > /dev/null
expect "re-run exits 0" [ $? -eq 0 ]
expect "stale shards removed" [ "$(ls "$dir/out/sub")" = "train_000.bin" ]
expect "one shard of all tokens" [ "$(size "$dir/out/sub/train_000.bin")" -eq $((64 + 2 * n)) ]

err=$("$prepare" --out "$dir/o2" "$dir/missing.txt" 2>&1)
expect "missing input fails" [ $? -ne 0 ]
expect "missing input named" sh -c "echo \"\$1\" | grep -q 'missing.txt'" _ "$err"
"$prepare" "$dir/a.txt" > /dev/null 2>&1
expect "no --out fails" [ $? -ne 0 ]
err=$("$prepare" --out "$dir/o3" --val-fraction 1.5 "$dir/a.txt" 2>&1)
expect "bad val fraction fails" [ $? -ne 0 ]
expect "bad val fraction explained" sh -c "echo \"\$1\" | grep -q '\[0, 1)'" _ "$err"
"$prepare" --out "$dir/o4" --shard-tokens 1 "$dir/a.txt" > /dev/null 2>&1
expect "shard-tokens 1 fails" [ $? -ne 0 ]
# The largest --shard-tokens is one shard, not an overflow; past it, or more than a million
# shards, the argument is refused with its range.
out=$("$prepare" --out "$dir/o5" --shard-tokens 9223372036854775807 "$dir/a.txt" 2>&1)
expect "shard-tokens INT64_MAX writes one shard" sh -c "echo \"\$1\" | grep -q 'in 1 shard(s)'" _ "$out"
err=$("$prepare" --out "$dir/o6" --shard-tokens 9223372036854775808 "$dir/a.txt" 2>&1)
expect "shard-tokens past INT64_MAX fails" [ $? -ne 0 ]
expect "shard-tokens past INT64_MAX names the range" sh -c "echo \"\$1\" | grep -q 'an integer in \[2, 9223372036854775807\]'" _ "$err"
yes 'abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz' \
  | head -n 21000 > "$dir/big.txt"  # 2,079,000 bytes: 1,039,500 shards of 2
err=$("$prepare" --out "$dir/o7" --val-fraction 0 --shard-tokens 2 "$dir/big.txt" 2>&1)
expect "more than a million shards fails" [ $? -ne 0 ]
expect "more than a million shards explained" sh -c "echo \"\$1\" | grep -q 'more than 1000000; expected at least 3 tokens a shard'" _ "$err"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
