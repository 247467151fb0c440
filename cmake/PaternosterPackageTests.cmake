# Two ctest tests that drive other CMake builds (cmake -P scripts next to this
# file); neither needs Python or a GPU.
#
#   install_and_embed     installs this build's core (component paternoster_core)
#                         into ${CMAKE_BINARY_DIR}/install_and_embed/prefix,
#                         builds core/examples there as a separate project with
#                         find_package(paternoster_core), runs the examples and
#                         compares the C++ and the C host's traces.
#   core_tests_sanitized  configures this source tree again in
#                         ${CMAKE_BINARY_DIR}/sanitize with
#                         PATERNOSTER_SANITIZE=address,undefined (no Python, no
#                         CUDA), builds core_tests and the examples, and runs
#                         their ctest suite with LeakSanitizer on.
#
# Labels: "package" and "sanitize" (ctest -LE sanitize skips the slow one).
# Neither is registered in a build that is itself sanitized (PATERNOSTER_SANITIZE):
# its library needs the sanitizer runtimes, so it is not one to install.
set(_pn_build_args
  -DGENERATOR=${CMAKE_GENERATOR}
  -DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}
  -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
  -DC_COMPILER=${CMAKE_C_COMPILER}
  -DCTEST_COMMAND=${CMAKE_CTEST_COMMAND}
  -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
  -DJOBS=2)

if(PATERNOSTER_TEST_INSTALL AND NOT PATERNOSTER_SANITIZE)
  add_test(NAME install_and_embed
    COMMAND ${CMAKE_COMMAND} ${_pn_build_args}
      -DBUILD_DIR=${PROJECT_BINARY_DIR}
      -DWORK_DIR=${PROJECT_BINARY_DIR}/install_and_embed
      -DCONFIG=$<CONFIG>
      -P ${CMAKE_CURRENT_LIST_DIR}/InstallAndEmbed.cmake)
  set_tests_properties(install_and_embed PROPERTIES TIMEOUT 600 LABELS package)
endif()

if(PATERNOSTER_TEST_SANITIZERS AND NOT PATERNOSTER_SANITIZE AND TARGET core_tests
   AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_test(NAME core_tests_sanitized
    COMMAND ${CMAKE_COMMAND} ${_pn_build_args}
      -DWORK_DIR=${PROJECT_BINARY_DIR}/sanitize
      -DSANITIZE=address,undefined
      -P ${CMAKE_CURRENT_LIST_DIR}/SanitizedTests.cmake)
  set_tests_properties(core_tests_sanitized PROPERTIES TIMEOUT 1500 LABELS sanitize)
endif()
