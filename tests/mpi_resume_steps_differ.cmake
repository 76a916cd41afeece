# ctest helper (issue 31): two ranks of one mpirun job resume from node-local checkpoints (the same
# --resume ck in two working directories) at different steps: both fail at once naming the steps
# (it failed later with a collective count mismatch), exit 1, no "resumed from".
#   cmake -DTRAIN=ditto-train "-DMPIRUN=mpirun;--oversubscribe" -DWORK=dir -P mpi_resume_steps_differ.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/a ${WORK}/b)
foreach(case "a;1" "b;2")
  list(GET case 0 dir)
  list(GET case 1 epochs)
  execute_process(COMMAND ${TRAIN} --epochs ${epochs} --checkpoint ck WORKING_DIRECTORY ${WORK}/${dir}
                  OUTPUT_QUIET RESULT_VARIABLE rc)
  if(NOT rc STREQUAL "0")
    message(FATAL_ERROR "--epochs ${epochs} --checkpoint ck in ${dir}: exit status ${rc}")
  endif()
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/mpi_expect.cmake)
ditto_mpi_run(rc all ms COMMAND ${MPIRUN} -np 1 -wdir ${WORK}/a ${TRAIN} --resume ck --epochs 3
                                : -np 1 -wdir ${WORK}/b ${TRAIN} --resume ck --epochs 3)
set(lines)
foreach(rank 0 1)
  list(APPEND lines "ditto-train: error: rank ${rank}: ranks disagree on --resume \\(the step of the checkpoint each rank resumed from\\): rank 0 has 23, rank 1 has 46\n")
endforeach()
# A refused resume is not reported as done, and the ranks reach no collective.
ditto_mpi_expect("${all}" ${ms} GOT ${rc} RC 1 LINES ${lines}
                 NOT "ditto-train: resumed from|collective #|signal|Segmentation")
message(STATUS "both ranks name the steps 23 and 46")
