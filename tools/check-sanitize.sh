#!/bin/sh
# tools/check-sanitize.sh DIR: `make check-sanitize` (Makefile.am copies the
# distribution into DIR/src first and sets the variables below).
#
# 1. Host code under ASan + UBSan: DIR/src configured with
#    CC=DIR/cc-sanitize ("$CC $SANITIZE_FLAGS") (the generator, libmgrt, mg-devinfo,
#    mamba-tune and the CPU test programs all instrumented; warnings stay
#    fatal), then its `make check`, with ASAN_OPTIONS / UBSAN_OPTIONS set to
#    halt on the first error. Leak checking stays on; tools/lsan.supp only
#    silences what the CUDA runtime's own initialisation keeps allocated.
# 2. GPU code under compute-sanitizer, only with a CUDA device (mg-devinfo)
#    and compute-sanitizer ($CUDA_HOME/bin or PATH); otherwise skipped with a
#    message. The emitted test programs of SANITIZE_GPU_SPECS (small specs),
#    built against the main build's uninstrumented libmgrt (ASan and the
#    CUDA driver's address space do not mix), each run under memcheck
#    (--leak-check full), racecheck and initcheck (initcheck left out for
#    bf16/f16 storage: see the comment at the loop); any report fails.
#    racecheck skips the cuBLAS kernels (SANITIZE_GPU_RACECHECK_EXCLUDE, a
#    regex over kernel names; empty = check every kernel): their shared
#    memory is the library's business, not ours, and they are the largest
#    kernels to instrument (a racecheck run of mamba1_rl's inference
#    program with them reached check 143 of 332 in about eight minutes).
#    racecheck goes kernel by kernel (each kernel's first launches in a run
#    of its own; see probe_race_form below for why and how).
#    The default specs cover every kernel kind: mamba1_rl (sequential and
#    chunked scans, the single-launch and fused decodes, the backward, f32),
#    mamba3_rl (sequential scan, decode, backward, f32) and two chunked bf16
#    variants of them (mamba1_rl_chunked_bf16, mamba3_rl_chunked_bf16: the
#    chunked kernels and the tensor-core SSM of Mamba-3, low precision),
#    written here from the specs above. Then the autotuner's candidates:
#    `mamba-tune` of mamba1_rl and of the Mamba-3 variant, a one-point
#    sweep, under memcheck.
#    On a GPU machine: `make check-sanitize` (or only this part:
#    `tools/check-sanitize.sh --gpu-only DIR` from the build directory).
#
# Environment: MAKE, CC, SANITIZE_FLAGS, CUDA_HOME, MG_MAIN_BUILD (the main
# build directory, absolute), SANITIZE_GPU_SPECS (default: mamba1_rl
# mamba3_rl mamba1_rl_chunked_bf16 mamba3_rl_chunked_bf16; a name is
# specs/NAME.yaml or one of the two variants), SANITIZE_GPU_TOOLS (default:
# memcheck racecheck initcheck), SANITIZE_TUNE (0: skip the tuner run),
# SANITIZE_GPU_RACECHECK_EXCLUDE (default: gemm|gemv|xmma|cutlass|splitK;
# compute-sanitizer's `--kernel-name-exclude regex=...`), SANITIZE_GPU_FLAGS
# (more compute-sanitizer options for every run, e.g. "--print-limit 1000"),
# SANITIZE_RACECHECK_LAUNCHES (default 4: racecheck checks each of the
# program's own kernels on its first N launches, one kernel per run, the
# runs SANITIZE_JOBS (default: the CPU count) at a time; 0: racecheck over
# whole programs, below), SANITIZE_RACECHECK_GROUP (default 1: kernels
# checked together in one run; each run executes the whole program, so
# fewer, larger groups cut the runs when a program has many kernels),
# SANITIZE_VARIANT_BATCH, SANITIZE_VARIANT_SEQ (default 4, 64: the shapes of
# the chunked bf16 variants), SANITIZE_RACECHECK_PARTS (whole programs: each
# under racecheck as that many processes, each running a part of its
# sections; 1: one process).
# A failed run prints its reports counted by kind and kernel (the first
# lines of a report name both), so a flood from one kernel cannot hide
# another.
set -u
# (internal) --race-one PROG KERNELS LOG LIST: racecheck of KERNELS (one
# kernel, or several joined by commas: a group) in PROG, selected as
# RC_FORM says (see probe_race_form; LIST: the program's kernels),
# the report in LOG and "EXIT SECONDS" in LOG.rc; the per-kernel runs
# below start this through xargs, many at a time (environment: RC_CS
# compute-sanitizer, RC_FORM, RC_LAUNCHES, RC_EXCL the cuBLAS exclude,
# SANITIZE_GPU_FLAGS)
if [ "${1:-}" = --race-one ]; then
  set -f   # the options below hold regex characters, never file names
  start=$(date +%s)
  # alt_of: names (a line each) as a regex alternation, the regex
  # characters of a mangled name escaped
  alt_of() { sed 's/[.$]/\\&/g' | paste -sd'|' -; }
  grp=$(printf '%s\n' "$3" | tr ',' '\n')   # the group, a kernel a line
  case $RC_FORM in
    filter) sel="--kernel-name regex=^($(printf '%s\n' "$grp" | alt_of))\$ --launch-count $RC_LAUNCHES" ;;
    exclude-others|exclude-others-all)
      others=$(printf '%s\n' "$grp" | grep -vxF -f - "$5" | alt_of)
      sel=${others:+--kernel-name-exclude regex=^($others)\$}
      [ "$RC_FORM" = exclude-others ] && sel="$sel --launch-count $RC_LAUNCHES" ;;
    *) echo "check-sanitize: --race-one: unknown RC_FORM '$RC_FORM'" > "$4"; echo "1 0" > "$4.rc"; exit 0 ;;
  esac
  [ -n "${RC_EXCL:-}" ] && sel="$sel --kernel-name-exclude regex=$RC_EXCL"
  # shellcheck disable=SC2086 # sel and the flags are option words
  (cd "$(dirname "$2")" && MG_TEST_NO_CLUSTERS=1 "$RC_CS" --tool racecheck $sel ${SANITIZE_GPU_FLAGS:-} --error-exitcode 99 "$2") > "$4" 2>&1
  echo "$? $(($(date +%s) - start))" > "$4.rc"
  exit 0
fi
gpu_only=0
[ "${1:-}" = --gpu-only ] && { gpu_only=1; shift; }
dir=${1:?usage: check-sanitize.sh [--gpu-only] DIR}
MAKE=${MAKE:-make}
CC=${CC:-cc}
SANITIZE_FLAGS=${SANITIZE_FLAGS:--fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
main=${MG_MAIN_BUILD:-$(pwd)}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir" && dir=$(cd "$dir" && pwd) || exit 1
echo '*' > "$dir/.gitignore" # a build directory: git (and make dupcheck) ignore it

status=0
if [ "$gpu_only" = 0 ]; then
  echo "check-sanitize: host code with $SANITIZE_FLAGS in $dir/src"
  [ -x "$dir/src/configure" ] || { echo "check-sanitize: no $dir/src/configure (run make check-sanitize)"; exit 1; }
  supp=$here/lsan.supp
  [ -f "$supp" ] || supp=$dir/src/tools/lsan.supp
  ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  LSAN_OPTIONS="suppressions=$supp:print_suppressions=0"
  export ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
  start=$(date +%s)
  # CC is a wrapper adding the flags (the suites run "$CC" as one word, and
  # so the programs they build from emitted code are instrumented too)
  printf '#!/bin/sh\nexec %s %s "$@"\n' "$CC" "$SANITIZE_FLAGS" > "$dir/cc-sanitize" && chmod +x "$dir/cc-sanitize" || exit 1
  ( cd "$dir/src" && ./configure -q --with-cuda="$CUDA_HOME" CC="$dir/cc-sanitize" > "$dir/configure.log" 2>&1 ) ||
    { echo "check-sanitize: configure failed (see $dir/configure.log)"; tail -n 20 "$dir/configure.log"; exit 1; }
  if ( cd "$dir/src" && $MAKE check ) > "$dir/check.log" 2>&1; then
    echo "check-sanitize: host: ok ($(($(date +%s) - start))s; $dir/check.log)"
  else
    echo "check-sanitize: host: FAIL ($(($(date +%s) - start))s); the end of $dir/check.log and the failed logs:"
    tail -n 30 "$dir/check.log"
    grep -l ':test-result: \(FAIL\|ERROR\)' "$dir"/src/tests/*.trs 2>/dev/null | sed 's/\.trs$/.log/' |
      while read -r f; do echo "--- $f"; tail -n 40 "$f"; done
    status=1
  fi
  grep -E '^# (TOTAL|PASS|SKIP|FAIL|ERROR):' "$dir/check.log" | tr '\n' ' ' | sed 's/^/check-sanitize: /;s/ $/\n/'
fi

# ---- GPU: compute-sanitizer over the emitted test programs
cs=$CUDA_HOME/bin/compute-sanitizer
[ -x "$cs" ] || cs=$(command -v compute-sanitizer 2>/dev/null || true)
if [ -z "$cs" ] || [ ! -x "$cs" ]; then
  echo "check-sanitize: GPU part skipped: no compute-sanitizer (in $CUDA_HOME/bin or PATH)"
elif ! "$main/mg-devinfo" > /dev/null 2>&1; then
  echo "check-sanitize: GPU part skipped: no CUDA device ($main/mg-devinfo)"
else
  nvcc=$CUDA_HOME/bin/nvcc
  srcroot=$(sed -n 's/^abs_top_srcdir = //p' "$main/Makefile")
  rtc="-I$srcroot/runtime -I$CUDA_HOME/include"
  rtl="-L$main/.libs -Wl,-rpath,$main/.libs -lmgrt $(sed -n 's/^CUDA_LIBS = //p' "$main/Makefile") -lm"
  race_exclude=${SANITIZE_GPU_RACECHECK_EXCLUDE-gemm|gemv|xmma|cutlass|splitK}
  race_parts=${SANITIZE_RACECHECK_PARTS:-4}
  # need_count NAME VALUE MIN: exit 1, naming the setting, unless VALUE is a
  # count (decimal digits) of at least MIN
  need_count() {
    case $2 in ''|*[!0-9]*) ;; *) [ "$2" -ge "$3" ] && return 0 ;; esac
    echo "check-sanitize: $1=$2: expected a count >= $3"; exit 1
  }
  need_count SANITIZE_RACECHECK_PARTS "$race_parts" 1
  race_launches=${SANITIZE_RACECHECK_LAUNCHES:-4}
  need_count SANITIZE_RACECHECK_LAUNCHES "$race_launches" 0
  race_group=${SANITIZE_RACECHECK_GROUP:-1}
  need_count SANITIZE_RACECHECK_GROUP "$race_group" 1
  # the shapes of the chunked bf16 variants (spec_file below)
  var_batch=${SANITIZE_VARIANT_BATCH:-4}
  need_count SANITIZE_VARIANT_BATCH "$var_batch" 1
  var_seq=${SANITIZE_VARIANT_SEQ:-64}
  need_count SANITIZE_VARIANT_SEQ "$var_seq" 1
  # kernels not given a racecheck run of their own: the thread-block
  # cluster kernels, which the test programs do not launch under
  # MG_TEST_NO_CLUSTERS=1 (a run of one would check nothing)
  race_skip=${SANITIZE_RACECHECK_SKIP-decode_persistent_kernel}
  jobs=${SANITIZE_JOBS:-$(nproc 2>/dev/null || echo 4)}
  need_count SANITIZE_JOBS "$jobs" 1
  cuobjdump=$CUDA_HOME/bin/cuobjdump
  [ -x "$cuobjdump" ] || cuobjdump=$(command -v cuobjdump 2>/dev/null || true)
  # kernels_of PROG: the mangled names of the kernels compiled into PROG
  # (the entry symbols of its device code), sorted, one a line, the
  # racecheck exclude left out
  kernels_of() {
    "$cuobjdump" -symbols "$1" 2>/dev/null | awk '/STO_ENTRY/ { print $NF }' | sort -u |
      if [ -n "$race_exclude" ]; then grep -Ev "$race_exclude"; else cat; fi
  }
  # Racecheck kernel by kernel: a whole program under racecheck checks
  # every launch (mamba1_rl's inference program reached check 38 of 340 in
  # 400 s on an H100, 7 programs side by side), while a race shows in the
  # first launches of a kernel as well as in its thousandth. So each kernel
  # of a program gets a run of its own that checks its first N launches
  # and lets the rest of the program run unchecked, SANITIZE_JOBS runs at a
  # time. A kernel the program never launches is not checked; the suites
  # launch every kernel of their spec.
  # How a run selects its kernel (--race-one, at the top): "exclude-others" excludes the
  # program's other kernels by name (--kernel-name-exclude, the way the
  # cuBLAS kernels are left out) with --launch-count N; "filter" selects
  # the kernel (--kernel-name regex=^NAME$) with --launch-count N;
  # "exclude-others-all" as the first without the launch limit. Why not
  # simply "filter": on an H100 (compute-sanitizer 2025.3.1) kernels left
  # out by a --kernel-name filter that use the tensor memory accelerator
  # (cuBLAS's sm_90 bf16 GEMMs) stopped the program with "Internal
  # Sanitizer Error: The Sanitizer failed to handle a hardware exception",
  # while excluded ones ran. A kernel that runs as a thread-block cluster
  # with distributed shared memory (Mamba-1's single-launch decode) stops
  # it the same way however it is selected, filtered out or excluded (a
  # probe with such a kernel failed under all three forms), so every
  # racecheck run sets MG_TEST_NO_CLUSTERS=1: the test programs then leave
  # that kernel out (its cases are TAP skips, decode runs on the fused
  # path; mg_tap.h), and memcheck, initcheck and the suites check it.
  # The launch-limited forms failed this probe on an H100 (2025.3.1): the
  # racy kernel, the program's third launch, went unchecked under a limit
  # of 1, so they are kept only for a sanitizer that counts the selected
  # kernel's launches; there the probe picks exclusion without a limit.
  # Before a form is trusted, a probe program must pass under it: two
  # template kernels in an anonymous namespace (mangled like ours), a clean
  # one launched twice and one with a planted race launched last (a form
  # whose launch count also counted the launches it left out would never
  # reach it); the racy kernel's run must report its hazard, the clean
  # kernel's run must pass. The first form that passes is used. Without
  # cuobjdump, or when none passes, racecheck runs over whole programs
  # (SANITIZE_RACECHECK_PARTS).
  race_form=
  probe_race_form() {
    p=$dir/race_probe
    cat > "$p.cu" <<'EOF_PROBE'
// check-sanitize.sh's probe: racecheck must report probe_racy_kernel only
namespace {
template <int N> __global__ void probe_clean_kernel(int *out)
{
    __shared__ int s[N];
    s[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 32) % N];
}
template <int N> __global__ void probe_racy_kernel(int *out)
{
    __shared__ int s[N];
    s[threadIdx.x] = (int)threadIdx.x;
    out[threadIdx.x] = s[(threadIdx.x + 32) % N]; /* the other warp's slot, no barrier */
}
}
int main(void)
{
    int *d = 0;
    if (cudaMalloc(&d, 2 * 64 * sizeof(int)) != cudaSuccess) return 2;
    probe_clean_kernel<64><<<1, 64>>>(d);
    probe_clean_kernel<64><<<1, 64>>>(d + 64);
    probe_racy_kernel<64><<<1, 64>>>(d);
    return cudaDeviceSynchronize() == cudaSuccess && cudaFree(d) == cudaSuccess ? 0 : 2;
}
EOF_PROBE
    "$nvcc" -O1 -arch=native -o "$p" "$p.cu" > "$p.build.log" 2>&1 ||
      { echo "check-sanitize: racecheck probe: cannot build $p.cu ($p.build.log)"; return 1; }
    kernels_of "$p" > "$p.kernels"
    racy=$(grep probe_racy_kernel "$p.kernels")
    clean=$(grep probe_clean_kernel "$p.kernels")
    if [ -z "$racy" ] || [ -z "$clean" ]; then
      echo "check-sanitize: racecheck probe: $cuobjdump -symbols does not list the probe's two kernels"
      return 1
    fi
    # probe_run FORM KERNEL LOG: the probe's run for KERNEL under FORM; its exit status
    probe_run() {
      RC_CS=$cs RC_FORM=$1 RC_LAUNCHES=1 RC_EXCL=$race_exclude SANITIZE_GPU_FLAGS='' \
        sh "$here/check-sanitize.sh" --race-one "$p" "$2" "$3" "$p.kernels"
      read -r rc _ < "$3.rc"
      echo "$rc"
    }
    for form in exclude-others filter exclude-others-all; do
      r1=$(probe_run "$form" "$racy" "$p.racy.log")
      grep -q probe_racy_kernel "$p.racy.log" || r1="$r1 (the report does not name the racy kernel)"
      r2=$(probe_run "$form" "$clean" "$p.clean.log")
      if [ "$r1" = 99 ] && [ "$r2" = 0 ]; then race_form=$form; return 0; fi
      echo "check-sanitize: racecheck probe: $form: the racy kernel's run exit $r1 (99 expected), the clean one's $r2 (0 expected)"
    done
    return 1
  }
  case " ${SANITIZE_GPU_TOOLS:-memcheck racecheck initcheck} " in *" racecheck "*)
    if [ "$race_launches" -gt 0 ]; then
      if [ -z "$cuobjdump" ] || [ ! -x "$cuobjdump" ]; then
        echo "check-sanitize: racecheck over whole programs: no cuobjdump (in $CUDA_HOME/bin or PATH) to list the kernels"
      elif probe_race_form; then
        how="each kernel's first $race_launches launches"
        [ "$race_form" = exclude-others-all ] && how="every launch of each kernel"
        grp=
        [ "$race_group" -gt 1 ] && grp=", up to $race_group kernels a run"
        echo "check-sanitize: racecheck kernel by kernel: $how, selected by $race_form ($jobs runs at a time$grp)"
      else
        echo "check-sanitize: racecheck over whole programs: no way of selecting one kernel passed the probe (logs: $dir/race_probe.*)"
      fi
    fi;;
  esac
  # report_summary LOG: a failed run's reports counted by kind and kernel
  # (a report's first line says what, its next one where: "at KERNEL+off"),
  # its failed TAP lines, and the log's first lines when it holds no report
  # (the tool refused its options, the program did not start)
  report_summary() {
    awk '/^========= [A-Z]/ && !/ERROR SUMMARY|COMPUTE-SANITIZER/ { what = substr($0, 11); next }
         what != "" && /^=========     at / { k = $0; sub(/^=========     at /, "", k); sub(/\+0x[0-9a-f]+$/, "", k); sub(/\([^()]*\)$/, "", k)
                                            n[what " in " k]++; what = "" }
         END { for (r in n) printf "check-sanitize:   %6d x %s\n", n[r], r }' "$1" | sort -k2,2nr | head -n 20
    grep -E '^(not ok|========= ERROR SUMMARY|========= RACECHECK SUMMARY)' "$1" | head -n 10
    grep -v -E 'COMPUTE-SANITIZER|SUMMARY' "$1" | grep -q '^========= [A-Z]' || head -n 8 "$1"
  }
  # race_pool JOBS: the racecheck runs listed on stdin ("PROG KERNELS LOG
  # LIST" a line: --race-one's arguments), JOBS at a time
  race_pool() {
    RC_CS=$cs RC_FORM=$race_form RC_LAUNCHES=$race_launches RC_EXCL=$race_exclude \
      xargs -P "$1" -n 4 sh "$here/check-sanitize.sh" --race-one
  }
  # ended_early RC LOG: whether a run with exit RC and log LOG stopped
  # without a result: neither clean (0) nor reporting (99, the sanitizer's
  # --error-exitcode), and no failed check in the log (a test program
  # that fails exits 1 and prints "not ok")
  ended_early() {
    [ "$1" != 0 ] && [ "$1" != 99 ] && ! grep -q '^not ok' "$2" 2>/dev/null
  }
  # spec_file NAME: the spec of NAME (specs/NAME.yaml, or a variant written
  # into $dir/specs); empty for an unknown name. The variants are there for
  # their kernel kinds (chunked scans, 16-bit storage, tensor cores), not
  # their size: their shapes are cut to SANITIZE_VARIANT_BATCH x
  # SANITIZE_VARIANT_SEQ (default 4 x 64: four 16-step chunks), because the
  # sanitizers' time grows with the threads a program runs. At their own
  # 64 x 256 no racecheck run of either variant's programs had ended after
  # 267 s on an H100 (2026-12-06, eight runs at a time, each holding about
  # 10 GB of host memory), where the f32 programs' runs ended in minutes.
  # The f32 specs keep their shapes.
  spec_file() {
    if [ -f "$srcroot/specs/$1.yaml" ]; then echo "$srcroot/specs/$1.yaml"; return; fi
    mkdir -p "$dir/specs"
    case $1 in
      mamba1_rl_chunked_bf16|mamba3_rl_chunked_bf16)
        base=${1%_chunked_bf16}
        sed -e "s/^name:.*/name: $1/" -e 's/^precision:.*/precision: bf16/' -e 's/^\( *mode:\).*/\1 chunked/' \
            -e 's/^\( *chunk_size:\).*/\1 16/' -e "s/^\\( *max_batch:\\).*/\\1 $var_batch/" \
            -e "s/^\\( *max_seq_len:\\).*/\\1 $var_seq/" "$srcroot/specs/$base.yaml" > "$dir/specs/$1.yaml" &&
          echo "$dir/specs/$1.yaml";;
    esac
  }
  gpu_specs=${SANITIZE_GPU_SPECS:-mamba1_rl mamba3_rl mamba1_rl_chunked_bf16 mamba3_rl_chunked_bf16}
  for spec in $gpu_specs; do
    pkg=$dir/gpu/$spec
    rm -rf "$pkg"
    sf=$(spec_file "$spec")
    if [ -z "$sf" ]; then
      echo "check-sanitize: GPU: FAIL: unknown spec $spec (not in specs/, not a variant of this script)"
      status=1
      continue
    fi
    if ! "$main/mamba-gen" -q -o "$pkg" "$sf" ||
       ! make -C "$pkg" -j4 NVCC="$nvcc" CUDA_HOME="$CUDA_HOME" MG_RUNTIME_CFLAGS="$rtc" MG_RUNTIME_LIBS="$rtl" all \
         > "$dir/gpu_$spec.build.log" 2>&1; then
      echo "check-sanitize: GPU: FAIL: cannot generate or build $spec ($dir/gpu_$spec.build.log)"
      status=1
      continue
    fi
    # initcheck over 16-bit storage reports cuBLAS, not us: run on the
    # chunked bf16 variants (2026-12-05, H100), it gave 440k-706k reports
    # per program, every one we could place a read of a 16-bit cuBLAS GEMM
    # output (in_proj, x_proj, out_proj, their gradients) by one of our
    # kernels (the conv, the scans, the gate, the Mamba-3 prologue and
    # angles: the first 3000 printed), while the f32 programs, the same
    # kernels reading f32 GEMM outputs, are clean and memcheck is clean on
    # both. initcheck does not register those outputs as written; cuBLAS's
    # sm_90 16-bit kernels store them through the tensor memory accelerator.
    # Those specs run memcheck and racecheck; initcheck covers the f32 ones.
    tools=${SANITIZE_GPU_TOOLS:-memcheck racecheck initcheck}
    prec=$(sed -n 's/^precision: *\([a-z0-9]*\).*/\1/p' "$sf")
    case $prec in
      bf16|f16)
        case " $tools " in *" initcheck "*)
          tools=$(echo " $tools " | sed 's/ initcheck / /; s/^ *//; s/ *$//')
          echo "check-sanitize: GPU: initcheck left out for $spec ($prec storage: cuBLAS's TMA stores are invisible to it)";;
        esac;;
    esac
    # every program under every tool at once (separate processes on one
    # GPU; each writes its own log), then the results in a fixed order.
    # racecheck goes kernel by kernel (below) when a selection form passed
    # the probe; else, over whole programs, it is the slow tool (a Mamba-1
    # inference program reached check 38 of 340 in 400 s on an H100): each
    # program runs under it as $race_parts processes, part i of n running
    # the program's sections k % n == i (MG_TEST_PART, mg_tap.h), side by side.
    runs() {   # the runs of one program, a word each: "tool:" or "tool:i/n"
      for tool in $tools; do
        if [ "$tool" = racecheck ] && [ -n "$race_form" ]; then
          :   # kernel by kernel, below
        elif [ "$tool" = racecheck ] && [ "$race_parts" -gt 1 ]; then
          i=0
          while [ $i -lt "$race_parts" ]; do echo "$tool:$i/$race_parts"; i=$((i + 1)); done
        else
          echo "$tool:"
        fi
      done
    }
    run_of() {   # run_of PROG RUN: the run's tool, part (empty: the whole program) and log
      tool=${2%%:*} part=${2#*:}
      log=$dir/gpu_$(basename "$1").$tool${part:+.p${part%/*}}.log
    }
    for prog in "$pkg/${spec}_test" "$pkg/${spec}_train_test"; do
      [ -x "$prog" ] || continue
      for run in $(runs); do   # (a loop in this shell, not a pipe: wait sees its jobs)
        run_of "$prog" "$run"
        extra=
        [ "$tool" = memcheck ] && extra="--leak-check full"
        nocl=
        [ "$tool" = racecheck ] && nocl=1   # (see MG_TEST_NO_CLUSTERS below)
        [ "$tool" = racecheck ] && [ -n "$race_exclude" ] && extra="--kernel-name-exclude regex=$race_exclude"
        ( start=$(date +%s)
          (cd "$pkg" && MG_TEST_PART=$part MG_TEST_NO_CLUSTERS=$nocl "$cs" --tool "$tool" $extra ${SANITIZE_GPU_FLAGS:-} --error-exitcode 99 "$prog") \
            > "$log" 2>&1
          echo "$? $(($(date +%s) - start))" > "$log.rc" ) &
      done
    done
    # racecheck kernel by kernel: one pool of runs for both programs
    # (while the runs above go on), then the results per program
    race_kernels=0
    case " $tools " in *" racecheck "*) [ -n "$race_form" ] && race_kernels=1;; esac
    if [ "$race_kernels" = 1 ]; then
      rstart=$(date +%s)
      # a kernel in both programs (the forward's, in the training program
      # too) is checked in the first, the inference program, which
      # launches every forward kernel
      seen=$dir/gpu_$spec.racecheck.seen
      : > "$seen"
      for prog in "$pkg/${spec}_test" "$pkg/${spec}_train_test"; do
        [ -x "$prog" ] || continue
        b=$dir/gpu_$(basename "$prog").racecheck
        kernels_of "$prog" > "$b.all"
        grep -vxF -f "$seen" "$b.all" > "$b.new"
        cat "$b.new" >> "$seen"
        : > "$b.skipped"
        [ -n "$race_skip" ] && grep -E "$race_skip" "$b.new" > "$b.skipped"
        grep -vxF -f "$b.skipped" "$b.new" > "$b.kernels"
        rm -f "$b".k*.log "$b".k*.log.rc
        # the program's runs, "PROG KERNELS LOG LIST" a line (KERNELS: up
        # to SANITIZE_RACECHECK_GROUP kernels joined by commas): the pool's
        # arguments and, after it, the report's list
        awk -v p="$prog" -v b="$b" -v g="$race_group" '
          { k = (k == "" ? "" : k ",") $1; if (++n == g) { printf "%s %s %s.k%03d.log %s.all\n", p, k, b, ++r, b; k = ""; n = 0 } }
          END { if (n) printf "%s %s %s.k%03d.log %s.all\n", p, k, b, ++r, b }' "$b.kernels" > "$b.jobs"
        cat "$b.jobs"
      done | race_pool "$jobs"
      # A run that ended early (an exit neither 0 nor the report's 99, no
      # failed check in its log) was stopped from outside: on an H200 with
      # 16 runs at a time (2026-12-06), each of the 25 runs over the chunked
      # bf16 Mamba-1 inference program ended with exit 9 partway (after 9 to
      # 26 checks, 29 to 312 s), no hazard reported, no check failed, where
      # the f32 programs' runs had all passed at that parallelism: killed,
      # most likely for host memory (not confirmed). Such runs go again
      # once, a quarter as many at a time; the first log is kept as
      # LOG.first.
      rerun=$dir/gpu_$spec.racecheck.rerun
      for prog in "$pkg/${spec}_test" "$pkg/${spec}_train_test"; do
        [ -x "$prog" ] || continue
        b=$dir/gpu_$(basename "$prog").racecheck
        while read -r rprog rk rlog rlist; do
          read -r rc _ < "$rlog.rc" 2>/dev/null || rc=1
          if ended_early "$rc" "$rlog"; then
            mv "$rlog" "$rlog.first" && echo "$rprog $rk $rlog $rlist"
          fi
        done < "$b.jobs"
      done > "$rerun"
      if [ -s "$rerun" ]; then
        rjobs=$((jobs / 4))
        [ "$rjobs" -ge 1 ] || rjobs=1
        echo "check-sanitize: racecheck $spec: runs that ended early (killed?): $(wc -l < "$rerun"), run again $rjobs at a time"
        race_pool "$rjobs" < "$rerun"
      fi
      rsecs=$(($(date +%s) - rstart))
    fi
    wait
    if [ "$race_kernels" = 1 ]; then
      for prog in "$pkg/${spec}_test" "$pkg/${spec}_train_test"; do
        [ -x "$prog" ] || continue
        b=$dir/gpu_$(basename "$prog").racecheck
        n=$(wc -l < "$b.kernels")
        skipped=$(wc -l < "$b.skipped")
        shared=$(($(wc -l < "$b.all") - n - skipped))
        more=
        [ "$shared" -gt 0 ] && more="; the $shared it shares with ${spec}_test checked there"
        [ "$skipped" -gt 0 ] &&
          more="$more; left out by SANITIZE_RACECHECK_SKIP (cluster kernels, not launched with MG_TEST_NO_CLUSTERS=1): $skipped"
        if [ "$n" -eq 0 ] && [ "$shared" -eq 0 ] && [ "$skipped" -eq 0 ]; then
          echo "check-sanitize: GPU: FAIL: racecheck $(basename "$prog"): $cuobjdump -symbols lists no kernel of it"
          status=1
          continue
        fi
        bad=0
        while read -r _ k log _; do
          read -r rc secs < "$log.rc" 2>/dev/null || rc=1
          [ "$rc" = 0 ] && continue
          [ "$bad" = 0 ] && echo "check-sanitize: GPU: FAIL: racecheck $(basename "$prog"), kernel by kernel:"
          case $k in
            *,*) echo "check-sanitize: GPU:   kernels $(printf '%s' "$k" | sed 's/,/, /g') (exit $rc; $log):" ;;
            *) echo "check-sanitize: GPU:   kernel $k (exit $rc; $log):" ;;
          esac
          report_summary "$log"
          ended_early "$rc" "$log" &&
            echo "check-sanitize: GPU:     ended early twice, no hazard reported and no check failed (killed? fewer runs at a time: SANITIZE_JOBS, now $jobs)"
          bad=$((bad + 1))
        done < "$b.jobs"
        again=$(grep -c " $b\.k[0-9]*\.log " "$rerun")
        [ "$again" -gt 0 ] && more="$more; run again after ending early: $again"
        if [ "$bad" = 0 ]; then
          echo "check-sanitize: GPU: ok: racecheck $(basename "$prog") ($n kernels, $how$more; ${rsecs}s for the spec's runs)"
        else
          echo "check-sanitize: GPU: racecheck $(basename "$prog"): $bad of $(wc -l < "$b.jobs") runs ($n kernels) failed"
          status=1
        fi
      done
    fi
    for prog in "$pkg/${spec}_test" "$pkg/${spec}_train_test"; do
      [ -x "$prog" ] || continue
      for run in $(runs); do
        run_of "$prog" "$run"
        name="$tool $(basename "$prog")${part:+ (part $part)}"
        read -r rc secs < "$log.rc" || rc=1
        if [ "$rc" = 0 ]; then
          echo "check-sanitize: GPU: ok: $name (${secs}s; $(grep -c '^ok' "$log") TAP ok)"
        else
          echo "check-sanitize: GPU: FAIL: $name (exit $rc; $log):"
          report_summary "$log"
          status=1
        fi
      done
    done
  done
  # the autotuner's NVRTC candidates (specialized and generic) under
  # memcheck: a one-point sweep of each arch, nothing cached
  if [ "${SANITIZE_TUNE:-1}" != 0 ]; then
    for spec in mamba1_rl mamba3_rl_chunked_bf16; do
      sf=$(spec_file "$spec")
      log=$dir/tune_$spec.memcheck.log
      start=$(date +%s)
      if [ -n "$sf" ] && "$cs" --tool memcheck --error-exitcode 99 "$main/mamba-tune" "$sf" --seqlen 64 --batch 1 \
           --chunks 16 --threads 128 --iters 1 --warmup 1 --no-cache > "$log" 2>&1; then
        echo "check-sanitize: GPU: ok: memcheck mamba-tune $spec ($(($(date +%s) - start))s)"
      else
        echo "check-sanitize: GPU: FAIL: memcheck mamba-tune $spec ($log):"
        grep -E '^========= ' "$log" | head -n 20
        tail -n 5 "$log"
        status=1
      fi
    done
  fi
fi
exit $status
