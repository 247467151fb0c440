# Helpers for the cmake -P test scripts (InstallAndEmbed.cmake,
# SanitizedTests.cmake).

# Fails the script unless every named variable was passed with -D.
function(pn_require_vars)
  foreach(v IN LISTS ARGN)
    if(NOT DEFINED ${v})
      message(FATAL_ERROR "pass -D${v}=...")
    endif()
  endforeach()
endfunction()

# Runs a command, echoing it; fails the script if it exits non-zero.
function(pn_run)
  string(REPLACE ";" " " _line "${ARGN}")
  message(STATUS "+ ${_line}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "exit status ${_rc}: ${_line}")
  endif()
endfunction()

# Sets ${out} to the -G/-D arguments that make a configure step use the same
# generator and compilers as the build that registered the test.
function(pn_configure_args out)
  set(_args -G "${GENERATOR}")
  foreach(pair "MAKE_PROGRAM;CMAKE_MAKE_PROGRAM" "CXX_COMPILER;CMAKE_CXX_COMPILER"
               "C_COMPILER;CMAKE_C_COMPILER")
    list(GET pair 0 _in)
    list(GET pair 1 _var)
    if(${_in})
      list(APPEND _args "-D${_var}=${${_in}}")
    endif()
  endforeach()
  set(${out} "${_args}" PARENT_SCOPE)
endfunction()
