# Sync protocol benchmark (bench/sync_bench.c): round trips, bytes over the
# ideal and CPU time for two replicas diverged by k changes each.
add_executable(sync_bench ${CMAKE_CURRENT_LIST_DIR}/sync_bench.c)
target_link_libraries(sync_bench PRIVATE cairn_crdt)
# Smoke run under ctest: converges, and meets the round-trip/byte targets.
add_test(NAME sync_bench_smoke COMMAND sync_bench 600 10 100)
set_tests_properties(sync_bench_smoke PROPERTIES TIMEOUT 120)
