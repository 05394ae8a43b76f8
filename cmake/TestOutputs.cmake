# Prints, one per line, the files under a build tree that the selected
# tests name, relative to that tree, so `cmake --build` (Ninja takes file
# paths as targets) builds those and nothing else:
#   cmake -DBUILD=build-torch2 "-DARGS=-L;unit;-LE;fuzz" -P cmake/TestOutputs.cmake
# ARGS selects tests as ctest does. A test's own program and every file of
# the tree its command names (the plugins that the *_has_no_fault_switch
# tests read) are listed; what tests load at run time through
# KOLOS_PLUGIN_PATH is the `runtime` target's. ctest leaves out the command
# of a test whose program is not built yet, so the commands are read from
# the CTestTestfile.cmake files that configuring wrote.
# `make test-torch2` builds the unit tests of the LibTorch 2.x tree this way.
cmake_minimum_required(VERSION 3.20)
get_filename_component(build "${BUILD}" REALPATH)
execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --show-only=json-v1 ${ARGS}
                WORKING_DIRECTORY "${build}" OUTPUT_VARIABLE json RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ctest --show-only in ${build} failed (${rc}); is it configured?")
endif()
set(selected "")
string(JSON count LENGTH "${json}" tests)
if(count GREATER 0)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON name GET "${json}" tests ${i} name)
    list(APPEND selected "${name}")
  endforeach()
endif()

file(GLOB_RECURSE testfiles "${build}/CTestTestfile.cmake")
string(LENGTH "${build}/" prefix)
set(outputs "")
set(found "")
foreach(testfile IN LISTS testfiles)
  file(STRINGS "${testfile}" lines REGEX "^add_test\\(")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^add_test\\(\\[=\\[([^]]+)\\]=\\]")
      continue()
    endif()
    set(name "${CMAKE_MATCH_1}")
    if(NOT name IN_LIST selected)
      continue()
    endif()
    list(APPEND found "${name}")
    string(REGEX MATCHALL "\"[^\"]*\"" args "${line}")
    foreach(arg IN LISTS args)
      string(REGEX REPLACE "^\"(.*)\"$" "\\1" arg "${arg}")
      string(FIND "${arg}" "${build}/" at)
      if(at EQUAL 0)
        string(SUBSTRING "${arg}" ${prefix} -1 relative)
        list(APPEND outputs "${relative}")
      endif()
    endforeach()
  endforeach()
endforeach()
foreach(name IN LISTS selected)
  if(NOT name IN_LIST found)
    message(FATAL_ERROR "test ${name}: no add_test() line under ${build}")
  endif()
endforeach()
list(REMOVE_DUPLICATES outputs)
foreach(o IN LISTS outputs)
  # message() writes to stderr; execute_process's echo goes to stdout.
  execute_process(COMMAND ${CMAKE_COMMAND} -E echo "${o}")
endforeach()
