# The CPU emulation of the CUDA execution model (cuda/emu/cuda_emu.h), in three
# parts, each included where its prerequisites are known:
#   pn_cuda_emu_runtime()  the scheduler library paternoster_cuda_emu_runtime
#   pn_cuda_emu_module()   paternoster._cuda_emu: cuda/src compiled as host C++
#                          over it, with the bindings of paternoster._cuda_ops
#   pn_cuda_emu_tests()    cuda_emu_tests: the emulator's own GoogleTest tests
# Needs the CUDA toolkit's headers (cuda_fp16.h, cuda_bf16.h, cuda_runtime.h),
# an x86-64 GCC or Clang, and for the module the Python interpreter (it rewrites
# the launches, cuda/emu/rewrite_launches.py).

function(pn_cuda_emu_runtime)
  find_package(CUDAToolkit REQUIRED)
  add_library(paternoster_cuda_emu_runtime STATIC cuda/emu/emu_runtime.cc)
  target_include_directories(paternoster_cuda_emu_runtime PUBLIC cuda/emu
    ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_options(paternoster_cuda_emu_runtime PUBLIC
    -include "${CMAKE_CURRENT_SOURCE_DIR}/cuda/emu/cuda_emu.h"
    -Wno-unknown-pragmas -Wno-class-memaccess)
  target_compile_options(paternoster_cuda_emu_runtime PRIVATE -Wall -Wextra)
  set_target_properties(paternoster_cuda_emu_runtime PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

function(pn_cuda_emu_module)
  set(sources)
  foreach(name attention_api decode_attention prefill_attention reshape_and_cache)
    set(out "${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/${name}.cc")
    add_custom_command(
      OUTPUT "${out}"
      COMMAND "${Python_EXECUTABLE}" "${CMAKE_CURRENT_SOURCE_DIR}/cuda/emu/rewrite_launches.py"
              "${CMAKE_CURRENT_SOURCE_DIR}/cuda/src/${name}.cu" "${out}"
      DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/cuda/src/${name}.cu"
              "${CMAKE_CURRENT_SOURCE_DIR}/cuda/emu/rewrite_launches.py"
      COMMENT "cuda/emu: ${name}.cu as host C++"
      VERBATIM)
    list(APPEND sources "${out}")
  endforeach()
  pybind11_add_module(_cuda_emu cuda/bindings/module.cc ${sources})
  target_include_directories(_cuda_emu PRIVATE cuda/include cuda/src)
  target_compile_definitions(_cuda_emu PRIVATE PATERNOSTER_CUDA_EMU)
  target_link_libraries(_cuda_emu PRIVATE paternoster_cuda_emu_runtime)
endfunction()

function(pn_cuda_emu_tests)
  add_executable(cuda_emu_tests cuda/emu/tests/emu_test.cc)
  target_link_libraries(cuda_emu_tests PRIVATE paternoster_cuda_emu_runtime GTest::gtest
    GTest::gtest_main)
  gtest_discover_tests(cuda_emu_tests DISCOVERY_TIMEOUT 60)
endfunction()
