# ctest core_tests_sanitized (cmake -P): configure SOURCE_DIR again in WORK_DIR
# with PATERNOSTER_SANITIZE=SANITIZE (no Python, no CUDA, not these meta tests),
# build core_tests and the examples, and run that build's ctest suite (the
# unit tests one process each, plus the examples) with LeakSanitizer on and
# every UBSan finding fatal. Incremental: a second run rebuilds only what changed.
#   -DSOURCE_DIR -DWORK_DIR -DSANITIZE -DGENERATOR -DCTEST_COMMAND -DJOBS
#   [-DMAKE_PROGRAM -DCXX_COMPILER -DC_COMPILER]
include(${CMAKE_CURRENT_LIST_DIR}/BuildHelpers.cmake)
pn_require_vars(SOURCE_DIR WORK_DIR SANITIZE GENERATOR CTEST_COMMAND JOBS)

pn_configure_args(generator_args)
pn_run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} ${generator_args}
  # Debug (-O0 -g): under ASan+UBSan the attention kernels take 5x longer to
  # compile at -O2 and 2x at -O1, and the tests still run in seconds at -O0.
  -DCMAKE_BUILD_TYPE=Debug
  -DPATERNOSTER_SANITIZE=${SANITIZE}
  -DPATERNOSTER_BUILD_PYTHON=OFF
  -DPATERNOSTER_BUILD_CUDA=OFF
  -DPATERNOSTER_BUILD_TESTS=ON
  -DPATERNOSTER_BUILD_EXAMPLES=ON
  -DPATERNOSTER_TEST_INSTALL=OFF
  -DPATERNOSTER_TEST_SANITIZERS=OFF)
pn_run(${CMAKE_COMMAND} --build ${WORK_DIR} -j ${JOBS})

# Options given in the environment come last, so they win.
set(ENV{ASAN_OPTIONS} "detect_leaks=1:$ENV{ASAN_OPTIONS}")
set(ENV{UBSAN_OPTIONS} "print_stacktrace=1:halt_on_error=1:$ENV{UBSAN_OPTIONS}")
message(STATUS "ASAN_OPTIONS=$ENV{ASAN_OPTIONS} UBSAN_OPTIONS=$ENV{UBSAN_OPTIONS}")
execute_process(COMMAND ${CTEST_COMMAND} --output-on-failure -j ${JOBS}
  WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "sanitized tests failed (ctest exit status ${rc})")
endif()
