# Sync protocol benchmark (bench/sync_bench.c): round trips, bytes over the
# ideal and CPU time for two replicas diverged by k changes each.
add_executable(sync_bench ${CMAKE_CURRENT_LIST_DIR}/sync_bench.c)
target_link_libraries(sync_bench PRIVATE cairn_crdt)
