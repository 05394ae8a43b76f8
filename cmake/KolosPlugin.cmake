# kolos_add_plugin(NAME <name> SOURCES ... [LIBS ...] [NO_INSTALL])
# Builds libkolos_<name>.so into lib/kolos/plugins of the build tree and
# installs it into lib/kolos/plugins.
function(kolos_add_plugin)
  cmake_parse_arguments(P "NO_INSTALL;TORCH_PCH" "NAME;OUTPUT_DIR" "SOURCES;LIBS" ${ARGN})
  set(target kolos_${P_NAME})
  add_library(${target} MODULE ${P_SOURCES})
  if(NOT P_OUTPUT_DIR)
    set(P_OUTPUT_DIR ${KOLOS_PLUGIN_OUTPUT_DIR})
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX "lib" OUTPUT_NAME kolos_${P_NAME}
    LIBRARY_OUTPUT_DIRECTORY ${P_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  target_link_libraries(${target} PRIVATE kolos_core ${P_LIBS})
  if(P_TORCH_PCH)
    kolos_reuse_torch_pch(${target})
  endif()
  if(NOT P_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION ${KOLOS_PLUGIN_INSTALL_DIR})
    add_dependencies(runtime ${target})
  endif()
endfunction()

# kolos_plugin_terms(<file>...): a plugin's memory terms (torch-free,
# registered with KOLOS_PLUGIN_TERMS; kolos/core/plugin_terms.h) go into
# libkolos_plugin_terms, which the core's estimate and the planner link.
function(kolos_plugin_terms)
  foreach(file IN LISTS ARGN)
    target_sources(kolos_plugin_terms PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/${file})
  endforeach()
endfunction()

# kolos_plugin_library(<name> <source>...): code that several plugins of a
# folder share (and its tests link), a static library compiled as the
# plugins are (position-independent, hidden visibility, the shared
# LibTorch precompiled header), its headers in the folder, on kolos_core.
function(kolos_plugin_library name)
  add_library(${name} STATIC ${ARGN})
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  target_include_directories(${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC kolos_core)
  kolos_reuse_torch_pch(${name})
endfunction()
