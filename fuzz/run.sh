#!/bin/sh
# fuzz/run.sh: `make fuzz` (Makefile.am sets the variables below). Builds the
# libFuzzer targets fuzz/fuzz_*.c with clang -fsanitize=fuzzer,address,
# undefined, the generator's library sources (gen/*.c of libmggen and the
# build's gen/templates_embedded.c) compiled again with the same
# instrumentation into $FUZZ_DIR (the main build, gcc, is not touched), then
# runs each for $FUZZ_SECONDS seconds on its corpus. Exit 1 when a target
# finds a crash, a leak or undefined behaviour (the reproducer is
# $FUZZ_DIR/crash-* etc.; rerun it with `$FUZZ_DIR/fuzz_NAME FILE`); exit 0
# with a message when clang cannot build a libFuzzer program (skipped).
#
# Environment: srcdir, FUZZ_CC (clang), FUZZ_SECONDS (60), FUZZ_DIR
# (fuzz-build), FUZZ_TARGETS ("spec tune_cache"), FUZZ_FLAGS (more libFuzzer
# options), MG_VERSION, LUA_CFLAGS, LUA_LIBS, YAML_CFLAGS, YAML_LIBS.
set -u
srcdir=${srcdir:-.}
cc=${FUZZ_CC:-clang}
secs=${FUZZ_SECONDS:-60}
dir=${FUZZ_DIR:-fuzz-build}
targets=${FUZZ_TARGETS:-spec tune_cache}
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cflags="-std=c11 -g -O1 $san -D_POSIX_C_SOURCE=200809L -DMG_VERSION=\"${MG_VERSION:-0}\" ${LUA_CFLAGS:-} ${YAML_CFLAGS:-}"
libs="${LUA_LIBS:-} ${YAML_LIBS:-} -ldl -lm"

mkdir -p "$dir/obj" || exit 1
echo '*' > "$dir/.gitignore" # a build directory: git (and make dupcheck) ignore it
probe=$dir/probe.c
printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
  'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);' \
  'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' > "$probe"
if ! $cc -fsanitize=fuzzer,address,undefined "$probe" -o "$dir/probe" >"$dir/probe.log" 2>&1; then
  echo "fuzz: skipped: '$cc' cannot build a libFuzzer program (-fsanitize=fuzzer,address,undefined;"
  echo "fuzz: see $dir/probe.log); install clang with libFuzzer or set FUZZ_CC"
  exit 0
fi

# The generator's library, instrumented (fuzzer-no-link: coverage without main).
objs=
for src in cli_util lua_host outdir sha256 spec_yaml gpu_query tune_cache xstr templates_embedded; do
  case $src in templates_embedded) path=gen/$src.c ;; *) path=$srcdir/gen/$src.c ;; esac
  obj=$dir/obj/$src.o
  # recompiled when older than its source or any header of gen/
  if [ ! -f "$obj" ] || [ -n "$(find "$path" "$srcdir"/gen/*.h "$0" -newer "$obj" 2>/dev/null | head -n 1)" ]; then
    echo "fuzz: CC $path"
    $cc $cflags -fsanitize=fuzzer-no-link -I"$srcdir/gen" -I"$srcdir" -I. -c "$path" -o "$obj" || exit 1
  fi
  objs="$objs $obj"
done

status=0
for t in $targets; do
  exe=$dir/fuzz_$t
  echo "fuzz: CCLD $exe"
  $cc $cflags -fsanitize=fuzzer -I"$srcdir/gen" "$srcdir/fuzz/fuzz_$t.c" $objs $libs -o "$exe" || exit 1
  # corpus: new inputs go to $dir/corpus/NAME; the seeds are read from the source tree
  mkdir -p "$dir/corpus/$t" || exit 1
  seeds="$srcdir/fuzz/corpus/$t"
  [ "$t" = spec ] && seeds="$seeds $srcdir/specs $srcdir/tests/specs/schema $srcdir/tests/specs/yaml"
  dict=
  [ -f "$srcdir/fuzz/$t.dict" ] && dict="-dict=$srcdir/fuzz/$t.dict"
  echo "fuzz: $exe for ${secs}s"
  start=$(date +%s)
  # halt_on_error: the first report ends the run; detect_leaks: a leak is a finding
  ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
    "$exe" -max_total_time="$secs" -timeout=60 -rss_limit_mb=4096 -max_len=16384 \
      -artifact_prefix="$dir/" -print_final_stats=1 $dict ${FUZZ_FLAGS:-} \
      "$dir/corpus/$t" $seeds >"$dir/fuzz_$t.log" 2>&1
  rc=$?
  end=$(date +%s)
  stats=$(grep -E '^stat::number_of_executed_units' "$dir/fuzz_$t.log" | sed 's/.*: *//')
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: FAIL: fuzz_$t (exit $rc after $((end - start))s); the end of $dir/fuzz_$t.log:"
    tail -n 40 "$dir/fuzz_$t.log"
    status=1
  else
    echo "fuzz: ok: fuzz_$t, ${stats:-?} runs in $((end - start))s, corpus $(ls "$dir/corpus/$t" | wc -l) new inputs (log: $dir/fuzz_$t.log)"
  fi
done
exit $status
