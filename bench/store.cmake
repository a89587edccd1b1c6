# store_bench: the store's durable-write, memory, disk and reopen numbers.
# Included by bench/CMakeLists.txt (owned by the loadgen engineer):
#   include(${CMAKE_CURRENT_SOURCE_DIR}/store.cmake)
if(TARGET cairn_store)
  add_executable(store_bench ${CMAKE_CURRENT_LIST_DIR}/store_bench.c)
  target_link_libraries(store_bench PRIVATE cairn_store cairn_crdt Threads::Threads)
  # change_cost: one change per write against N writes per change, in the
  # store alone (build/bench/change_cost DIR [seconds] [writers] [batch]).
  add_executable(change_cost ${CMAKE_CURRENT_LIST_DIR}/change_cost.c)
  target_link_libraries(change_cost PRIVATE cairn_store cairn_crdt Threads::Threads)
endif()
