# PATERNOSTER_SANITIZE: build everything in this tree (core, tests, examples)
# with the given sanitizers, e.g. -DPATERNOSTER_SANITIZE=address,undefined
# (ON means the same). UBSan findings abort (-fno-sanitize-recover), so a test
# that trips one fails; libstdc++'s assertions (_GLIBCXX_ASSERTIONS) check
# operator[] against size(), which ASan cannot see within a vector's capacity.
# The optimization level and debug info come from the build type (the ctest
# sub-build uses Debug). GCC or Clang only. For testing, not for
# installing: consumers would need the sanitizer runtimes too.
set(PATERNOSTER_SANITIZE "" CACHE STRING
  "Sanitizers for this build (-fsanitize=...), e.g. address,undefined; ON = address,undefined")

if(PATERNOSTER_SANITIZE)
  if(PATERNOSTER_SANITIZE STREQUAL "ON")
    set(_pn_sanitizers "address,undefined")
  else()
    set(_pn_sanitizers "${PATERNOSTER_SANITIZE}")
  endif()
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    message(FATAL_ERROR "PATERNOSTER_SANITIZE needs GCC or Clang")
  endif()
  add_compile_options(-fsanitize=${_pn_sanitizers} -fno-omit-frame-pointer
    -fno-sanitize-recover=all)
  add_compile_definitions(_GLIBCXX_ASSERTIONS)
  add_link_options(-fsanitize=${_pn_sanitizers})
  message(STATUS "Sanitizers: ${_pn_sanitizers}")
endif()
