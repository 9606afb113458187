# tests/tap.sh: TAP helpers for the shell test suites. Source it, call
# `tap_plan N`, then `ok`/`not_ok`/`is`/`like`/... ; `tap_done` exits 1 if
# any test failed or the count does not match the plan.
tap_n=0
tap_failed=0
tap_planned=
tap_plan() { tap_planned=$1; echo "1..$1"; }
tap_skip_all() { echo "1..0 # SKIP $*"; exit 0; }
tap_diag() { printf '%s\n' "$@" | sed 's/^/# /'; }
ok() {  # ok DESCRIPTION  (pass)
  tap_n=$((tap_n + 1)); echo "ok $tap_n - $1"; }
not_ok() {  # not_ok DESCRIPTION [DIAG...]
  tap_n=$((tap_n + 1)); tap_failed=$((tap_failed + 1)); echo "not ok $tap_n - $1"
  shift; [ $# -gt 0 ] && tap_diag "$@"; return 0; }
skip() {  # skip DESCRIPTION REASON
  tap_n=$((tap_n + 1)); echo "ok $tap_n - $1 # SKIP $2"; }
check() {  # check DESCRIPTION COMMAND... : passes if the command exits 0 (output kept in chk_out, so a caller's $out survives)
  d=$1; shift
  if chk_out=$("$@" 2>&1); then ok "$d"; else not_ok "$d" "command: $*" "$chk_out"; fi; }
is() {  # is GOT EXPECTED DESCRIPTION
  if [ "$1" = "$2" ]; then ok "$3"; else not_ok "$3" "got:      $1" "expected: $2"; fi; }
like() {  # like GOT GREP-E-PATTERN DESCRIPTION
  if printf '%s\n' "$1" | grep -Eq -- "$2"; then ok "$3"; else not_ok "$3" "got:     $1" "pattern: $2"; fi; }
unlike() {  # unlike GOT GREP-E-PATTERN DESCRIPTION
  if printf '%s\n' "$1" | grep -Eq -- "$2"; then not_ok "$3" "got:     $1" "must not match: $2"; else ok "$3"; fi; }
tap_done() {
  if [ -n "$tap_planned" ] && [ "$tap_planned" != "$tap_n" ]; then
    echo "# planned $tap_planned tests but ran $tap_n"; exit 1; fi
  [ "$tap_failed" -eq 0 ] || exit 1
  exit 0; }
# A scratch directory removed on exit.
tap_tmpdir() { tap_tmp=$(mktemp -d "${TMPDIR:-/tmp}/mg-test.XXXXXX"); trap 'rm -rf "$tap_tmp"' EXIT; }
