# Note [Grouped gtest ctests]
# DITTO_CTEST_GROUPS=ON (the check preset, CI) registers ditto_tests' cases with ctest in groups,
# one process a group (a test suite, or a part of up to DITTO_CTEST_GROUP_SIZE of its cases in
# gtest's order), instead of gtest_discover_tests' one process a case. Under ASan + UBSan the
# 98 MB test binary takes about 0.1 s of CPU to start and exit (its relocations, the sanitizers'
# setup of globals, LeakSanitizer's scan at exit), so its 1272 cases took 187 s of ctest -j2
# (354 s of CPU) one a process and 144 s (258 s of CPU) as 180 groups (the check build on an
# idle 2-core machine, session 49). A group is named after its suite,
# "Suite.*", or "Suite.*#k" for its k-th part; ctest prints the failing case's name with its
# output (gtest's summary). A group is skipped when all its cases were (gtest_main.cpp's
# --ditto_all_skipped_exit_code, SKIP_RETURN_CODE), and passes when some pass and the others
# skip (their "[  SKIPPED ]" lines and reasons are in its output: ctest -V). Off by default: a
# developer's ctest -R Suite.Case runs one case, and its failure is the ctest's own.
#
# ditto_gtest_groups(TARGET <target> GROUP_SIZE <n> TIMEOUT <s> [PROPERTIES <prop> <value>...]):
# discovers the cases after each build of <target> (--gtest_list_tests; as gtest_discover_tests'
# POST_BUILD mode) and writes the groups' add_test calls for ctest to include.
function(ditto_gtest_groups)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "TARGET;GROUP_SIZE;TIMEOUT" "PROPERTIES")
  set(base "${CMAKE_CURRENT_BINARY_DIR}/${arg_TARGET}_groups")
  add_custom_command(
    TARGET ${arg_TARGET} POST_BUILD
    BYPRODUCTS "${base}_tests.cmake"
    COMMAND "${CMAKE_COMMAND}" -D "EXE=$<TARGET_FILE:${arg_TARGET}>" -D "OUT=${base}_tests.cmake"
            -D "GROUP_SIZE=${arg_GROUP_SIZE}" -D "TIMEOUT=${arg_TIMEOUT}"
            -D "PROPERTIES=${arg_PROPERTIES}"
            -P "${PROJECT_SOURCE_DIR}/tests/cmake/gtest_groups_write.cmake"
    VERBATIM)
  file(WRITE "${base}_include.cmake"
       "if(EXISTS \"${base}_tests.cmake\")\n"
       "  include(\"${base}_tests.cmake\")\n"
       "else()\n"
       "  add_test(${arg_TARGET}_NOT_BUILT ${arg_TARGET}_NOT_BUILT)\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${base}_include.cmake")
endfunction()
