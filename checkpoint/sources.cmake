# The checkpoint readers' sources (torch-free: HDF5 helpers, CRC32C, the
# index and shard reader that `kolos ckpt verify` and load run), as absolute
# paths: the object library kolos_checkpoint_reader (checkpoint/CMakeLists.txt)
# and the fuzz target fuzz_checkpoint (tests/fuzz/project) both build them.
set(KOLOS_CHECKPOINT_READER_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/src/crc32c.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/h5.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/reader.cpp
)
