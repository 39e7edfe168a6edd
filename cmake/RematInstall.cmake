# cmake --install: the C ABI (libremat.so, include/remat/remat.h), a CMake
# package (find_package(remat) gives remat::remat) and a pkg-config file
# (remat.pc). Both are relocatable: install with --prefix anywhere.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(REMAT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/remat)

install(TARGETS remat_c EXPORT rematTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/integrations/c_api/remat.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/remat)
install(EXPORT rematTargets NAMESPACE remat:: DESTINATION ${REMAT_CMAKE_DIR})

# The C++ API: the static libraries of the device, the allocator, the policies
# and the runtime, with their headers under include/remat/cpp (included as in
# the tree: "runtime/runtime.h"). find_package(remat COMPONENTS cxx) gives
# remat::runtime (and remat::allocator, remat::device, ...), with Abseil (and
# CUDA where the build has it) found for the consumer; without the component,
# find_package(remat) stays the C ABI alone and needs nothing else.
set(REMAT_CXX_TARGETS remat_base remat_device remat_device_maker remat_allocator remat_policies
                      remat_runtime remat_stack remat_warnings)
set(REMAT_EXPORT_CUDA OFF)
if(TARGET remat_cuda_device)
  list(APPEND REMAT_CXX_TARGETS remat_cuda_device)
  set(REMAT_EXPORT_CUDA ON)
endif()
foreach(target IN LISTS REMAT_CXX_TARGETS)
  string(REGEX REPLACE "^remat_" "" export_name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  target_include_directories(${target}
    INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/remat/cpp>)
endforeach()
install(TARGETS ${REMAT_CXX_TARGETS} EXPORT rematCxxTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT rematCxxTargets NAMESPACE remat:: DESTINATION ${REMAT_CMAKE_DIR})
foreach(dir base device allocator policies runtime)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/remat/cpp/${dir}
          FILES_MATCHING PATTERN "*.h"
          PATTERN "*_test*" EXCLUDE PATTERN "*fixture*" EXCLUDE)
endforeach()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/rematConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/rematConfig.cmake
                              INSTALL_DESTINATION ${REMAT_CMAKE_DIR})
# 0.x: minor versions may break the ABI.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/rematConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/rematConfig.cmake ${PROJECT_BINARY_DIR}/rematConfigVersion.cmake
        DESTINATION ${REMAT_CMAKE_DIR})

# remat.pc finds the prefix from its own location (${pcfiledir}).
file(RELATIVE_PATH REMAT_PC_PREFIX_FROM_PCDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" REMAT_PC_PREFIX_FROM_PCDIR "${REMAT_PC_PREFIX_FROM_PCDIR}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/remat.pc.in ${PROJECT_BINARY_DIR}/remat.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/remat.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
