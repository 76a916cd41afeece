# Install: `cmake --install build --prefix P` puts the public headers in P/include/ditto/ (by their
# repository paths, so "core/runtime/tensor.h" is found with P/include/ditto on the include path),
# the static libraries in P/lib, ditto-train, ditto-predict-table, ditto-bench and
# safetensors-info in P/bin, the bundled data in P/share/ditto, and the CMake package ditto
# (find_package(ditto), target ditto::ditto) in P/lib/cmake/ditto. Included at the end of the
# top-level CMakeLists.txt, once every target exists. The consumer project examples/consumer/ is
# built against such a prefix by the ctest Install.ConsumerBuildsAndRuns.
include(CMakePackageConfigHelpers)

# Note [Public headers]
# Installed, and so part of the API a user program may include: every header under core/ except
# core/backend_api/ (shared by core and the backends, never installed) and the private helpers of a
# folder listed in DITTO_CORE_PRIVATE_HEADERS (included only by core's own sources and the
# generated backend list), and of each backend the headers listed below: those a program needs to
# reach the backend's extras (the simulator's SimBackend with its cost model, faults, profiles and
# published-figure table, as ditto-train and bench_ddp include them; its Trainer extension
# sim::SimRun, add_sim_run, and its command-line rows, which docs/api.md and core/train/'s
# headers send users to) and the headers they include.
# The others stay inside their backend: the simulator's gemm and trace writer, and all of
# backend_cuda/, which a program reaches only through the registry (init_backend("cuda"),
# core/runtime/backend.h): its headers include the CUDA runtime, cuBLAS and NCCL, which a user
# program should not need to compile against. A list, not a folder, so that no file moves; a
# header added to a backend stays internal until listed here.
# tests/check_layering.py (ctest Layering.InstalledHeadersArePublic) checks that no installed
# header includes one that is not installed, and (Layering.NamedHeadersAreInstalled) that every
# header the user-facing docs (README.md, docs/api.md) or an installed header names is installed,
# unless that check's list says it is named as internal; Install.ConsumerBuildsAndRuns compiles
# every installed header on its own against the installed tree, and the consumer includes
# backend_sim/sim_run.h (sim_run.h was left out of this list while docs/api.md and
# core/train/trainer_config.h told users to include it, tester hB 2).
set(DITTO_SIM_PUBLIC_HEADERS
    backend_sim/sim_backend.h backend_sim/cost_model.h backend_sim/profiles.h
    backend_sim/published.h backend_sim/sim_faults.h backend_sim/sim_stream.h
    backend_sim/sim_executor.h backend_sim/sim_run.h backend_sim/sim_options.h)
set(DITTO_CUDA_PUBLIC_HEADERS "")
file(GLOB_RECURSE ditto_core_headers RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/core/*.h)
list(FILTER ditto_core_headers EXCLUDE REGEX "^core/backend_api/")
set(DITTO_CORE_PRIVATE_HEADERS core/runtime/backend_init.h core/comm/comm_checks.h
    core/runtime/ops_check.h core/runtime/ops_mixed.h)
list(REMOVE_ITEM ditto_core_headers ${DITTO_CORE_PRIVATE_HEADERS})
list(SORT ditto_core_headers)
set(ditto_public_headers ${ditto_core_headers} ${DITTO_SIM_PUBLIC_HEADERS})
if(DITTO_CUDA_ENABLED)
  list(APPEND ditto_public_headers ${DITTO_CUDA_PUBLIC_HEADERS})
endif()
# What this build installs, for tests/check_layering.py and tests/install_consumer.cmake.
string(REPLACE ";" "\n" ditto_header_lines "${ditto_public_headers}")
file(WRITE ${CMAKE_BINARY_DIR}/public_headers.txt "${ditto_header_lines}\n")

foreach(header IN LISTS ditto_public_headers)
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header}
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ditto/${dir} COMPONENT ditto_dev)
endforeach()

# The libraries, all in one export set: ditto_core links ditto (the registration of the built
# backends) and ditto links ditto_core and the backends (Note [Layering]), a cycle of static
# libraries that CMake repeats on a consumer's link line as it does here, because the imported
# targets keep these links. The consumer links ditto::ditto and gets the rest.
set(ditto_installed_libraries ditto ${ditto_libraries})
install(TARGETS ${ditto_installed_libraries} EXPORT dittoTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ditto_dev
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ditto_dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ditto)

foreach(tool ditto-train ditto-predict-table ditto-bench safetensors-info)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ditto_tools)
  endif()
endforeach()
# ditto-train's default --data (digits.csv; shakespeare.txt for --model gpt): found at run time next to the installed program
# (examples/bundled_data.h), so the installed tree works without the build or source folder.
install(FILES ${PROJECT_SOURCE_DIR}/examples/data/digits.csv
              ${PROJECT_SOURCE_DIR}/examples/data/shakespeare.txt
              ${PROJECT_SOURCE_DIR}/examples/data/SOURCES.md
        DESTINATION ${CMAKE_INSTALL_DATADIR}/ditto COMPONENT ditto_tools)

# The CMake package: dittoConfig.cmake re-finds the dependencies the static libraries were built
# with (cmake/dittoConfig.cmake.in), then includes the exported targets.
set(DITTO_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ditto)
install(EXPORT dittoTargets NAMESPACE ditto:: FILE dittoTargets.cmake
        DESTINATION ${DITTO_INSTALL_CMAKEDIR} COMPONENT ditto_dev)
# OpenBLAS (the simulator's fast-mode GEMM, when the build found it): dittoConfig.cmake searches
# for the library by name, with the folder it had here as a first hint only.
set(DITTO_OPENBLAS_ENABLED OFF)
set(DITTO_CONFIG_OPENBLAS_DIR "")
if(DITTO_OPENBLAS_FOUND)
  set(DITTO_OPENBLAS_ENABLED ON)
  list(GET DITTO_OPENBLAS_LINK_LIBRARIES 0 ditto_openblas_first)
  get_filename_component(DITTO_CONFIG_OPENBLAS_DIR "${ditto_openblas_first}" DIRECTORY)
endif()
set(DITTO_CONFIG_NCCL_INCLUDE_DIR "")
set(DITTO_CONFIG_NCCL_LIBRARY "")
if(DITTO_CUDA_ENABLED)
  set(DITTO_CONFIG_NCCL_INCLUDE_DIR "${NCCL_INCLUDE_DIR}")
  set(DITTO_CONFIG_NCCL_LIBRARY "${NCCL_LIBRARY}")
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dittoConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/package/dittoConfig.cmake
                              INSTALL_DESTINATION ${DITTO_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/package/dittoConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
set(ditto_package_files ${CMAKE_BINARY_DIR}/package/dittoConfig.cmake
    ${CMAKE_BINARY_DIR}/package/dittoConfigVersion.cmake)
if(DITTO_CUDA_ENABLED)
  list(APPEND ditto_package_files ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake)
endif()
install(FILES ${ditto_package_files} DESTINATION ${DITTO_INSTALL_CMAKEDIR} COMPONENT ditto_dev)
