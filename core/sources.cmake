# libkolos_base's sources (torch-free: errors, the dtype table, config,
# plugin registry), as absolute paths. core/CMakeLists.txt builds the
# library from them; the fuzz targets (tests/fuzz/project) compile only
# sources from this list and checkpoint/sources.cmake, so the include check
# of the torch-free libraries (tests/unit/build) covers them too.
set(KOLOS_BASE_SOURCES
  error.cpp format.cpp
  dtype/dtype.cpp
  config/run_config.cpp config/core_tables.cpp config/toml_input.cpp
  config/role_checks.cpp config/section.cpp config/roles.cpp
  mesh/mesh_layout.cpp mesh/mesh_shape.cpp
  plugin/plugin_library.cpp plugin/plugin_stamp.cpp plugin/plugin_table.cpp
  plugin/plugin_registry.cpp
  runtime/malloc_tuning.cpp
)
list(TRANSFORM KOLOS_BASE_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/src/)
