# Checks on the text of the tree, included by the top-level CMakeLists.txt with the tests:
#   Docs.<page>         every command of README.md and docs/*.md runs and prints what the page
#                       shows (tools/check_docs.py, Note [Doc tests] there); one ctest per page
#   Docs.SelfTest       the runner's own test
#   Format.ChangedFiles the C++ and CUDA files changed since .clang-format was added are formatted
#                       (tools/check_format.sh, Note [Format check]); skipped, saying why, without
#                       clang-format or git
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "ditto: Docs.* tests not added (no python3; tools/setup.sh installs it)")
elseif(DITTO_SANITIZE MATCHES "thread")
  # The pages' dry runs reserved simulated 80 GB devices, whose address space crowded TSan's (the
  # DittoTrainCli.DryRun* tests are left out under TSan for the same reason; since issue 29 a dry
  # run maps nothing, Note [Dry addresses]: both can go once a TSan run of them passes).
  message(STATUS "ditto: Docs.* tests not added under TSan (the pages' dry runs)")
elseif(TARGET ditto-train AND TARGET train_minimal AND TARGET api_tour AND TARGET safetensors-info)
  set(ditto_docs_env "")
  if(DITTO_SANITIZE MATCHES "address")
    # As tests/CMakeLists.txt: Open MPI's own allocations past MPI_Finalize (the mpirun blocks;
    # tools/check_docs.py adds fast_unwind_on_malloc=0 to those commands alone);
    # print_suppressions=0: LSan's "Suppressions used" table would land in the output a page shows.
    set(ditto_docs_env ENVIRONMENT_MODIFICATION
        "LSAN_OPTIONS=string_prepend:print_suppressions=0:suppressions=${PROJECT_SOURCE_DIR}/tools/sanitizers/lsan.supp:")
  endif()
  set(ditto_docs_mpi "")
  if(DITTO_MPI_ENABLED)
    set(ditto_docs_mpi --mpi)
  endif()
  file(GLOB ditto_doc_pages CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
  foreach(page ${PROJECT_SOURCE_DIR}/README.md ${ditto_doc_pages})
    get_filename_component(name ${page} NAME_WE)
    add_test(NAME Docs.${name}
             COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/tools/check_docs.py
                     --build ${CMAKE_BINARY_DIR} --source ${PROJECT_SOURCE_DIR} ${ditto_docs_mpi}
                     ${page})
    set_tests_properties(Docs.${name} PROPERTIES TIMEOUT 300 ${ditto_docs_env}
      PASS_REGULAR_EXPRESSION "PASS: " FAIL_REGULAR_EXPRESSION "FAIL")
  endforeach()
  add_test(NAME Docs.SelfTest
           COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/tools/check_docs.py --self-test)
  set_tests_properties(Docs.SelfTest PROPERTIES PASS_REGULAR_EXPRESSION "PASS")
else()
  message(STATUS "ditto: Docs.* tests not added (they run ditto-train, train_minimal, api_tour and "
                 "safetensors-info: DITTO_BUILD_EXAMPLES=ON builds them)")
endif()

add_test(NAME Format.ChangedFiles COMMAND bash ${PROJECT_SOURCE_DIR}/tools/check_format.sh)
set_tests_properties(Format.ChangedFiles PROPERTIES SKIP_RETURN_CODE 77)
