# `cmake --install` exports ckcheck::ckcheck (the library) and ckcheck::testing (the GoogleTest
# assertions); find_package(ckcheck) finds them.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CKCHECK_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ckcheck)
set(CKCHECK_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/ckcheck)

install(TARGETS ckcheck ckcheck_harness ckcheck_fixtures ckcheck_checks ckcheck_reports
        EXPORT ckcheckTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ckcheck_testing
        EXPORT ckcheckTestingTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ckcheck_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

foreach(dir harness checks fixtures fixtures/faulty reports)
  file(GLOB headers ${PROJECT_SOURCE_DIR}/${dir}/*.h)
  list(FILTER headers EXCLUDE REGEX "pch\\.h$")
  install(FILES ${headers} DESTINATION ${CKCHECK_INSTALL_INCLUDEDIR}/${dir})
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/generated/ckcheck/version.h
              ${PROJECT_BINARY_DIR}/generated/ckcheck/checkpoint.h
              ${PROJECT_BINARY_DIR}/generated/ckcheck/testing.h
        DESTINATION ${CKCHECK_INSTALL_INCLUDEDIR})

install(EXPORT ckcheckTargets NAMESPACE ckcheck_internal:: DESTINATION ${CKCHECK_INSTALL_CMAKEDIR})
install(EXPORT ckcheckTestingTargets NAMESPACE ckcheck_internal:: DESTINATION ${CKCHECK_INSTALL_CMAKEDIR})
configure_package_config_file(cmake/ckcheckConfig.cmake.in ${PROJECT_BINARY_DIR}/ckcheckConfig.cmake
                              INSTALL_DESTINATION ${CKCHECK_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ckcheckConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ckcheckConfig.cmake ${PROJECT_BINARY_DIR}/ckcheckConfigVersion.cmake
        DESTINATION ${CKCHECK_INSTALL_CMAKEDIR})
