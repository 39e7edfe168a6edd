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
