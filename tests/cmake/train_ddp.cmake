# ditto-train --trainer ddp: DataParallel's checksum, and the dp trainer's other features.
# include()d by tests/CMakeLists.txt: its directory, ditto_expect_exit, CMAKE_CURRENT_SOURCE_DIR.

# --trainer ddp (DistributedDataParallel, a thread per rank) prints DataParallel's checksum.
if(TARGET ditto-train)
  foreach(n 1 4)
    add_test(NAME DittoTrainCli.DdpEqualsDp_${n}devices
             COMMAND ${CMAKE_COMMAND} -DTRAIN=$<TARGET_FILE:ditto-train>
                     "-DARGS=--epochs;2;--devices;${n};--bucket-cap-mb;0.001"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/compare_trainers.cmake)
  endforeach()
endif()

# --trainer ddp with the dp trainer's other features: checkpoints (rank 0 saves, every rank
# resumes; the same checksum as an uninterrupted run, also mid-epoch and across trainers), the
# cost model's prediction, memory report and trace, and injected faults.
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.DdpCheckpointResumeEqualsUninterrupted RC 0 REGEX "PASS" TIMEOUT 120
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_ddp_checkpoint.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_ddp_checkpoint)
  ditto_expect_exit(DittoTrainCli.DdpProfilePrintsPredictionMemoryAndTrace RC 0
    COMMAND $<TARGET_FILE:ditto-train> --trainer ddp --profile h100-sxm --devices 2 --nodes 2 --epochs 1
            --trace ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_ddp_trace.json
    REGEX "final: backend=sim devices=4 determinism=bitwise trainer=ddp .*predicted: 4 x NVIDIA H100 SXM5 80GB \\(2 nodes, nvlink\\) step_time=[0-9.]+ ms samples/s=[0-9]+ comm_share=[0-9.]+% mfu=.*measured: .*memory: sim:3 live=[0-9.]+ MiB peak=[0-9.]+ MiB capacity=81559.00 MiB.*trace: wrote .*ditto_train_ddp_trace.json")
  # A rank that never joins collective #4: every rank fails with the Timeout naming rank 1 after
  # --comm-timeout-ms (2 s: long enough that a rank slowed by a loaded machine at an earlier
  # collective is not the one named; the TIMEOUT only guards against a hang); exit code 1.
  ditto_expect_exit(DittoTrainCli.DdpSkippedCollectiveTimesOutNamingTheRank RC 1
    REGEX "ditto-train: error: [a-z_]+ \\(collective #4 on this communicator\\): timed out after 2000 ms waiting for rank 1 \\(communicator of 4 ranks"
    COMMAND $<TARGET_FILE:ditto-train> --trainer ddp --fault skip-collective:rank=1,index=3 --comm-timeout-ms 2000
    TIMEOUT 30)
  # Issue 31 (habits): a collective that has waited DITTO_COMM_WARN_AFTER_MS (10 s by default;
  # 1 s here) prints one line naming the missing rank, before the timeout's error (dp).
  ditto_expect_exit(DittoTrainCli.SkippedCollectiveWarnsBeforeItsTimeout RC 1
    REGEX "ditto: warning: reduce \\(collective #4 on this communicator\\): waited 1 s for rank 1 \\(communicator of 4 ranks\\); it fails with a timeout after 3000 ms\nditto-train: error: reduce \\(collective #4 on this communicator\\): timed out after 3000 ms waiting for rank 1"
    COMMAND env DITTO_COMM_WARN_AFTER_MS=1000 $<TARGET_FILE:ditto-train> --fault skip-collective:rank=1,index=3 --comm-timeout-ms 3000 --epochs 1
    TIMEOUT 30)
  # A device that fails at step 5: its rank's error (naming the device and the fault) ends the run.
  ditto_expect_exit(DittoTrainCli.DdpFailedDeviceEndsTheRunNamingIt RC 1
    REGEX "ditto-train: error: .*sim:2: device failed \\(injected fault fail:device=2,step=5, at step 5\\)"
    COMMAND $<TARGET_FILE:ditto-train> --trainer ddp --fault fail:device=2,step=5 TIMEOUT 30)
  # Issue 29 (tester 2, item 2): --trace wrote nothing when the run failed. It writes what ran up
  # to the failure, says so before the error, and the exit status stays the failure's.
  ditto_expect_exit(DittoTrainCli.FailedRunWritesItsTrace RC 1
    REGEX "ditto-train: note: --trace: wrote [^\n]*failed_run_trace.json for the failed run: what ran up to the failure \\(Chrome trace JSON; open in https://ui.perfetto.dev\\)\nditto-train: error: .*sim:1: device failed \\(injected fault fail:device=1,step=3, at step 3\\)"
    COMMAND $<TARGET_FILE:ditto-train> --trainer ddp --fault fail:device=1,step=3 --epochs 1
            --trace ${CMAKE_CURRENT_BINARY_DIR}/failed_run_trace.json TIMEOUT 30)
endif()
# Issue 29 (2): torchrun's environment was ignored, each process running a whole job of its own
# (N jobs under torchrun --no-python): refused before any training, naming the variables and
# mpirun.
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.TorchrunEnvironmentIsRefusedNamingMpirun RC 1
    REGEX "ditto-train: error: environment: torchrun's variables are set \\(RANK=1 WORLD_SIZE=2 LOCAL_RANK=1\\) but ditto does not read them: each process would run a whole job of its own. ditto starts its ranks with mpirun \\(docs/mpi.md"
    COMMAND env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 $<TARGET_FILE:ditto-train> --epochs 1 TIMEOUT 30)
  # Tester C, C9: WORLD_SIZE=0 ran as usual while WORLD_SIZE=abc was refused: any value but one
  # process's (WORLD_SIZE 1, RANK 0) is refused alike.
  foreach(case "WORLD_SIZE|0|WorldSizeZero" "LOCAL_WORLD_SIZE|0|LocalWorldSizeZero"
               "RANK|00|RankLeadingZero")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 var)
    list(GET parts 1 value)
    list(GET parts 2 label)
    ditto_expect_exit(DittoTrainCli.TorchrunEnvironment${label}IsRefused RC 1
      REGEX "ditto-train: error: environment: torchrun's variables are set \\(${var}=${value}\\) but ditto does not read them"
      COMMAND env ${var}=${value} $<TARGET_FILE:ditto-train> --epochs 1 TIMEOUT 30)
  endforeach()
endif()
# tester4: Open MPI's or a PMI launcher's size set without mpirun (left from another launch, or
# by hand) made MPI_Init a one-process job that trained as "ranks=1": refused as torchrun's
# variables are. (Without MPI support dist::init refuses it already.)
# tester5: a size that is no number of processes (OMPI_COMM_WORLD_SIZE=abc) was ignored by that
# check: refused as a usage error (exit 2) naming the variable and the value, before MPI_Init
# (so with or without MPI support); negative, zero and past an int too.
if(TARGET ditto-train)
  foreach(case "OMPI_COMM_WORLD_SIZE|abc|Abc" "OMPI_COMM_WORLD_SIZE|-2|Negative"
          "OMPI_COMM_WORLD_SIZE|0|Zero" "OMPI_COMM_WORLD_SIZE|99999999999999999999|Overflow"
          "PMI_SIZE|abc|Abc" "PMI_SIZE|2x|Trailing")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 var)
    list(GET parts 1 value)
    list(GET parts 2 label)
    ditto_expect_exit(DittoTrainCli.${var}${label}IsAUsageError RC 2
      REGEX "^ditto-train: error: environment: ${var}: expected a number of processes \\(a decimal integer in 1\\.\\.2147483647, as mpirun sets it\\), got '${value}': mpirun did not set it; unset ${var}"
      COMMAND env ${var}=${value} $<TARGET_FILE:ditto-train> --epochs 1 TIMEOUT 30)
  endforeach()
endif()
# Tester C, C5: a stale PMIX_RANK (PMIx's, or PMI's PMI_RANK) alone silently made a plain run a
# one-process MPI job (devices=1, another checksum; --devices 4 then refused speaking of "the 1
# processes"); the variable was never named. Checked as the sizes are: a value that is no rank is
# a usage error, and a rank other than the one MPI gives is refused naming the variable.
if(TARGET ditto-train)
  foreach(case "PMIX_RANK|abc|Abc" "PMIX_RANK|-1|Negative" "PMI_RANK|01|LeadingZero")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 var)
    list(GET parts 1 value)
    list(GET parts 2 label)
    ditto_expect_exit(DittoTrainCli.${var}${label}IsAUsageError RC 2
      REGEX "^ditto-train: error: environment: ${var}: expected this process's rank \\(a decimal integer in 0\\.\\.2147483646, as mpirun sets it\\), got '${value}': mpirun did not set it; unset ${var}"
      COMMAND env ${var}=${value} $<TARGET_FILE:ditto-train> --epochs 1 TIMEOUT 30)
  endforeach()
endif()
if(TARGET ditto-train AND DITTO_MPI_ENABLED)
  foreach(var OMPI_COMM_WORLD_SIZE PMI_SIZE)
    ditto_expect_exit(DittoTrainCli.${var}WithoutMpirunIsRefused RC 1
      REGEX "ditto-train: error: environment: ${var}=2 is set but the MPI job has 1 process \\(no mpirun started this one: the variable is left from another launch or set by hand\\): each process so started would run a whole job of its own. ditto starts its ranks with mpirun \\(docs/mpi.md"
      COMMAND env ${var}=2 $<TARGET_FILE:ditto-train> --epochs 1 TIMEOUT 30)
  endforeach()
  foreach(case "PMIX_RANK|3" "PMI_RANK|1")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 var)
    list(GET parts 1 value)
    ditto_expect_exit(DittoTrainCli.${var}WithoutMpirunIsRefused RC 1
      REGEX "ditto-train: error: environment: ${var}=${value} is set but this process is rank 0 of an MPI job of 1 process \\(no mpirun started this one: the variable is left from another launch or set by hand\\): each process so started would run a whole job of its own"
      COMMAND env ${var}=${value} $<TARGET_FILE:ditto-train> --epochs 1 --devices 4 TIMEOUT 30)
  endforeach()
endif()
