# Shared build helpers: warning flags, library and test declarations.

# Applies kvserve's compile options to a target.
function(kvserve_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${KVSERVE_WERROR}>>:-Werror>)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()

# kvserve_library(NAME SOURCES a.cc b.cc DEPS dep1 dep2)
function(kvserve_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  kvserve_defaults(${name})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# kvserve_test(NAME SOURCES a_test.cc DEPS lib1 LABELS label1)
# Builds a GoogleTest binary and registers it with CTest. Tests read shared data through the
# KVSERVE_SHARED_DIR definition (../shared beside the checkout). Its main() is
# tests/test_util/test_main.cc: in CI a skip without a declared reason fails (ci_skip.h).
# SHARDS N (N > 1) registers the binary as N tests, <name>_<i>of<N>, each running every N-th
# test case (GoogleTest sharding), so a long suite's parts run side by side under ctest
# --parallel (the sanitizer jobs are where it matters).
function(kvserve_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;SHARDS" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  kvserve_defaults(${name})
  target_compile_definitions(${name} PRIVATE KVSERVE_SHARED_DIR="${KVSERVE_SHARED_DIR}")
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest kvserve_test_main)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(tests ${name})
  if(ARG_SHARDS AND ARG_SHARDS GREATER 1)
    set(tests)
    math(EXPR last "${ARG_SHARDS} - 1")
    foreach(i RANGE ${last})
      add_test(NAME ${name}_${i}of${ARG_SHARDS} COMMAND ${name})
      set_tests_properties(${name}_${i}of${ARG_SHARDS} PROPERTIES ENVIRONMENT
        "GTEST_TOTAL_SHARDS=${ARG_SHARDS};GTEST_SHARD_INDEX=${i}")
      list(APPEND tests ${name}_${i}of${ARG_SHARDS})
    endforeach()
  else()
    add_test(NAME ${name} COMMAND ${name})
  endif()
  set_tests_properties(${tests} PROPERTIES TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LABELS)
    set_tests_properties(${tests} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()
