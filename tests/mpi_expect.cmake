# What the mpirun ctest helpers (tests/mpi_*.cmake) share: running an MPMD job of two ditto-train
# processes and checking what both ranks print. include()d by them.

# ditto_mpi_run(<rc> <all> <ms> COMMAND <mpirun command>...): runs the command; <rc> its exit
# status, <all> its stdout and stderr together, <ms> how long it took in milliseconds.
function(ditto_mpi_run rc_var all_var ms_var)
  cmake_parse_arguments(PARSE_ARGV 3 arg "" "" "COMMAND")
  string(TIMESTAMP t0 "%s%f")
  execute_process(COMMAND ${arg_COMMAND} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  string(TIMESTAMP t1 "%s%f")
  math(EXPR ms "(${t1} - ${t0}) / 1000")
  set(${rc_var} "${rc}" PARENT_SCOPE)
  set(${all_var} "${out}${err}" PARENT_SCOPE)
  set(${ms_var} "${ms}" PARENT_SCOPE)
endfunction()

# ditto_regex_escape(<var> <text>): <text> with the regex metacharacters escaped.
function(ditto_regex_escape var text)
  string(REGEX REPLACE "([][.*+?^$()|\\])" "\\\\\\1" escaped "${text}")
  set(${var} "${escaped}" PARENT_SCOPE)
endfunction()

# ditto_mpi_expect(<all> <ms> RC <status> LINES <rank 0's regex> <rank 1's regex>
#                  NOT <regex> [MAX_S <s>]): fails (FATAL_ERROR, showing <all>) unless the job
# exited with <status>, printed each rank's line, printed nothing matching NOT (a crash, a
# timeout, MPI's errors) and, with MAX_S, took at most that many seconds.
function(ditto_mpi_expect all ms)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "RC;NOT;MAX_S;GOT" "LINES")
  if(NOT arg_GOT STREQUAL arg_RC)
    message(FATAL_ERROR "expected exit status ${arg_RC}, got ${arg_GOT} after ${ms} ms:\n${all}")
  endif()
  set(rank 0)
  foreach(line IN LISTS arg_LINES)
    if(NOT all MATCHES "${line}")
      message(FATAL_ERROR "rank ${rank} did not print '${line}' (after ${ms} ms):\n${all}")
    endif()
    math(EXPR rank "${rank} + 1")
  endforeach()
  if(all MATCHES "${arg_NOT}")
    message(FATAL_ERROR "the output matches '${arg_NOT}' (after ${ms} ms):\n${all}")
  endif()
  if(arg_MAX_S AND ms GREATER "${arg_MAX_S}000")
    message(FATAL_ERROR "took ${ms} ms, expected under ${arg_MAX_S} s:\n${all}")
  endif()
endfunction()
