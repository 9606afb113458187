# bench/lib.sh: what bench/run.sh and bench/profile.sh share (sourced):
# generating a spec's package and building its bench program against this
# build tree's runtime. Needs $MG, $MG_RUNTIME_CFLAGS, $MG_RUNTIME_LIBS.

# bench_build SPEC DIR: the package of SPEC into DIR and its bench program
# DIR/NAME_bench built (log in DIR/build.log); on failure says why and
# returns 1.
bench_build() {
  _name=$(basename "$1" .yaml)
  "$MG" -q "$1" -o "$2" || return 1
  if ! make -s -C "$2" "${_name}_bench" NVCC="${NVCC:-nvcc}" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
       MG_RUNTIME_CFLAGS="$MG_RUNTIME_CFLAGS" MG_RUNTIME_LIBS="$MG_RUNTIME_LIBS" >"$2/build.log" 2>&1; then
    echo "bench: build of $_name failed:"; tail -30 "$2/build.log"; return 1
  fi
}
