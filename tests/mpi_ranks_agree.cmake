# ctest helper (issue 16): two ranks of one mpirun job (MPMD) that give the same effective
# settings in different ways (one leaves options at their defaults, the other spells the same
# values explicitly, or differently) must agree: the run trains, exit 0.
#   cmake -DTRAIN=ditto-train "-DMPIRUN=mpirun;--oversubscribe" "-DARGS0=--epochs;1"
#         "-DARGS1=--epochs;1;--trainer;ddp;--lr;0.050" [-DCHECKSUM=00558d72e5225d65]
#         -P mpi_ranks_agree.cmake
execute_process(COMMAND ${MPIRUN} -np 1 ${TRAIN} ${ARGS0} : -np 1 ${TRAIN} ${ARGS1}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
set(all "${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "expected exit status 0, got ${rc}:\n${all}")
endif()
if(NOT all MATCHES "final: backend=sim devices=2 determinism=bitwise trainer=ddp epochs=1 ")
  message(FATAL_ERROR "no final line of a 2-rank ddp run:\n${all}")
endif()
if(CHECKSUM AND NOT all MATCHES "params_checksum=${CHECKSUM}")
  message(FATAL_ERROR "expected params_checksum=${CHECKSUM}:\n${all}")
endif()
message(STATUS "exit status 0: rank 0 (${ARGS0}) and rank 1 (${ARGS1}) agree")
