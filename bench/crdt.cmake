# CRDT document benchmark and the two-replica demo (owner: doc).
add_executable(crdt_bench ${CMAKE_CURRENT_LIST_DIR}/crdt_bench.c)
target_link_libraries(crdt_bench PRIVATE cairn_crdt)

# scripts/run.sh runs build/cairn-demo until the server exists.
add_executable(cairn-demo ${CMAKE_CURRENT_LIST_DIR}/cairn_demo.c)
target_link_libraries(cairn-demo PRIVATE cairn_crdt)
set_target_properties(cairn-demo PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
