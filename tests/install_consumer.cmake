# ctest Install.ConsumerBuildsAndRuns: installs the build tree into an empty prefix and uses it as
# a user would, printing PASS at the end (any failure stops with FATAL_ERROR, a non-zero status):
#  1. cmake --install BUILD --prefix WORK/prefix; the public headers, libraries, tools, data and
#     package files are there, and nothing else under include/ (no core/backend_api/);
#  2. the installed ditto-train finds its data in prefix/share/ditto and prints the default
#     run's params_checksum;
#  3. examples/consumer configured with -DCMAKE_PREFIX_PATH=WORK/prefix (find_package(ditto) from
#     the prefix, not the build tree), built, run on the installed digits.csv: "consumer: OK",
#     exit status 0 (it includes backend_sim/sim_run.h and trains an epoch with
#     sim::add_sim_run's profile, as docs/api.md shows: the header was once not installed);
#     docs/api.md shows examples/consumer/CMakeLists.txt verbatim;
#  4. tests/installed_headers: every installed header compiles on its own against the prefix.
#   cmake -DBUILD=B -DSOURCE=S -DWORK=W -DGENERATOR=G -DCXX=c++ [-DLAUNCHER=ccache]
#         -DHEADERS=B/public_headers.txt -P install_consumer.cmake
cmake_minimum_required(VERSION 3.22)
set(checksum eda947d0bde4cbf6)
file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)

function(run what)  # run(what COMMAND ...): the command must exit 0; its output is kept in `out`
  execute_process(${ARGN} OUTPUT_VARIABLE o ERROR_VARIABLE e RESULT_VARIABLE rc)
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "FAIL: ${what}: exit status ${rc}:\n${o}${e}")
  endif()
  set(out "${o}${e}" PARENT_SCOPE)
endfunction()

# 1. Install, then compare the installed headers with the build's list of public headers.
run("cmake --install" COMMAND ${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
file(STRINGS ${HEADERS} expected)
list(SORT expected)
file(GLOB_RECURSE installed RELATIVE ${prefix}/include/ditto ${prefix}/include/ditto/*)
list(SORT installed)
if(NOT installed STREQUAL expected)
  message(FATAL_ERROR "FAIL: installed headers differ from ${HEADERS}:\n"
                      "installed: ${installed}\nexpected: ${expected}")
endif()
list(LENGTH installed n_headers)
foreach(f include/ditto/core/runtime/tensor.h include/ditto/backend_sim/sim_backend.h
          lib/libditto.a lib/libditto_core.a lib/libditto_sim.a lib/cmake/ditto/dittoConfig.cmake
          lib/cmake/ditto/dittoConfigVersion.cmake lib/cmake/ditto/dittoTargets.cmake
          bin/ditto-train bin/safetensors-info share/ditto/digits.csv)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "FAIL: cmake --install did not install ${f}")
  endif()
endforeach()
if(EXISTS ${prefix}/include/ditto/core/backend_api)
  message(FATAL_ERROR "FAIL: core/backend_api/ was installed")
endif()
message(STATUS "installed ${n_headers} public headers into ${prefix}")
# The exported targets name no library by this machine's path (issue 31, item 13: they linked
# /usr/lib/.../libopenblas.so, so the installed tree could not move to a machine without that
# file): OpenBLAS is the imported target ditto::openblas, found again by dittoConfig.cmake.
file(GLOB target_files ${prefix}/lib/cmake/ditto/dittoTargets*.cmake)
foreach(f IN LISTS target_files)
  file(READ ${f} text)
  if(text MATCHES "[^\n]*libopenblas[^\n]*")
    message(FATAL_ERROR "FAIL: ${f} links OpenBLAS by an absolute path:\n${CMAKE_MATCH_0}")
  endif()
endforeach()

# 2. The installed ditto-train, default run: data from the prefix, the usual checksum.
run("installed ditto-train" COMMAND ${prefix}/bin/ditto-train)
if(NOT out MATCHES "data=${prefix}/share/ditto/digits.csv ")
  message(FATAL_ERROR "FAIL: installed ditto-train did not read "
                      "${prefix}/share/ditto/digits.csv:\n${out}")
endif()
if(NOT out MATCHES "params_checksum=${checksum}")
  message(FATAL_ERROR "FAIL: installed ditto-train: expected params_checksum=${checksum}:\n${out}")
endif()
message(STATUS "installed ditto-train: data from the prefix, params_checksum=${checksum}")

# 3. and 4. Two projects of their own against the prefix only.
set(configure_args -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
foreach(project consumer installed_headers)
  if(project STREQUAL "consumer")
    set(src ${SOURCE}/examples/consumer)
  else()
    set(src ${SOURCE}/tests/installed_headers)
  endif()
  run("configure ${project}" COMMAND ${CMAKE_COMMAND} -S ${src} -B ${WORK}/${project}
      ${configure_args})
  file(STRINGS ${WORK}/${project}/CMakeCache.txt ditto_dir REGEX "^ditto_DIR:")
  if(NOT ditto_dir STREQUAL "ditto_DIR:PATH=${prefix}/lib/cmake/ditto")
    message(FATAL_ERROR "FAIL: ${project} found ditto elsewhere than the prefix: ${ditto_dir}")
  endif()
  file(STRINGS ${WORK}/${project}/CMakeCache.txt ditto_dep REGEX "^OPENBLAS_LIBRARY:")
  if(ditto_dep MATCHES "OPENBLAS_LIBRARY:FILEPATH=([^;]*)")
    message(STATUS "${project}: OpenBLAS found on this machine: ${CMAKE_MATCH_1}")
  endif()
  run("build ${project}" COMMAND ${CMAKE_COMMAND} --build ${WORK}/${project} -j2)
  message(STATUS "${project}: configured against ${prefix}, built")
endforeach()
# docs/api.md shows examples/consumer/CMakeLists.txt: it must be the real file, verbatim.
file(READ ${SOURCE}/examples/consumer/CMakeLists.txt consumer_cmake)
file(READ ${SOURCE}/docs/api.md readme)
string(FIND "${readme}" "```cmake\n${consumer_cmake}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "FAIL: docs/api.md (Install and use from CMake) does not show "
                      "examples/consumer/CMakeLists.txt as it is")
endif()
run("consumer" COMMAND ${WORK}/consumer/consumer ${prefix}/share/ditto/digits.csv)
if(NOT out MATCHES "^consumer: OK: .*sim::add_sim_run\\(h100-sxm\\): an epoch of the Trainer")
  message(FATAL_ERROR "FAIL: consumer printed:\n${out}")
endif()
message(STATUS "${out}")
message(STATUS "PASS: install into an empty prefix, installed ditto-train, consumer, "
               "${n_headers} installed headers each compiled alone")
