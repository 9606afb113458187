#!/bin/sh
# bootstrap.sh: set up a fresh checkout: generate the build system if needed,
# configure (extra arguments go to ./configure) and build.
set -e
cd "$(dirname "$0")"
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure "$@"
make -j"$(nproc 2>/dev/null || echo 2)"
