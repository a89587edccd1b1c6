#!/usr/bin/env bash
# Installs dependencies, builds cairn twice (plain with -Werror, and with
# ASan+UBSan under clang) and runs every test: unit suites, fuzz corpus replay,
# integration and conformance tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
JOBS=$(nproc)

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_WERROR=ON >/dev/null
cmake --build build -j"$JOBS"
(cd build && ctest --output-on-failure -j"$JOBS")

# The sanitizer leg is built with clang: its UBSan checks more than gcc's
# (e.g. pointer arithmetic on NULL), and -Werror holds under both compilers.
if [ -f build-asan/CMakeCache.txt ] && ! grep -q '^CMAKE_C_COMPILER:[A-Z]*=.*clang' build-asan/CMakeCache.txt; then
  rm -rf build-asan # configured with another compiler
fi
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCAIRN_WERROR=ON -DCAIRN_ASAN=ON \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-asan -j"$JOBS"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$JOBS" -LE no-asan)
