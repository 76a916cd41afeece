# ctest helper (issue 16): one rank of an mpirun job (MPMD, each rank in its own working directory)
# refuses its own arguments or inputs before training; every rank must fail at once, exit 1, the
# refusing one with its error, the others with "rank R refused its arguments: <that error>",
# instead of waiting for the collective timeout (300 s by default).
#   cmake -DTRAIN=ditto-train "-DMPIRUN=mpirun;--oversubscribe" -DWDIR0=a -DWDIR1=b
#         "-DARGS=--data;d.csv" -DREFUSER=1 "-DWHY=read_csv: cannot open 'd.csv'" -DMAX_S=20
#         -P mpi_rank_refuses.cmake
include(${CMAKE_CURRENT_LIST_DIR}/mpi_expect.cmake)
ditto_mpi_run(rc all ms COMMAND ${MPIRUN} -np 1 -wdir ${WDIR0} ${TRAIN} ${ARGS}
                                : -np 1 -wdir ${WDIR1} ${TRAIN} ${ARGS})
ditto_regex_escape(why "${WHY}")
set(lines)
foreach(rank 0 1)
  if(rank EQUAL REFUSER)
    list(APPEND lines "ditto-train: error: rank ${rank}: ${why}")
  else()
    list(APPEND lines "ditto-train: error: rank ${rank}: rank ${REFUSER} refused its arguments: ${why}")
  endif()
endforeach()
ditto_mpi_expect("${all}" ${ms} GOT ${rc} RC 1 LINES ${lines}
                 NOT "signal|Segmentation|MPI_ERR|timed out" MAX_S ${MAX_S})
message(STATUS "exit status 1 in ${ms} ms, both ranks name rank ${REFUSER}: ${WHY}")
