# Torch-free targets: libraries (and their tools) that must include nothing
# from LibTorch, directly or through any header, so that they build, test
# and fuzz on a machine without it (docs/building.md, "Torch-free
# libraries").
#
#   kolos_torch_free(TARGET...)
#
# marks them. The mark is checked twice:
# - at configure time (kolos_check_torch_free(), called once at the end of
#   the top-level CMakeLists.txt): a marked target that links LibTorch, or
#   a kolos target that does, stops configure;
# - by the test `torch_free_includes` (tests/unit/build/): every translation
#   unit of a marked target is preprocessed with -M -MG, which lists each
#   header it would include, found or not, and any under c10/, ATen/ or
#   torch/ fails the test, whatever the machine has installed.
function(kolos_torch_free)
  foreach(target IN LISTS ARGN)
    if(NOT TARGET ${target})
      message(FATAL_ERROR "kolos_torch_free: no target `${target}`")
    endif()
    set_property(GLOBAL APPEND PROPERTY KOLOS_TORCH_FREE_TARGETS ${target})
  endforeach()
endfunction()

# The libraries a torch-free target must not link, directly or through one
# of kolos's own targets.
set(KOLOS_TORCH_LINK_NAMES kolos_core kolos_torch_pch ${TORCH_LIBRARIES}
  kolos_torch_cpu kolos_torch_c10 kolos_torch_cuda kolos_torch_c10_cuda torch torch_cpu c10)

function(kolos_check_torch_free)
  get_property(targets GLOBAL PROPERTY KOLOS_TORCH_FREE_TARGETS)
  foreach(target IN LISTS targets)
    set(queue ${target})
    set(seen "")
    while(queue)
      list(POP_FRONT queue t)
      if(t IN_LIST seen OR NOT TARGET ${t})
        continue()
      endif()
      list(APPEND seen ${t})
      get_target_property(libs ${t} LINK_LIBRARIES)
      get_target_property(ilibs ${t} INTERFACE_LINK_LIBRARIES)
      foreach(lib IN LISTS libs ilibs)
        if(NOT lib OR lib MATCHES "-NOTFOUND$")
          continue()
        endif()
        string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" lib "${lib}")
        if(lib IN_LIST KOLOS_TORCH_LINK_NAMES)
          message(FATAL_ERROR "`${target}` is marked torch-free (kolos_torch_free) but links "
                              "LibTorch through `${t}` -> `${lib}`")
        endif()
        if(TARGET ${lib})
          list(APPEND queue ${lib})
        endif()
      endforeach()
    endwhile()
  endforeach()
  list(JOIN targets ";" joined)
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/torch_free_targets.txt CONTENT "${joined}\n")
endfunction()
