# tests/gpu_lib.sh: what the GPU suites (gpu_mamba1.test, gpu_mamba3.test,
# gpu_mamba3_dtypes.test, tune_gpu.test) share: whether they can run at all
# (gpu_need_device, gpu_need_nvcc, gpu_skip_all), building the generated
# packages in parallel and running a generated TAP program with its tests
# passed through. Source it after tests/tap.sh; the build and run functions
# need tap_tmpdir.
#
# MG_REQUIRE_GPU=1 (environment; set it on GPU machines): every skip for
# lack of a device, of nvcc or of a GPU binary, in the suites and in the
# generated test programs (a program printing "1..0 # SKIP"), is a failure
# instead, so that a broken CUDA setup cannot give a green `make check`.

# MG_GPU_MODELS="NAME ..." (environment, optional): build and run only the
# suite's models named there (a developer's quick check of some variants on
# the GPU machine); unset, every model runs, as a release run must. With
# MG_REQUIRE_GPU=1, a selection that leaves a suite nothing to run fails it.

# gpu_required: true when MG_REQUIRE_GPU=1.
gpu_required() { [ "${MG_REQUIRE_GPU:-}" = 1 ]; }

# gpu_skip_all REASON: the suite cannot run: "1..0 # SKIP REASON" and exit
# 0; with MG_REQUIRE_GPU=1 one failed test naming REASON and exit 1.
gpu_skip_all() {
  if gpu_required; then
    echo "1..1"
    echo "not ok 1 - the GPU suite can run (MG_REQUIRE_GPU=1: no skip allowed): $1"
    tap_diag "MG_REQUIRE_GPU=1: '$1' is a failure here, not a skip (unset it on machines without a GPU)"
    exit 1
  fi
  tap_skip_all "$1"
}

# gpu_models MODEL...: the models of a suite to run: all of them, or those
# MG_GPU_MODELS names, in the suite's order; none left: gpu_skip_all.
gpu_models() {
  if [ -z "${MG_GPU_MODELS:-}" ]; then gpu_sel=$*; return 0; fi
  gpu_sel=
  for m in "$@"; do
    case " $MG_GPU_MODELS " in *" $m "*) gpu_sel="$gpu_sel $m" ;; esac
  done
  [ -n "$gpu_sel" ] || gpu_skip_all "MG_GPU_MODELS ($MG_GPU_MODELS) names none of this suite's models"
}

# gpu_need_device [MG_DEVINFO-ARGS...]: a usable CUDA device ($MG_DEVINFO
# exits 0), else gpu_skip_all.
gpu_need_device() {
  if [ -z "${MG_DEVINFO:-}" ] || ! "$MG_DEVINFO" "$@" > /dev/null 2>&1; then
    gpu_skip_all "no CUDA device"
  fi
}

# gpu_need_nvcc: NVCC set by configure, else gpu_skip_all.
gpu_need_nvcc() {
  case "${NVCC:-no}" in no) gpu_skip_all "nvcc not found (configure --with-cuda)" ;; esac
}

# build_models MODEL...: generate and build each package (spec
# $top_srcdir/specs/NAME.yaml, else $tap_tmp/NAME.yaml) into $tap_tmp/NAME, in
# parallel (nvcc dominates the time); each outcome lands in $tap_tmp/NAME.rc
# (gen | build | ok). The GPU runs that follow are sequential, so timings and
# memory don't mix.
build_models() {
  jobs=${MG_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
  running=0
  for name in "$@"; do
    dir=$tap_tmp/$name
    spec=$top_srcdir/specs/$name.yaml
    [ -f "$spec" ] || spec=$tap_tmp/$name.yaml
    (
      if ! "$MG" -q "$spec" -o "$dir" > "$tap_tmp/$name.gen" 2>&1; then echo gen > "$tap_tmp/$name.rc"; exit; fi
      if ! make -C "$dir" -j2 NVCC="$NVCC" ${CUDA_HOME:+CUDA_HOME="$CUDA_HOME"} \
           MG_RUNTIME_CFLAGS="${MG_RUNTIME_CFLAGS:-}" MG_RUNTIME_LIBS="${MG_RUNTIME_LIBS:-}" all \
           > "$tap_tmp/$name.build" 2>&1; then echo build > "$tap_tmp/$name.rc"; exit; fi
      echo ok > "$tap_tmp/$name.rc"
    ) &
    running=$((running + 1))
    if [ "$running" -ge $(( (jobs + 1) / 2 )) ]; then wait; running=0; fi
  done
  wait
}

# built NAME: report the generate and build steps of NAME; true if it built.
built() {
  case $(cat "$tap_tmp/$1.rc" 2>/dev/null) in
    gen) not_ok "$1: generate" "$(cat "$tap_tmp/$1.gen")"; return 1 ;;
    build) ok "$1: generate"; not_ok "$1: build (make)" "$(tail -40 "$tap_tmp/$1.build")"; return 1 ;;
    ok) ok "$1: generate"; ok "$1: build (make)"; return 0 ;;
    *) not_ok "$1: generate and build" "no result"; return 1 ;;
  esac
}

# run_all MODEL...: for each built model, its NAME_test and, when the spec
# emits training, NAME_train_test. The programs run MG_RUN_JOBS at a time
# (default: half the cores, at most 8; each spends most of its time in its
# single-threaded f64 reference, and no program measures time or device
# memory, so they share the GPU without changing a result); their reports
# follow in model order, as if run one after another. MG_TEST_KEEP=DIR
# (optional): each program's TAP output and exit status are also copied to
# DIR/NAME/ the moment it ends, so that a suite stopped by a time limit
# (make then deletes its log, and the suite its temp dir) leaves what ran.
run_all() {
  njobs=${MG_RUN_JOBS:-$(( $(nproc 2>/dev/null || echo 2) / 2 ))}
  [ "$njobs" -ge 1 ] 2>/dev/null || njobs=1
  [ "$njobs" -le 8 ] || njobs=8
  for name in "$@"; do
    [ "$(cat "$tap_tmp/$name.rc" 2>/dev/null)" = ok ] || continue
    for prog in "${name}_train_test" "${name}_test"; do   # the longer first
      [ -x "$tap_tmp/$name/$prog" ] && printf '%s|%s\n' "$tap_tmp/$name" "$prog"
    done
  done | xargs -P "$njobs" -I{} sh -c 'd=${1%|*} p=${1##*|}; (cd "$d" && "./$p") > "$d/$p.tap" 2>&1; echo $? > "$d/$p.rc"
      if [ -n "${MG_TEST_KEEP:-}" ]; then
        k=$MG_TEST_KEEP/${d##*/}; mkdir -p "$k" && cp "$d/$p.tap" "$d/$p.rc" "$k/"
      fi' \
    run_all {}
  for name in "$@"; do
    built "$name" || continue
    program_report "$tap_tmp/$name" "${name}_test" "$name"
    if [ -x "$tap_tmp/$name/${name}_train_test" ]; then
      program_report "$tap_tmp/$name" "${name}_train_test" "${name}_train_test"
    fi
  done
}

# run_program DIR PROG LABEL: run a generated TAP program now, then report
# it (program_report).
run_program() {
  (cd "$1" && "./$2") > "$1/$2.tap" 2>&1
  echo $? > "$1/$2.rc"
  program_report "$@"
}

# program_report DIR PROG LABEL: the run's output DIR/PROG.tap and exit
# status DIR/PROG.rc: its tests passed through re-numbered and prefixed with
# LABEL, its diagnostics kept; a crash, a bail-out, a non-zero exit or a
# wrong count is a failure.
program_report() {
  dir=$1 prog=$2 label=$3
  rc=$(cat "$dir/$prog.rc" 2>/dev/null) || rc=
  [ -n "$rc" ] || rc=127
  plan= seen=0 failed=0 bailed=
  while IFS= read -r line; do
    case "$line" in
      "ok "*|"not ok "*)
        seen=$((seen + 1))
        # strip "ok N - " / "not ok N - " (the " - " is optional in TAP)
        desc=$(printf '%s\n' "$line" | sed -E 's/^(not )?ok [0-9]+( - )?//')
        case "$line" in
          "not ok "*) failed=$((failed + 1)); not_ok "$label: $desc" ;;
          *) ok "$label: $desc" ;;
        esac ;;
      1..*) plan=${line#1..} ;;
      "Bail out!"*) bailed=$line; tap_diag "$label: $line" ;;
      "#"*) printf '%s\n' "$line" ;;
      "") ;;
      *) tap_diag "$label: $line" ;;
    esac
  done < "$dir/$prog.tap"

  case "$plan" in
    "0 # SKIP"*|"0 #SKIP"*)
      # the suite found a device: a program that skips for lack of one is a
      # broken setup when MG_REQUIRE_GPU=1
      if gpu_required; then
        not_ok "$label: test program ran (MG_REQUIRE_GPU=1: no skip allowed)" "it skipped: ${plan#0 # SKIP }"
      else
        skip "$label: test program" "${plan#0 # SKIP }"
      fi
      return ;;
  esac
  if [ -n "$bailed" ]; then
    not_ok "$label: test program ran to the end" "$bailed"
  elif [ -z "$plan" ]; then
    not_ok "$label: test program ran to the end" "no plan line (crashed?), exit status $rc"
  elif [ "${plan%% *}" != "$seen" ]; then
    not_ok "$label: test program ran to the end" "plan 1..$plan, saw $seen tests"
  elif [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    not_ok "$label: test program ran to the end" "exit status $rc with no failed test"
  else
    ok "$label: test program ran to the end ($seen tests, exit status $rc)"
  fi
}
