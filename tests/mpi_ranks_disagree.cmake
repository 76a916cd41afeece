# ctest helper (issue 16): two ranks of one mpirun job (MPMD) given different values of one
# option must both fail at once, each naming the option, both values and both ranks, exit 1, no
# crash, well before any timeout.
#   cmake -DTRAIN=ditto-train "-DMPIRUN=mpirun;--oversubscribe" -DFLAG=micro-shards -DV0=8 -DV1=4
#         "-DARGS=--epochs;2" -DMAX_S=15 -P mpi_ranks_disagree.cmake
string(TIMESTAMP t0 "%s%f")
execute_process(COMMAND ${MPIRUN} -np 1 ${TRAIN} ${ARGS} --${FLAG} ${V0}
                        : -np 1 ${TRAIN} ${ARGS} --${FLAG} ${V1}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
string(TIMESTAMP t1 "%s%f")
math(EXPR ms "(${t1} - ${t0}) / 1000")
set(all "${out}${err}")
if(NOT rc STREQUAL "1")
  message(FATAL_ERROR "expected exit status 1, got ${rc} after ${ms} ms:\n${all}")
endif()
string(REGEX REPLACE "([][.*+?^$()|\\])" "\\\\\\1" v0 "${V0}")
string(REGEX REPLACE "([][.*+?^$()|\\])" "\\\\\\1" v1 "${V1}")
foreach(rank 0 1)
  set(line "ditto-train: error: rank ${rank}: ranks disagree on --${FLAG}: rank 0 has ${v0}, rank 1 has ${v1}\n")
  if(NOT all MATCHES "${line}")
    message(FATAL_ERROR "rank ${rank} did not print '${line}' (after ${ms} ms):\n${all}")
  endif()
endforeach()
if(all MATCHES "signal|Segmentation|MPI_ERR")
  message(FATAL_ERROR "a rank crashed or MPI failed (after ${ms} ms):\n${all}")
endif()
if(ms GREATER "${MAX_S}000")
  message(FATAL_ERROR "took ${ms} ms, expected under ${MAX_S} s:\n${all}")
endif()
message(STATUS "exit status 1 in ${ms} ms, both ranks name --${FLAG}: ${V0} vs ${V1}")
