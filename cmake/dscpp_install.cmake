# `cmake --install` gives the headers, the libraries and a CMake package: find_package(dscpp) → dscpp::dscpp.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(dscpp_libs GLOBAL PROPERTY DSCPP_LIBRARIES)
install(TARGETS ${dscpp_libs} dscpp EXPORT dscppTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/dscpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT dscppTargets NAMESPACE dscpp:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dscpp)
configure_package_config_file(cmake/dscppConfig.cmake.in ${PROJECT_BINARY_DIR}/dscppConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dscpp)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dscppConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dscppConfig.cmake ${PROJECT_BINARY_DIR}/dscppConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dscpp)
