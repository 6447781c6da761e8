# `cmake --install` exports ckcheck::ckcheck (the library) and ckcheck::testing (the GoogleTest
# assertions); find_package(ckcheck) finds them.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CKCHECK_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ckcheck)
set(CKCHECK_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/ckcheck)

# Only the public API is installed: <ckcheck/checkpoint.h>, <ckcheck/model.h>, <ckcheck/testing.h>
# and <ckcheck/version.h>. The stages behind them are static libraries whose headers stay inside.
install(TARGETS ckcheck ckcheck_support ckcheck_checkpoint ckcheck_model
        EXPORT ckcheckTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ckcheck_runner ckcheck_checks ckcheck_analyses ckcheck_reports ckcheck_testing
        EXPORT ckcheckTestingTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ckcheck_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

file(GLOB public_headers ${PROJECT_SOURCE_DIR}/harness/include/ckcheck/*.h ${PROJECT_SOURCE_DIR}/testing/include/ckcheck/*.h)
install(FILES ${public_headers} ${PROJECT_BINARY_DIR}/generated/ckcheck/version.h
        DESTINATION ${CKCHECK_INSTALL_INCLUDEDIR})

install(EXPORT ckcheckTargets NAMESPACE ckcheck_internal:: DESTINATION ${CKCHECK_INSTALL_CMAKEDIR})
install(EXPORT ckcheckTestingTargets NAMESPACE ckcheck_internal:: DESTINATION ${CKCHECK_INSTALL_CMAKEDIR})
# What the installed config finds first (ckcheckConfig.cmake.in).
set(CKCHECK_BUILT_TORCH_DIR "${Torch_DIR}")
set(CKCHECK_BUILT_CUDA "${CKCHECK_HAS_CUDA}")
configure_package_config_file(cmake/ckcheckConfig.cmake.in ${PROJECT_BINARY_DIR}/ckcheckConfig.cmake
                              INSTALL_DESTINATION ${CKCHECK_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ckcheckConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ckcheckConfig.cmake ${PROJECT_BINARY_DIR}/ckcheckConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/ckcheck_pin_torch.cmake
        DESTINATION ${CKCHECK_INSTALL_CMAKEDIR})
