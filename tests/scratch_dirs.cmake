# ctest ScratchDirs.* (Note [Test scratch directories], tests/scratch_dirs.h): runs CMD, a gtest
# binary, with TEST_TMPDIR (gtest's TempDir()) and TMPDIR a new directory WORK, expects exit
# status RC, and fails unless what is left in WORK is LEFT: the names, each _<pid> ending written
# _PID (empty: nothing left), each one named once in the output as kept by its failed test
# ("ditto: kept WORK/<name>, the scratch directory of the failed ...") and still holding its
# files. REGEX, when given, must match the output too. WORK is removed when the test passes.
#   cmake "-DCMD=ditto_tests;--gtest_filter=A.b:C.d" -DRC=0 -DWORK=dir "-DREGEX=PASSED  \] 2 tests"
#         [-DLEFT=ditto_x_fails_PID;...] -P scratch_dirs.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(ENV{TEST_TMPDIR} "${WORK}")
set(ENV{TMPDIR} "${WORK}")  # std::filesystem::temp_directory_path's, mkstemp's
execute_process(COMMAND ${CMD} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
set(all "${out}${err}")
if(NOT rc STREQUAL "${RC}")
  message(FATAL_ERROR "expected exit status ${RC}, got ${rc}:\n${all}")
endif()
file(GLOB found LIST_DIRECTORIES true RELATIVE "${WORK}" "${WORK}/*")  # hidden names too
set(left "")
foreach(name IN LISTS found)
  string(REGEX REPLACE "_[0-9]+$" "_PID" generic "${name}")
  list(APPEND left "${generic}")
endforeach()
list(SORT left)
set(want "${LEFT}")
list(SORT want)
if(NOT left STREQUAL want)
  string(REPLACE ";" "\n  " found "${found}")
  message(FATAL_ERROR "left in TEST_TMPDIR ${WORK}:\n  ${found}\nexpected: '${want}'\n${all}")
endif()
foreach(name IN LISTS found)
  # Named once: the output without that line is one line's length shorter.
  set(line "ditto: kept ${WORK}/${name}, the scratch directory of the failed ")
  string(REPLACE "${line}" "" rest "${all}")
  string(LENGTH "${all}" n_all)
  string(LENGTH "${rest}" n_rest)
  string(LENGTH "${line}" n_line)
  math(EXPR times "(${n_all} - ${n_rest}) / ${n_line}")
  if(NOT times EQUAL 1)
    message(FATAL_ERROR "${WORK}/${name} was kept and named ${times} times in the output, "
                        "expected once:\n${all}")
  endif()
  file(GLOB_RECURSE files "${WORK}/${name}/*")
  if(NOT files)
    message(FATAL_ERROR "${WORK}/${name} was kept without its files:\n${all}")
  endif()
endforeach()
if(REGEX AND NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}':\n${all}")
endif()
file(REMOVE_RECURSE "${WORK}")
message(STATUS "exit status ${rc}; left in TEST_TMPDIR: '${left}', as expected")
