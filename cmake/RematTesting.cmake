# remat_add_test(NAME SOURCES a.cc b.cc LIBS lib... [LABELS slow gpu ...] [TIMEOUT s])
#
# One GoogleTest executable in build/bin, registered with CTest as a single
# test named NAME (one process per binary keeps the default run quick). Labels:
#   (none)  the fast default suite, run by ./scripts/test.sh
#   slow    long randomized or stress runs:   ctest -L slow
#   gpu     needs a CUDA device (skips without one): ctest -L gpu
#   tsan    meant for the ThreadSanitizer build: ctest -L tsan
function(remat_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gmock GTest::gtest_main remat_warnings)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(labels ${ARG_LABELS})
  if(NOT labels)
    set(labels fast)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${ARG_TIMEOUT})
endfunction()
