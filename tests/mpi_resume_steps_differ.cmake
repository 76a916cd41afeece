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
execute_process(COMMAND ${MPIRUN} -np 1 -wdir ${WORK}/a ${TRAIN} --resume ck --epochs 3
                        : -np 1 -wdir ${WORK}/b ${TRAIN} --resume ck --epochs 3
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
set(all "${out}${err}")
if(NOT rc STREQUAL "1")
  message(FATAL_ERROR "expected exit status 1, got ${rc}:\n${all}")
endif()
foreach(rank 0 1)
  set(line "ditto-train: error: rank ${rank}: ranks disagree on --resume \\(the step of the checkpoint each rank resumed from\\): rank 0 has 23, rank 1 has 46\n")
  if(NOT all MATCHES "${line}")
    message(FATAL_ERROR "rank ${rank} did not name both steps:\n${all}")
  endif()
endforeach()
if(all MATCHES "ditto-train: resumed from|collective #|signal|Segmentation")
  message(FATAL_ERROR "a refused resume was reported, or the ranks reached a collective:\n${all}")
endif()
message(STATUS "both ranks name the steps 23 and 46")
