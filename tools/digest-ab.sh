#!/bin/sh
# tools/digest-ab.sh: proof on a GPU that a change of the templates changed
# no result: the same specs generated from two template trees (BEFORE, e.g.
# a git revision's templates/, and AFTER), each package built and its test
# programs (NAME_test, and NAME_train_test where the spec trains) run with
# MG_DIGEST_DIR, so that every result they compare (outputs, states,
# gradients) is hashed in call order (runtime/mg_compare.c). The test
# programs come from each tree, so keep the host test sources the same on
# both sides (change kernels and pipelines, not what the tests call).
# AFTER runs twice: a digest that differs between its own runs is
# nondeterminism, not a difference of the change.
#
#   tools/digest-ab.sh OUTDIR BEFORE_TEMPLATES AFTER_TEMPLATES SPEC.yaml...
#   git archive REV templates | tar -x -C /tmp/old   # BEFORE = /tmp/old/templates
#
# Prints one line per test program: "NAME_test: same" or "NAME_test: DIFFERS
# (first at line K)"; a run that exits non-zero is named with its status and
# its first failed checks ("not ok" lines, each after the line before it);
# exit 0 when every program is the same, 1 when one differs or fails to
# build or run, 2 on usage errors.
# Env: MG (the mamba-gen binary, default ./mamba-gen), NVCC, CUDA_HOME,
# MG_RUNTIME_CFLAGS, MG_RUNTIME_LIBS (as for the emitted Makefile; `make
# check`'s environment has them), JOBS (make -j, default nproc),
# DIGEST_PARALLEL (3, the default: a spec's two packages build side by
# side and a program's three runs run side by side on the GPU, each with
# its own digest, so the comparison waits for the slowest run rather than
# the sum of three; 1: one after another), DIGEST_AHEAD (with 3: how many
# later specs' packages build while a spec's programs run, default 2, so
# that the GPU runs and the CPU builds overlap instead of alternating).
set -u
[ $# -ge 4 ] || { echo "usage: $0 OUTDIR BEFORE_TEMPLATES AFTER_TEMPLATES SPEC.yaml..." >&2; exit 2; }
out=$1 before=$2 after=$3; shift 3
mg=${MG:-./mamba-gen}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
par=${DIGEST_PARALLEL:-3}
case $par in 1|3) ;; *) echo "$0: DIGEST_PARALLEL=$par: expected 1 or 3" >&2; exit 2;; esac
ahead=${DIGEST_AHEAD:-2}
case $ahead in ''|*[!0-9]*) echo "$0: DIGEST_AHEAD=$ahead: expected a count" >&2; exit 2;; esac
for d in "$before" "$after"; do
  [ -d "$d" ] || { echo "$0: $d: not a directory of templates" >&2; exit 2; }
done
mkdir -p "$out" || exit 2
# absolute: the runs cd into their package before naming their digest
# directory under $out
out=$(cd "$out" && pwd) || exit 2
# build_side SIDE NAME SPEC: generate and build the package of SPEC from
# SIDE's templates into $out/SIDE/NAME; says what failed, and nothing else
build_side() {
  tpl=$before; [ "$1" = after ] && tpl=$after
  dir=$out/$1/$2
  if ! "$mg" -q --gpu none --templates "$tpl" -o "$dir" "$3" > "$out/$1-$2.gen" 2>&1; then
    echo "$2 ($1): generate failed:"; cat "$out/$1-$2.gen"; return 1
  fi
  if ! make -C "$dir" -j"$jobs" ${NVCC:+NVCC="$NVCC"} ${CUDA_HOME:+CUDA_HOME="$CUDA_HOME"} \
       MG_RUNTIME_CFLAGS="${MG_RUNTIME_CFLAGS:-}" MG_RUNTIME_LIBS="${MG_RUNTIME_LIBS:-}" all \
       > "$out/$1-$2.build" 2>&1; then
    echo "$2 ($1): build failed:"; tail -20 "$out/$1-$2.build"; return 1
  fi
}
# run_prog RUN NAME PROG: one run (before, after or after2) of a test
# program with its own digest directory; its exit status into a file
run_prog() {
  side=${1%2}
  (cd "$out/$side/$2" && MG_DIGEST_DIR=$(cd "$out/dig-$1" && pwd) "./$3" > "../../$1-$3.tap" 2>&1)
  echo $? > "$out/$1-$3.rc"
}
# The specs, numbered: spec_1 .. spec_$n
n=0
for spec in "$@"; do n=$((n + 1)); eval "spec_$n=\$spec"; done
# build_spec K: both packages of spec K (side by side with DIGEST_PARALLEL
# 3), their messages into $out/SIDE-NAME.msg
build_spec() {
  eval "bs=\$spec_$1"
  bn=$(basename "$bs" .yaml)
  for side in before after; do
    if [ "$par" = 3 ]; then
      build_side $side "$bn" "$bs" > "$out/$side-$bn.msg" 2>&1 &
    else
      build_side $side "$bn" "$bs" > "$out/$side-$bn.msg" 2>&1
    fi
  done
  wait
}
# start_builds K: the builds of every spec up to K not started yet, in
# the background with DIGEST_PARALLEL 3 (bpid_I: spec I's), else now
started=0
start_builds() {
  while [ $started -lt "$1" ] && [ $started -lt $n ]; do
    started=$((started + 1))
    if [ "$par" = 3 ]; then
      build_spec $started &
      eval "bpid_$started=\$!"
    else
      build_spec $started
    fi
  done
}
status=0
k=0
while [ $k -lt $n ]; do
  k=$((k + 1))
  eval "spec=\$spec_$k"
  name=$(basename "$spec" .yaml)
  start_builds $((k + ahead))
  [ "$par" = 3 ] && eval "wait \$bpid_$k"
  if [ -s "$out/before-$name.msg" ] || [ -s "$out/after-$name.msg" ]; then
    cat "$out/before-$name.msg" "$out/after-$name.msg"; status=1; continue
  fi
  for prog in "${name}_test" "${name}_train_test"; do
    [ -x "$out/after/$name/$prog" ] || continue
    # the three runs (side by side with DIGEST_PARALLEL 3: waited for by
    # their own ids, as later specs may be building in the background)
    pids=
    for run in before after after2; do
      mkdir -p "$out/dig-$run"
      rm -f "$out/dig-$run/$prog.digest" "$out/$run-$prog.rc"   # nothing of an earlier run is compared
      if [ "$par" = 3 ]; then
        run_prog $run "$name" "$prog" &
        pids="$pids $!"
      else
        run_prog $run "$name" "$prog"
      fi
    done
    for p in $pids; do wait "$p"; done
    for run in before after after2; do
      rc=$(cat "$out/$run-$prog.rc" 2>/dev/null || echo '?')
      if [ "$rc" != 0 ]; then
        echo "$prog ($run): exit $rc (see $out/$run-$prog.tap)"; status=1
        # its failed checks, each with the diagnostic line before it, so
        # that the log says which check failed (the TAP file stays on the
        # machine that ran it)
        grep -B1 '^not ok' "$out/$run-$prog.tap" 2>/dev/null | grep -v '^--$' | head -n 12 | sed 's/^/    /'
      fi
    done
    a=$out/dig-before/$prog.digest b=$out/dig-after/$prog.digest c=$out/dig-after2/$prog.digest
    if [ ! -s "$a" ] || [ ! -s "$b" ]; then
      echo "$prog: no results hashed (no GPU? see $out/after-$prog.tap)"; status=1
    elif ! cmp -s "$b" "$c"; then
      echo "$prog: NONDETERMINISTIC (two runs of the change differ)"; status=1
    elif cmp -s "$a" "$b"; then
      echo "$prog: same ($(wc -l < "$b") results)"
    else
      k2=$(cmp "$a" "$b" 2>/dev/null | sed -n 's/.* line \([0-9]*\).*/\1/p')
      echo "$prog: DIFFERS (first at line ${k2:-?}: $(sed -n "${k2:-1}p" "$b" 2>/dev/null))"; status=1
    fi
  done
done
wait   # (builds of specs past a failure are not left running)
exit $status
