# cmake -DBUILD_DIR=... -DWORK_DIR=... -DCONSUMER_DIR=... -DC_COMPILER=... -DGENERATOR=...
#       [-DCONSUMER_CXX_DIR=... -DCXX_COMPILER=...] -P install_test.cmake
#
# Installs the build into a fresh prefix, then builds and runs the consumer
# program (consumer/) twice: with find_package(remat) and with pkg-config.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

file(GLOB_RECURSE installed RELATIVE ${prefix} ${prefix}/*)
foreach(name include/remat/remat.h libremat.so cmake/remat/rematConfig.cmake
             include/remat/cpp/runtime/runtime.h include/remat/cpp/allocator/caching_allocator.h
             libremat_runtime.a cmake/remat/rematCxxTargets.cmake
             cmake/remat/rematConfigVersion.cmake pkgconfig/remat.pc)
  set(hits ${installed})
  list(FILTER hits INCLUDE REGEX "(^|/)${name}$")
  if(NOT hits)
    message(FATAL_ERROR "not installed: ${name}\ninstalled: ${installed}")
  endif()
endforeach()

# find_package(remat) -> remat::remat
run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/cmake-build -G ${GENERATOR}
    -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/cmake-build)
run(${WORK_DIR}/cmake-build/consumer)
message(STATUS "find_package consumer: ${run_output}")

# pkg-config --cflags --libs remat
find_program(PKG_CONFIG pkg-config)
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "pkg-config not found (apt-get install pkg-config)")
endif()
file(GLOB_RECURSE pc ${prefix}/*/pkgconfig/remat.pc)
get_filename_component(pc_dir ${pc} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
run(${PKG_CONFIG} --cflags --libs remat)
string(STRIP "${run_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${PKG_CONFIG} --variable=libdir remat)
string(STRIP "${run_output}" libdir)
run(${C_COMPILER} -std=c99 -Wall -Wextra -Wpedantic -Werror ${CONSUMER_DIR}/consumer.c ${flags}
    -Wl,-rpath,${libdir} -o ${WORK_DIR}/consumer_pc)
run(${WORK_DIR}/consumer_pc)
message(STATUS "pkg-config consumer: ${run_output}")

# find_package(remat COMPONENTS cxx) -> remat::runtime, from a C++ program
# outside the tree (Abseil found through the package's own dependency).
if(CXX_COMPILER)
  run(${CMAKE_COMMAND} -S ${CONSUMER_CXX_DIR} -B ${WORK_DIR}/cxx-build -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/cxx-build)
  run(${WORK_DIR}/cxx-build/consumer_cxx)
  message(STATUS "C++ consumer: ${run_output}")
endif()
