# CRDT document benchmark and the two-replica demo (owner: doc).
add_executable(crdt_bench ${CMAKE_CURRENT_LIST_DIR}/crdt_bench.c)
target_link_libraries(crdt_bench PRIVATE cairn_crdt)

# scripts/run.sh runs build/cairn-demo until the server exists.
add_executable(cairn-demo ${CMAKE_CURRENT_LIST_DIR}/cairn_demo.c)
target_link_libraries(cairn-demo PRIVATE cairn_crdt)
set_target_properties(cairn-demo PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

# Smoke runs so that neither rots: the demo exits non-zero if the replicas
# diverge; the bench checks both replicas' dumps agree at the end.
add_test(NAME cairn_demo COMMAND cairn-demo)
add_test(NAME crdt_bench_smoke COMMAND crdt_bench 3000 1000)
add_test(NAME crdt_bench_checkpoint_smoke COMMAND crdt_bench checkpoint 3000 2)
set_tests_properties(cairn_demo crdt_bench_smoke crdt_bench_checkpoint_smoke PROPERTIES TIMEOUT 120)
