# bench/lib.sh: what bench/run.sh, bench/profile.sh and bench/ab.sh share (sourced):
# generating a spec's package and building its bench program against this
# build tree's runtime. Needs $MG, $MG_RUNTIME_CFLAGS, $MG_RUNTIME_LIBS.

# bench_build SPEC DIR: the package of SPEC into DIR and its bench program
# DIR/NAME_bench built (log in DIR/build.log); on failure says why and
# returns 1. $BENCH_TEMPLATES, when set, is the template tree to generate
# from (mamba-gen --templates) instead of the embedded one; $BENCH_NVCCFLAGS,
# when set, replaces the package's NVCCFLAGS (-O3), e.g. "-O3 -lineinfo".
bench_build() {
  _name=$(basename "$1" .yaml)
  "$MG" -q ${BENCH_TEMPLATES:+--templates "$BENCH_TEMPLATES"} "$1" -o "$2" || return 1
  if ! make -s -C "$2" "${_name}_bench" NVCC="${NVCC:-nvcc}" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
       ${BENCH_NVCCFLAGS:+"NVCCFLAGS=$BENCH_NVCCFLAGS"} \
       MG_RUNTIME_CFLAGS="$MG_RUNTIME_CFLAGS" MG_RUNTIME_LIBS="$MG_RUNTIME_LIBS" >"$2/build.log" 2>&1; then
    echo "bench: build of $_name failed:"; tail -30 "$2/build.log"; return 1
  fi
}

# bench_variant SPEC PRECISION DIR: the spec to bench for PRECISION (f32,
# bf16, f16, or tf32: f32 storage with `allow_tf32: true`; "own" or the
# spec's own precision: SPEC itself, else DIR/NAME_PRECISION.yaml: SPEC with
# `name: NAME_PRECISION`, `precision: PRECISION` (f32 for tf32) and
# `allow_tf32` set accordingly, so one command benches the same model in
# each storage dtype). Prints the path.
bench_variant() {
  _name=$(basename "$1" .yaml)
  _own=$(sed -n 's/^precision: *\([a-z0-9]*\).*/\1/p' "$1")
  _tf=$(sed -n 's/^allow_tf32: *\([a-z]*\).*/\1/p' "$1")
  [ "${_tf:-false}" = true ] && _own=tf32
  if [ "$2" = own ] || [ "$2" = "${_own:-f32}" ]; then printf '%s\n' "$1"; return 0; fi
  mkdir -p "$3" || return 1
  _v=$3/${_name}_$2.yaml
  _p=$2
  [ "$2" = tf32 ] && _p=f32
  if [ -n "$_own" ]; then
    sed -e "s/^name:.*/name: ${_name}_$2/" -e "s/^precision:.*/precision: $_p/" -e '/^allow_tf32:/d' "$1" > "$_v" || return 1
  else
    { sed -e "s/^name:.*/name: ${_name}_$2/" -e '/^allow_tf32:/d' "$1"; printf 'precision: %s\n' "$_p"; } > "$_v" || return 1
  fi
  if [ "$2" = tf32 ]; then printf 'allow_tf32: true\n' >> "$_v" || return 1; fi
  printf '%s\n' "$_v"
}

# bench_commit SRC: the mamba-gen commit a bench row names when
# $MG_BENCH_COMMIT is unset: SRC's git HEAD, else the .commit file of a
# `make dist` tarball, else "unknown".
bench_commit() {
  git -C "$1" rev-parse --short=12 HEAD 2>/dev/null || cat "$1/.commit" 2>/dev/null || echo unknown
}
