# libkolos_base's sources (torch-free: errors, the dtype table, config,
# plugin registry), as absolute paths. core/CMakeLists.txt builds the
# library from them; the fuzz targets (tests/fuzz/project) compile only
# sources from this list and checkpoint/sources.cmake, so the include check
# of the torch-free libraries (tests/unit/build) covers them too.
set(KOLOS_BASE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/src/error.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/format.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/dtype/dtype.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/config/run_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/config/core_tables.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/config/toml_input.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/config/role_checks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/config/section.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/config/roles.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/mesh/mesh_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/mesh/mesh_shape.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/plugin/plugin_library.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/plugin/plugin_stamp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/plugin/plugin_table.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/plugin/plugin_registry.cpp
)
