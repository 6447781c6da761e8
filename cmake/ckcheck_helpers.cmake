# One way to declare a ckcheck library, so every target compiles with the same flags and can reuse
# the one precompiled header built for ckcheck_support.
function(ckcheck_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  if(CKCHECK_HAS_CUDA)
    target_compile_definitions(${target} PUBLIC CKCHECK_WITH_CUDA=1)
  endif()
  if(NOT CKCHECK_HAS_GLOO)
    target_compile_definitions(${target} PUBLIC CKCHECK_NO_GLOO=1)
  endif()
  if(CKCHECK_HAS_CUDA AND NOT CKCHECK_HAS_NCCL)
    target_compile_definitions(${target} PUBLIC CKCHECK_NO_NCCL=1)
  endif()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    # -fPIC, not -fPIE: the shared precompiled header is built with -fPIC, and GCC refuses it
    # for a file compiled otherwise (then every test file would parse the torch headers anew).
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fPIC>)
  endif()
  if(CKCHECK_PCH)
    if(target STREQUAL "ckcheck_support")
      target_precompile_headers(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${PROJECT_SOURCE_DIR}/harness/support/pch.h>)
    else()
      target_precompile_headers(${target} REUSE_FROM ckcheck_support)
    endif()
  endif()
endfunction()

function(ckcheck_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/harness/include>
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/testing/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
    $<INSTALL_INTERFACE:include>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  ckcheck_target_defaults(${name})
endfunction()
