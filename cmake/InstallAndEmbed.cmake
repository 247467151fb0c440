# ctest install_and_embed (cmake -P): install the core from BUILD_DIR into a
# fresh prefix, configure core/examples as a separate project that finds it
# there, build it, run the examples, and check that the C++ host (toy_loop) and
# the C host (c_host) print the same trace.
#   -DBUILD_DIR -DSOURCE_DIR -DWORK_DIR -DCONFIG -DGENERATOR -DJOBS
#   [-DMAKE_PROGRAM -DCXX_COMPILER -DC_COMPILER]
include(${CMAKE_CURRENT_LIST_DIR}/BuildHelpers.cmake)
pn_require_vars(BUILD_DIR SOURCE_DIR WORK_DIR CONFIG GENERATOR JOBS)
if(CONFIG STREQUAL "")
  set(CONFIG Release)
endif()
set(prefix ${WORK_DIR}/prefix)
set(consumer ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

# 1. The library must be complete before it is installed.
pn_run(${CMAKE_COMMAND} --build ${BUILD_DIR} --config ${CONFIG} --target paternoster_core)
pn_run(${CMAKE_COMMAND} --install ${BUILD_DIR} --config ${CONFIG} --prefix ${prefix}
  --component paternoster_core)

# 2. The installed tree: public headers, the library and the package config;
#    none of the sources' internals.
file(GLOB_RECURSE installed RELATIVE ${prefix} ${prefix}/*)
list(SORT installed)
string(REPLACE ";" "\n  " listing "${installed}")
message(STATUS "installed into ${prefix}:\n  ${listing}")
foreach(expected include/paternoster/c_api.h include/paternoster/kv_cache_manager.h
                 include/paternoster/batch_builder.h include/paternoster/block_pool.h)
  if(NOT EXISTS ${prefix}/${expected})
    message(FATAL_ERROR "not installed: ${expected}")
  endif()
endforeach()
foreach(pattern "cmake/paternoster_core/paternoster_coreConfig.cmake$"
                "cmake/paternoster_core/paternoster_coreConfigVersion.cmake$"
                "cmake/paternoster_core/paternoster_coreTargets.cmake$"
                "libpaternoster_core\\.a$")
  set(found ${installed})
  list(FILTER found INCLUDE REGEX "${pattern}")
  if(NOT found)
    message(FATAL_ERROR "nothing installed matches ${pattern}")
  endif()
endforeach()
set(leaked ${installed})
list(FILTER leaked INCLUDE REGEX "(_internal\\.h|_kernel\\.h|\\.inc|\\.cc|_core\\..*so)$")
if(leaked)
  message(FATAL_ERROR "internal files installed: ${leaked}")
endif()

# 3. core/examples as a standalone consumer of the installed package only.
pn_configure_args(generator_args)
pn_run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/core/examples -B ${consumer} ${generator_args}
  -DCMAKE_BUILD_TYPE=${CONFIG}
  -DCMAKE_PREFIX_PATH=${prefix}
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
file(STRINGS ${consumer}/CMakeCache.txt found_dir REGEX "^paternoster_core_DIR:")
if(NOT found_dir MATCHES "=${prefix}/")
  message(FATAL_ERROR "the examples found the core elsewhere: ${found_dir}")
endif()
pn_run(${CMAKE_COMMAND} --build ${consumer} --config ${CONFIG} -j ${JOBS})

# 4. Run them; the two toy-loop hosts must agree line for line.
foreach(example embed_host toy_loop c_host hybrid_host)
  set(exe ${consumer}/${example})
  if(NOT EXISTS ${exe})
    set(exe ${consumer}/${CONFIG}/${example})  # multi-config generators
  endif()
  execute_process(COMMAND ${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE out_${example})
  message(STATUS "${example}:\n${out_${example}}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${example} exited with ${rc}")
  endif()
endforeach()
if(NOT out_toy_loop STREQUAL out_c_host)
  message(FATAL_ERROR "toy_loop (C++ API) and c_host (C API) printed different traces")
endif()
message(STATUS "install_and_embed: OK")
