# The layering of the source tree (tests/check_layering.py).
# include()d by tests/CMakeLists.txt: its directory, ditto_expect_exit, CMAKE_CURRENT_SOURCE_DIR.

# Layering (Note [Layering], tests/check_layering.py): one ctest per rule, on the source tree.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  foreach(check CoreIncludesNoBackend CoreFloorOrder BackendsIndependent InstalledHeadersArePublic
                NamedHeadersAreInstalled NoCudaMacroInCore NoBackendDynamicCast)
    add_test(NAME Layering.${check}
             COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/check_layering.py
                     ${PROJECT_SOURCE_DIR} ${check} --public-headers
                     ${CMAKE_BINARY_DIR}/public_headers.txt)
  endforeach()
  add_test(NAME Layering.SelfTest
           COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/check_layering.py --self-test)
else()
  message(STATUS "ditto: Layering.* tests not added (no python3; tools/setup.sh installs it)")
endif()
# tools/migrate_includes.sh (docs/migrating.md): every new path of its table exists, and an old
# include is rewritten to it once.
add_test(NAME Layering.MigrateIncludes
         COMMAND bash ${PROJECT_SOURCE_DIR}/tools/migrate_includes.sh --self-test)
