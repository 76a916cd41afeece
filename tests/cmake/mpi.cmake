# Ranks as processes: ditto_mpi_tests and ditto-train under mpirun.
# include()d by tests/CMakeLists.txt: its directory, ditto_expect_exit, CMAKE_CURRENT_SOURCE_DIR.

# Ranks as processes (core/distributed.h): one more test binary, run under mpirun with 1, 2, 4 and
# 8 processes (--oversubscribe: CI has 2 cores; --allow-run-as-root: CI runs as root). Absent when
# MPI support is not built (DITTO_WITH_MPI).
if(DITTO_MPI_ENABLED)
  add_executable(ditto_mpi_tests mpi/test_mpi_communicator.cpp mpi/test_mpi_dtypes.cpp)
  target_link_libraries(ditto_mpi_tests PRIVATE ditto GTest::gtest)
  # At -O0 with the libraries linked first in the check build (Note [Leaf targets at -O0]): its
  # two sources took 33 s of CPU at -O1 under ASan + UBSan; what its ranks run is the libraries'.
  ditto_leaf_o0(ditto_mpi_tests)
  # Tester C, C4: dist::finalize() waits for a collective still queued on a stream
  # (Note [MPI work at finalize]); before, Open MPI aborted the job. A program of its own: what it
  # checks happens in finalize, which ditto_mpi_tests calls once, last.
  add_executable(ditto_mpi_finalize_queued mpi/mpi_finalize_queued.cpp)
  target_link_libraries(ditto_mpi_finalize_queued PRIVATE ditto)
  ditto_leaf_o0(ditto_mpi_finalize_queued)
  set(DITTO_MPIRUN ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe)
  ditto_expect_exit(Mpi.FinalizeWaitsForAQueuedCollective_np2 RC 0 TIMEOUT 60 PROCESSORS 2
    COMMAND ${DITTO_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:ditto_mpi_finalize_queued>
    REGEX "rank [01]: finalized; all_reduce gave 3\n.*rank [01]: finalized; all_reduce gave 3\n")
  # ditto_mpi_train_test(NAME SCRIPT <file> [PROCESSORS <n>] DEFS <-Dvar=value>...): the test
  # script tests/<file> (cmake -P) given ditto-train (TRAIN), mpirun (MPIRUN) and DEFS; 120 s on
  # n processors (default 2).
  # Note [Processors of the MPI tests]: PROCESSORS is the cores a test keeps busy, which ctest
  # -j2 holds for it. A job that trains holds one per rank. A job whose ranks refuse at start
  # (mpirun -np 2 ditto-train with settings, arguments or flags a rank refuses) takes 1: in
  # the check build it spent 2.2 to 3.5 s of wall (CI's ctest) on about 0.85 s of CPU
  # (user + sys of mpirun and both ranks): the rest is Open MPI's start and, once a rank has
  # exited with an error, a 1 s sleep of mpirun's (strace) before it exits too. So it runs
  # beside another test instead of leaving a core idle with both held (CI has 2).
  function(ditto_mpi_train_test name)
    cmake_parse_arguments(PARSE_ARGV 1 arg "" "SCRIPT;PROCESSORS" "DEFS")
    if(NOT arg_PROCESSORS)
      set(arg_PROCESSORS 2)
    endif()
    add_test(NAME ${name}
             COMMAND ${CMAKE_COMMAND} -DTRAIN=$<TARGET_FILE:ditto-train> "-DMPIRUN=${DITTO_MPIRUN}"
                     ${arg_DEFS} -P ${CMAKE_CURRENT_SOURCE_DIR}/${arg_SCRIPT})
    set_tests_properties(${name} PROPERTIES TIMEOUT 120 PROCESSORS ${arg_PROCESSORS})
  endfunction()
  foreach(np 1 2 4 8)
    add_test(NAME Mpi.Communicator_np${np}
             COMMAND ${DITTO_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:ditto_mpi_tests>)
    set_tests_properties(Mpi.Communicator_np${np} PROPERTIES TIMEOUT 120 PROCESSORS ${np})
    # mpirun -np N ditto-train --trainer ddp prints DataParallel's checksum (bitwise mode).
    if(TARGET ditto-train)
      ditto_mpi_train_test(Mpi.DittoTrainDdpEqualsDp_np${np} SCRIPT compare_mpi_trainer.cmake
        PROCESSORS ${np} DEFS -DNP=${np} "-DARGS=--epochs;2;--bucket-cap-mb;0.001")
    endif()
  endforeach()
  # mpirun -np 2 ditto-train --model gpt: the tiny GPT of ditto_train_gpt.sh, dp's checksum.
  if(TARGET ditto-train)
    ditto_mpi_train_test(Mpi.DittoTrainGptDdpEqualsDp_np2 SCRIPT compare_mpi_trainer.cmake
      DEFS -DNP=2 "-DARGS=--model;gpt;--n-layer;2;--n-head;2;--n-embd;16;--block-size;16;--batch-size;8;--max-iters;10;--eval-interval;5;--eval-iters;2;--warmup-iters;2;--lr-decay-iters;10;--sample;16")
  endif()
  # Issue 16: ranks given different settings (torchrun's rendezvous check, train::check_ranks_agree)
  # fail together at start, naming the option and both values, instead of a SIGSEGV inside Open
  # MPI (--determinism) or a run that exits 0 with a wrong checksum (the others).
  if(TARGET ditto-train)
    file(STRINGS ${PROJECT_SOURCE_DIR}/examples/data/digits.csv head LIMIT_COUNT 200)
    list(JOIN head "\n" head)
    set(head_csv ${CMAKE_CURRENT_BINARY_DIR}/digits_head.csv)  # another data set
    file(WRITE ${head_csv} "${head}\n")
    foreach(case "micro-shards;8;4" "determinism;bitwise;fast" "determinism;fast;bitwise"
                 "loss;cross-entropy;mse" "seed;0;1" "bucket-cap-mb;25;1" "batch-size;64;32"
                 "optimizer;sgd;adam" "lr;0.05;0.1" "dtype;f32;bf16" "grad-accum-steps;1;2"
                 "zero-stage;0;1" "hidden;128;64"
                 "data;${PROJECT_SOURCE_DIR}/examples/data/digits.csv;${head_csv}")
      list(GET case 0 flag)
      list(GET case 1 v0)
      list(GET case 2 v1)
      set(name ${flag})
      if(flag STREQUAL "determinism")
        set(name ${flag}_${v0})
      endif()
      ditto_mpi_train_test(Mpi.DittoTrainRanksDisagree_${name} SCRIPT mpi_ranks_disagree.cmake
        PROCESSORS 1 DEFS -DFLAG=${flag} "-DV0=${v0}" "-DV1=${v1}" "-DARGS=--epochs;2" -DMAX_S=20)
    endforeach()
  endif()
  # Issue 31: node-local checkpoints at different steps: refused naming both steps.
  if(TARGET ditto-train)
    ditto_mpi_train_test(Mpi.DittoTrainResumeStepsDiffer_np2 SCRIPT mpi_resume_steps_differ.cmake
      DEFS -DWORK=${CMAKE_CURRENT_BINARY_DIR}/mpi_resume_steps_differ)
  endif()
  # Issue 16: options are compared by their effective values (after defaults and one spelling of
  # numbers), so a rank that leaves them at their defaults and one that gives the same values
  # explicitly agree, either way round (before, each of these was refused as a mismatch), and
  # train to --devices 2's checksum.
  if(TARGET ditto-train)
    set(explicit --epochs 1 --trainer ddp --lr 0.050 --bucket-cap-mb 25.0 --classes 10
        --momentum 0.90 --devices 2 --val-fraction .2 --seed 0 --micro-shards 64 --hidden 128)
    ditto_mpi_train_test(Mpi.DittoTrainRanksAgree_DefaultsAndExplicitValues
      SCRIPT mpi_ranks_agree.cmake
      DEFS "-DARGS0=--epochs;1" "-DARGS1=${explicit}" -DCHECKSUM=00558d72e5225d65)
    ditto_mpi_train_test(Mpi.DittoTrainRanksAgree_ExplicitValuesAndDefaults
      SCRIPT mpi_ranks_agree.cmake
      DEFS "-DARGS0=${explicit}" "-DARGS1=--epochs;1" -DCHECKSUM=00558d72e5225d65)
  endif()
  # Issue 16: one rank refuses its own arguments or inputs (here: in its own working directory)
  # while the others accept theirs: every rank fails at once, naming it, not after the 300 s
  # timeout. Its --data file missing (run's checks); its --checkpoint not creatable (rank 0
  # alone checks the output paths, in Trainer::fit); its --metrics-jsonl not openable (rank 0
  # alone opens it, at the run's start).
  if(TARGET ditto-train)
    set(refuse_dir ${CMAKE_CURRENT_BINARY_DIR}/mpi_rank_refuses)
    file(MAKE_DIRECTORY ${refuse_dir}/with ${refuse_dir}/without)
    configure_file(${PROJECT_SOURCE_DIR}/examples/data/digits.csv ${refuse_dir}/with/d.csv
                   COPYONLY)
    file(WRITE ${refuse_dir}/with/ck "a file, not a directory\n")
    foreach(case "data|with|without|1|--data;d.csv|read_csv: cannot open 'd.csv'"
                 "checkpoint|with|without|0|--checkpoint;ck/run|--checkpoint: expected a directory it may create or write, got 'ck/run'"
                 "metrics_jsonl|without|with|0|--metrics-jsonl;nodir/m.jsonl|--metrics-jsonl: ")
      string(REPLACE "|" ";" parts "${case}")
      list(GET parts 0 name)
      list(GET parts 1 wdir0)
      list(GET parts 2 wdir1)
      list(GET parts 3 refuser)
      list(GET parts -1 why)
      list(SUBLIST parts 4 -1 args)
      list(REMOVE_AT args -1)
      ditto_mpi_train_test(Mpi.DittoTrainRankRefusesItsArguments_${name}
        SCRIPT mpi_rank_refuses.cmake PROCESSORS 1
        DEFS -DWDIR0=${refuse_dir}/${wdir0} -DWDIR1=${refuse_dir}/${wdir1}
             "-DARGS=--epochs;1;${args}" -DREFUSER=${refuser} "-DWHY=${why}" -DMAX_S=20)
    endforeach()
  endif()
  # Tester C, C2: ranks whose --data files (the same name in two working directories) differ in
  # content were told "ranks disagree on --lr: rank 0 has 0.05, rank 1 has 0.05" (a name given
  # twice hid the settings after it). They name the data's hash now. One processor: refused at
  # start.
  if(TARGET ditto-train)
    file(STRINGS ${PROJECT_SOURCE_DIR}/examples/data/digits.csv rows LIMIT_COUNT 1000)
    list(JOIN rows "\n" rows)
    file(WRITE ${refuse_dir}/shorter/d.csv "${rows}\n")
    ditto_expect_exit(Mpi.DittoTrainRanksDisagree_dataContent RC 1 TIMEOUT 60 PROCESSORS 1
      COMMAND ${DITTO_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 1 -wdir ${refuse_dir}/with
              $<TARGET_FILE:ditto-train> --data d.csv --epochs 1
              : ${MPIEXEC_NUMPROC_FLAG} 1 -wdir ${refuse_dir}/shorter
              $<TARGET_FILE:ditto-train> --data d.csv --epochs 1
      REGEX "ditto-train: error: rank [01]: ranks disagree on data data_fnv1a: rank 0 has [0-9a-f]+, rank 1 has [0-9a-f]+\n")
  endif()
  # Issue 31, item 5: a process of the job that leaves with status 0 before training (--version,
  # --help) left the training ranks waiting in MPI_Init forever (killed at 75 s). It joins the
  # job and refuses in the settings agreement now: the training rank fails at once, naming it.
  # One processor (Note [Processors of the MPI tests]): refused at start.
  if(TARGET ditto-train)
    foreach(flag version help)
      ditto_expect_exit(Mpi.DittoTrainOtherProcessLeavesWith_${flag} RC 1 TIMEOUT 60
        COMMAND ${DITTO_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 1 $<TARGET_FILE:ditto-train> --epochs 1
                : ${MPIEXEC_NUMPROC_FLAG} 1 $<TARGET_FILE:ditto-train> --${flag}
        REGEX "ditto-train: error: rank 0: rank 1 refused its arguments: ditto-train --${flag} does not train, and under mpirun every process must run the same training command")
    endforeach()
  endif()
  # --fault and --straggler name devices of the whole job, but each process holds one device.
  # One processor (Note [Processors of the MPI tests]): refused at start.
  if(TARGET ditto-train)
    foreach(case "fault;fail:device=0,step=1" "straggler;1:2")
      list(GET case 0 flag)
      list(GET case 1 value)
      ditto_expect_exit(Mpi.DittoTrainRefuses_${flag} RC 1
        COMMAND ${DITTO_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:ditto-train>
                --${flag} ${value} --epochs 1
        REGEX "ditto-train: error: rank [01]: [-a-z, ]*--${flag}[-a-z, ]*: expected a single-process run, got mpirun with 2 processes")
    endforeach()
  endif()
  # Tester C, C1: rank 1 stops answering (SIGSTOP) while training; rank 0's collective times out
  # and the job ends with that error (MPI_Abort) instead of rank 0 waiting for rank 1 in
  # MPI_Finalize for ever (Note [Ending a job after a communicator error]).
  if(TARGET ditto-train)
    ditto_expect_exit(Mpi.DittoTrainRankThatStopsEndsTheJobAfterTheTimeout RC 0 REGEX "PASS"
      TIMEOUT 120 PROCESSORS 2
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_rank_stops.sh $<TARGET_FILE:ditto-train>
              ${CMAKE_CURRENT_BINARY_DIR}/mpi_rank_stops ${DITTO_MPIRUN})
  endif()
  # Session 56 (A2): under mpirun the device count is the job's processes, not --devices (which
  # it ignores): the non-power-of-two warning and bitwise gradient accumulation's refusal named
  # --devices to a user who gave -np 3. One processor (Note [Processors of the MPI tests]).
  if(TARGET ditto-train)
    ditto_expect_exit(Mpi.DittoTrainNamesMpirunNp_np3 RC 1 TIMEOUT 60 PROCESSORS 1
      COMMAND ${DITTO_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 3 $<TARGET_FILE:ditto-train> --epochs 1
              --grad-accum-steps 2
      REGEX "ditto-train: warning: mpirun -np: 3 processes, not a power of two: the params_checksum .*ditto-train: error: rank [0-2]: --grad-accum-steps x mpirun -np: bitwise mode gives every micro-step of every device whole micro-shards, and --micro-shards is a power of two: expected a power-of-two device count \\(1, 2, 4, \\.\\.\\.\\) with --grad-accum-steps 2, got mpirun -np 3 \\(use --determinism fast, a power-of-two mpirun -np, or --grad-accum-steps 1\\)")
  endif()
  # ASan: Open MPI's leaks are allocated under frames of components it has unloaded by exit
  # ("<unknown module>"); LSan's slow unwinder carries their stacks on to libmpi.so, which
  # tools/sanitizers/lsan.supp names (the fast one stops at the first frame without a frame pointer).
  # The slow one on every malloc costs the other runs 2 to 3 times their CPU: the Docs.* pages
  # (tools/check_docs.py) and DittoTrainGpt.TokenShardsOneChecksumForAnyDeviceCount
  # (tests/ditto_train_gpt_tokens.sh) set it for their mpirun commands alone.
  if(DITTO_SANITIZE MATCHES "address")
    get_property(ditto_mpi_tests_all DIRECTORY PROPERTY TESTS)
    list(FILTER ditto_mpi_tests_all INCLUDE REGEX "^Mpi\\.")
    set_property(TEST ${ditto_mpi_tests_all} APPEND PROPERTY ENVIRONMENT_MODIFICATION
                 "LSAN_OPTIONS=string_prepend:fast_unwind_on_malloc=0:")
  endif()
endif()
