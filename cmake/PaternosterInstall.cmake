# Install rules of the C++ package, component paternoster_core:
#   <prefix>/include/paternoster/*.h                      public headers (incl. c_api.h)
#   <prefix>/lib/libpaternoster_core.a                    the static library
#   <prefix>/lib/cmake/paternoster_core/                  paternoster_coreConfig.cmake,
#       paternoster_coreConfigVersion.cmake, paternoster_coreTargets*.cmake
# (lib is CMAKE_INSTALL_LIBDIR, e.g. lib64 on some distributions). Included by
# the top-level CMakeLists.txt outside scikit-build only, so the wheel never
# carries it.
include(CMakePackageConfigHelpers)

set(PATERNOSTER_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/paternoster_core"
  CACHE STRING "Where to install paternoster_coreConfig.cmake (relative to the prefix)")

install(TARGETS paternoster_core
  EXPORT paternoster_coreTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT paternoster_core
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT paternoster_core
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT paternoster_core)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/core/include/paternoster
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT paternoster_core
  FILES_MATCHING PATTERN "*.h")
install(EXPORT paternoster_coreTargets
  NAMESPACE paternoster::
  DESTINATION ${PATERNOSTER_INSTALL_CMAKEDIR}
  COMPONENT paternoster_core)

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/paternoster_coreConfig.cmake.in
  ${PROJECT_BINARY_DIR}/paternoster_coreConfig.cmake
  INSTALL_DESTINATION ${PATERNOSTER_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API, so only the same minor matches.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/paternoster_coreConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/paternoster_coreConfig.cmake
  ${PROJECT_BINARY_DIR}/paternoster_coreConfigVersion.cmake
  DESTINATION ${PATERNOSTER_INSTALL_CMAKEDIR}
  COMPONENT paternoster_core)
