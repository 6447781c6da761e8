# Run after the test executable is linked (cmake -P): writes OUT, the CTest tests of the executable
# BIN, one per GoogleTest suite (`gtest.SUITE`, run with --gtest_filter=SUITE.*), except the suites
# named in CASE_SUITES (a ;-list), whose tests are registered one by one with SKIP_REGEX so that a
# test that skips (no GPU here) is reported as skipped. A process per suite instead of per test:
# each process loads LibTorch, about a second of CPU on a small machine, 316 times otherwise.
cmake_minimum_required(VERSION 3.24)
execute_process(COMMAND "${BIN}" --gtest_list_tests OUTPUT_VARIABLE listing ERROR_VARIABLE errors
                RESULT_VARIABLE result TIMEOUT 120)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${BIN} --gtest_list_tests failed (${result}): ${errors}")
endif()

string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(suite "")
set(body "# Written by cmake/gtest_suites.cmake from ${BIN} --gtest_list_tests\n")
foreach(line IN LISTS lines)
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.")
    set(suite "${CMAKE_MATCH_1}")
    if(NOT suite IN_LIST CASE_SUITES)
      list(APPEND suites "${suite}")
      string(APPEND body "add_test([=[gtest.${suite}]=] [=[${BIN}]=] [=[--gtest_filter=${suite}.*]=])\n"
                         "set_tests_properties([=[gtest.${suite}]=] PROPERTIES TIMEOUT ${SUITE_TIMEOUT})\n")
    endif()
  elseif(line MATCHES "^  ([^ #]+)" AND suite IN_LIST CASE_SUITES)
    set(name "${suite}.${CMAKE_MATCH_1}")
    string(APPEND body "add_test([=[${name}]=] [=[${BIN}]=] [=[--gtest_filter=${name}]=])\n"
                       "set_tests_properties([=[${name}]=] PROPERTIES TIMEOUT ${CASE_TIMEOUT} "
                       "SKIP_REGULAR_EXPRESSION [=[${SKIP_REGEX}]=])\n")
  endif()
endforeach()
if(NOT suites)
  message(FATAL_ERROR "${BIN} --gtest_list_tests listed no test suite")
endif()
file(WRITE "${OUT}" "${body}")
