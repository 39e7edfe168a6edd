# remat_add_test(NAME SOURCES a.cc b.cc LIBS lib... [LABELS slow gpu ...] [TIMEOUT s] [PYTHON])
#
# One GoogleTest executable in build/bin, registered with CTest as a single
# test named NAME (one process per binary keeps the default run quick). Labels:
#   (none)  the fast default suite, run by ./scripts/test.sh
#   slow    long randomized or stress runs:   ctest -L slow
#   gpu     needs a CUDA device (skips without one): ctest -L gpu
#   tsan    meant for the ThreadSanitizer build: ctest -L tsan
# PYTHON: the test runs python3 (tests/run_command.h: Python3(), RunPython());
# it gets the interpreter's path as REMAT_PYTHON3, and should skip without one.
find_package(Python3 COMPONENTS Interpreter)

function(remat_add_test name)
  cmake_parse_arguments(ARG "PYTHON" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gmock GTest::gtest_main remat_warnings)
  if(ARG_PYTHON AND Python3_Interpreter_FOUND)
    target_compile_definitions(${name} PRIVATE REMAT_PYTHON3="${Python3_EXECUTABLE}")
  endif()
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(labels ${ARG_LABELS})
  if(NOT labels)
    set(labels fast)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${ARG_TIMEOUT})
  if("gpu" IN_LIST labels)
    # Without a device every test skips (GTEST_SKIP, saying why): ctest then
    # reports the binary as skipped, not as passed.
    set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  PASSED  \\] 0 tests")
  endif()
endfunction()
