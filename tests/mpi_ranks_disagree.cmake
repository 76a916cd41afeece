# ctest helper (issue 16): two ranks of one mpirun job (MPMD) given different values of one
# option must both fail at once, each naming the option, both values and both ranks, exit 1, no
# crash, well before any timeout.
#   cmake -DTRAIN=ditto-train "-DMPIRUN=mpirun;--oversubscribe" -DFLAG=micro-shards -DV0=8 -DV1=4
#         "-DARGS=--epochs;2" -DMAX_S=15 -P mpi_ranks_disagree.cmake
include(${CMAKE_CURRENT_LIST_DIR}/mpi_expect.cmake)
ditto_mpi_run(rc all ms COMMAND ${MPIRUN} -np 1 ${TRAIN} ${ARGS} --${FLAG} ${V0}
                                : -np 1 ${TRAIN} ${ARGS} --${FLAG} ${V1})
ditto_regex_escape(v0 "${V0}")
ditto_regex_escape(v1 "${V1}")
set(lines)
foreach(rank 0 1)
  list(APPEND lines "ditto-train: error: rank ${rank}: ranks disagree on --${FLAG}: rank 0 has ${v0}, rank 1 has ${v1}\n")
endforeach()
ditto_mpi_expect("${all}" ${ms} GOT ${rc} RC 1 LINES ${lines} NOT "signal|Segmentation|MPI_ERR"
                 MAX_S ${MAX_S})
message(STATUS "exit status 1 in ${ms} ms, both ranks name --${FLAG}: ${V0} vs ${V1}")
