#!/usr/bin/env bash
# The bad-config corpus: every configs/*.toml must be refused by
# `kolos check` cleanly (non-zero exit, no signal, no hang) with the message
# its first line names:
#   # expect: REGEX      (extended regex, matched against stderr as one line)
#   # ranks: N          (optional second line: `kolos check -n N`)
# plus inputs that cannot live in a text file (bytes that are not UTF-8, a
# directory, a missing file), made here.
#   configs.sh          (environment: KOLOS, KOLOS_SOURCE_DIR)
set -uo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
corpus=$KOLOS_SOURCE_DIR/tests/e2e/bad_input/configs

failed=0 passed=0
# run_case NAME REGEX [kolos check args...]: one case, counted, never exits.
run_case() {
  local name=$1 regex=$2; shift 2
  if (expect_failure "$regex" -- "$KOLOS" check "$@") >"$name.log" 2>&1; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: $name"; cat "$name.log"
  fi
}

for path in "$corpus"/*.toml; do
  name=$(basename "$path")
  regex=$(sed -n '1s/^# expect: //p' "$path")
  [[ -n $regex ]] || fail "$name: the first line must be '# expect: REGEX'"
  ranks=$(sed -n '2s/^# ranks: //p' "$path")
  cp "$path" "$name"  # messages name the file as given: NAME.toml:LINE:COL
  run_case "$name" "$regex" "$name" ${ranks:+-n "$ranks"}
done

# Bytes that are not UTF-8, in a string and in a comment.
printf '[model]\nname = "g\xff\xfept"\n' >non_utf8_string.toml
run_case non_utf8_string 'non_utf8_string\.toml:2:10: a byte \(0xff\) that is not UTF-8' non_utf8_string.toml
printf '# \xc3\x28\n[model]\nlayers = 2.5\n' >non_utf8_comment.toml
run_case non_utf8_comment 'non_utf8_comment\.toml:1:3: a byte \(0xc3\) that is not UTF-8' non_utf8_comment.toml
# In a literal string: toml11's own error path read out of bounds here.
printf "[model]\\nname = 'g\\xbapt'\\n" >non_utf8_literal.toml
run_case non_utf8_literal 'non_utf8_literal\.toml:2:10: a byte \(0xba\) that is not UTF-8' non_utf8_literal.toml
# A NUL byte, a byte-order mark, CR line endings alone.
printf '[model]\x00\nlayers = 2\n' >nul_byte.toml
run_case nul_byte 'nul_byte\.toml:1: malformed TOML' nul_byte.toml
printf '\xef\xbb\xbf[modle]\n' >bom.toml
run_case bom 'bom\.toml:1:[0-9]+: unknown section `modle`.*Did you mean `model`' bom.toml
printf '[model]\rlayers = 2\r' >cr_only.toml
run_case cr_only 'cr_only\.toml:1: malformed TOML' cr_only.toml
# A 1 MiB key; 100,000 lines with nesting at the limit on the first.
python3 -c "print('[model]\n' + 'k' * (1 << 20) + ' = 1')" >long_key.toml
run_case long_key 'long_key\.toml:2:1: unknown key `model\.kkkk' long_key.toml
python3 -c "print('[model]\nname = ' + '[' * 64 + ']' * 64 + '\n' + 'x = [[1]]\n' * 100000)" >many_lines.toml
run_case many_lines 'many_lines\.toml:4: malformed TOML.*value \("x"\) already exists' many_lines.toml
# Not a file, no file, an empty path.
mkdir -p a_directory.toml
run_case directory 'a_directory\.toml: cannot read the config file: Is a directory' a_directory.toml
run_case missing 'missing\.toml: cannot open the config file: No such file or directory' missing.toml
run_case empty_path ': cannot open the config file: No such file or directory' ''
# Overrides are checked like the file.
printf '' >empty.toml
run_case set_no_equals 'empty\.toml: --set model\.layers: expected section\.key=value' \
  empty.toml --set model.layers
run_case set_bad_type 'empty\.toml: --set model\.layers=2\.5: model\.layers: expected an integer, found a float' \
  empty.toml --set model.layers=2.5
run_case set_empty_key 'empty\.toml: --set =3: `` is not a valid key' empty.toml --set =3
run_case set_through_scalar 'empty\.toml: --set model\.layers\.x=1: `model\.layers` is an integer' \
  empty.toml --set model.layers=2 --set model.layers.x=1
run_case set_huge_int 'empty\.toml: --set train\.seed=99999999999999999999: the integer 99999999999999999999 does not fit 64 bits' \
  empty.toml --set train.seed=99999999999999999999
run_case set_deep 'arrays or inline tables nested more than 64 deep' \
  empty.toml --set "model.name=$(printf '[%.0s' {1..100})"

total=$((passed + failed))
echo "$passed of $total bad configs refused with the expected message"
[[ $failed -eq 0 ]] || fail "$failed of $total bad configs"
[[ $total -ge 50 ]] || fail "only $total bad configs"
echo "PASS: bad configs"
