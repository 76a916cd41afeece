# ctest helper: runs CMD (a ;-list) and fails unless it exits with status RC and its stdout and
# stderr together match REGEX (a CMake regular expression).
#   cmake "-DCMD=path/to/ditto-train;--trainer;ddp" -DRC=1 "-DREGEX=error: .*" -P expect_exit.cmake
execute_process(COMMAND ${CMD} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc STREQUAL "${RC}")
  message(FATAL_ERROR "expected exit status ${RC}, got ${rc}:\n${out}${err}")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}':\n${out}${err}")
endif()
message(STATUS "exit status ${rc}, output matches '${REGEX}'")
