# kolos_library(NAME SOURCE...): one of kolos's shared libraries, with its
# public headers in the folder's include/ (kolos/<room>/...), installed under
# CMAKE_INSTALL_INCLUDEDIR. Links, properties and install rules stay with
# the caller.
function(kolos_library name)
  add_library(${name} SHARED ${ARGN})
  target_include_directories(${name}
    PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endfunction()
