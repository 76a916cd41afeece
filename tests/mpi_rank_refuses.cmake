# ctest helper (issue 16): one rank of an mpirun job (MPMD, each rank in its own working directory)
# refuses its own arguments or inputs before training; every rank must fail at once, exit 1, the
# refusing one with its error, the others with "rank R refused its arguments: <that error>",
# instead of waiting for the collective timeout (300 s by default).
#   cmake -DTRAIN=ditto-train "-DMPIRUN=mpirun;--oversubscribe" -DWDIR0=a -DWDIR1=b
#         "-DARGS=--data;d.csv" -DREFUSER=1 "-DWHY=read_csv: cannot open 'd.csv'" -DMAX_S=20
#         -P mpi_rank_refuses.cmake
string(TIMESTAMP t0 "%s%f")
execute_process(COMMAND ${MPIRUN} -np 1 -wdir ${WDIR0} ${TRAIN} ${ARGS}
                        : -np 1 -wdir ${WDIR1} ${TRAIN} ${ARGS}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
string(TIMESTAMP t1 "%s%f")
math(EXPR ms "(${t1} - ${t0}) / 1000")
set(all "${out}${err}")
if(NOT rc STREQUAL "1")
  message(FATAL_ERROR "expected exit status 1, got ${rc} after ${ms} ms:\n${all}")
endif()
string(REGEX REPLACE "([][.*+?^$()|\\])" "\\\\\\1" why "${WHY}")
foreach(rank 0 1)
  if(rank EQUAL REFUSER)
    set(line "ditto-train: error: rank ${rank}: ${why}")
  else()
    set(line "ditto-train: error: rank ${rank}: rank ${REFUSER} refused its arguments: ${why}")
  endif()
  if(NOT all MATCHES "${line}")
    message(FATAL_ERROR "rank ${rank} did not print '${line}' (after ${ms} ms):\n${all}")
  endif()
endforeach()
if(all MATCHES "signal|Segmentation|MPI_ERR|timed out")
  message(FATAL_ERROR "a rank crashed, timed out or MPI failed (after ${ms} ms):\n${all}")
endif()
if(ms GREATER "${MAX_S}000")
  message(FATAL_ERROR "took ${ms} ms, expected under ${MAX_S} s:\n${all}")
endif()
message(STATUS "exit status 1 in ${ms} ms, both ranks name rank ${REFUSER}: ${WHY}")
