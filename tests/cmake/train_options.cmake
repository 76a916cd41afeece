# ditto-train's options: argument checks, the address-space limits, non-finite
# losses, the cost model's options, --grad-accum-steps and --dry-run.
# include()d by tests/CMakeLists.txt: its directory, ditto_expect_exit, CMAKE_CURRENT_SOURCE_DIR.

# ditto-train's own argument checks (in the program, not the library): each bad value must end in
# "ditto-train: error: <option>: expected ..." and not be taken (or be undefined behaviour).
if(TARGET ditto-train)
  foreach(value inf 1e30 17179869184)
    ditto_expect_exit(DittoTrainCli.SimMemoryGibOutOfRange_${value} RC 2
      REGEX "ditto-train: error: --sim-memory-gib: expected a size in GiB > 0 and < 17179869184 \\(16 EiB\\), got "
      COMMAND $<TARGET_FILE:ditto-train> --sim-memory-gib ${value} --epochs 0)
  endforeach()
endif()

# Issue 31, item 2: threads the system cannot create. 128 ddp ranks under `ulimit -v 2000000`
# died by std::terminate ("terminate called without an active exception"): now a ditto::Error
# naming the rank. The simulator's pool (here 64 threads asked) runs on the threads it got, with
# a warning, and the run's checksum is the usual one (it was "error: Resource temporarily
# unavailable" with 8 ranks under `ulimit -v 1000000`). 64 MiB stacks make both limits certain to
# bite on any machine. Not under sanitizers (they reserve terabytes of address space).
if(TARGET ditto-train AND NOT DITTO_SANITIZE)
  ditto_expect_exit(DittoTrainCli.DdpRankThreadsPastTheAddressSpaceLimit RC 1
    COMMAND sh -c "ulimit -s 65536 && ulimit -v 2000000 && exec $<TARGET_FILE:ditto-train> --trainer ddp --devices 128 --micro-shards 1024 --batch-size 1024 --epochs 1"
    REGEX "ditto-train: error: launch_ranks: cannot create the thread of rank [0-9]+ of 128: Resource temporarily unavailable \\(each rank is a thread")
  ditto_expect_exit(DittoTrainCli.SimPoolPastTheAddressSpaceLimitRunsOnFewerThreads RC 0
    COMMAND sh -c "ulimit -s 65536 && ulimit -v 1000000 && DITTO_SIM_THREADS=64 exec $<TARGET_FILE:ditto-train> --trainer ddp --devices 2 --epochs 1"
    REGEX "params_checksum=00558d72e5225d65.*ditto: warning: sim: the simulator's thread pool runs on [0-9]+ of its 64 threads: thread [0-9]+ could not be created: Resource temporarily unavailable")
  # Tester 6, F11: a real run of a model larger than the machine (here 10 GB of weights under a
  # 3 GB ulimit) failed with "cpu: out of memory allocating N bytes", naming neither why (the
  # simulated devices' tensors are host memory) nor the way out (--dry-run holds none).
  ditto_expect_exit(DittoTrainCli.ModelLargerThanTheHostNamesRamAndDryRun RC 1
    COMMAND sh -c "ulimit -v 3000000 && exec $<TARGET_FILE:ditto-train> --devices 1 --hidden 50000,50000 --epochs 1"
    REGEX "ditto-train: error: [^\n]*out of memory allocating 10000000000 bytes \\(9536.74 MiB\\)[^\n]*in this machine's RAM \\([^\n]*, less under a ulimit\\)[^\n]*: --dry-run predicts a model larger than the machine without holding its tensors\n$")
endif()

# A NaN or inf loss (here: --lr 1e30 diverges) stops the run with the step and the loss, exit 1;
# --allow-nonfinite-loss keeps going to the end (issue 16).
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.NonFiniteLossStopsNamingTheStep RC 1
    COMMAND $<TARGET_FILE:ditto-train> --lr 1e30 --epochs 1
    REGEX "ditto-train: error: Trainer: step [1-9][0-9]* \\(epoch 1, batch [0-9]+ of 23\\): the training loss is -?(nan|inf), expected a finite loss \\(.*set --allow-nonfinite-loss to keep going\\)")
  ditto_expect_exit(DittoTrainCli.AllowNonFiniteLossKeepsGoing RC 0
    COMMAND $<TARGET_FILE:ditto-train> --lr 1e30 --epochs 1 --allow-nonfinite-loss
    REGEX "final: backend=sim devices=4 determinism=bitwise epochs=1 train_loss=-?(nan|inf)")
endif()

# ditto-train's cost-model options (backend_sim/cost_model.h): the table, a prediction, and the
# errors of --profile / --straggler / a model larger than the profile's memory.
if(TARGET ditto-train)
  # Both tables (backend_sim/published.h, Note [Published figures]): exit status 0 means every
  # row is within its tolerance or a known gap; the dry runs of the training rows need the
  # GPT-2 presets, --dry-run, --dtype, --zero-stage and --grad-accum-steps (issue 14).
  # The table's own program, ditto-predict-table (its dry runs take seconds).
  ditto_expect_exit(DittoTrainCli.PredictTable RC 0 COMMAND $<TARGET_FILE:ditto-predict-table>
    TIMEOUT 600
    REGEX "8x H100 SXM, NVLink, ring \\(NCCL_ALGO=Ring\\) \\[1\\] +370\\.7 GB/s +ring +~370 +1\\.002.*all_reduce of 1 KiB, 8x H100 SXM, NVLink: time of one call \\[8\\] +7\\.8 us +nvls +25\\.6 \\(0\\.07 GB/s\\) +0\\.305 GAP.*GPT-2 124M, 8x A100 80GB SXM[^\n]*\\[1\\] +[0-9]+ tok/s +1747627 tok/s +[0-9.]+ (ok|GAP) .*GPT-2 124M, 8x H100[^\n]*\\[2\\] +[0-9]+ tok/s +3744914 tok/s .*GPT-2 1558M, 8x H100[^\n]*\\[3\\] .*374491 tok/s")
  # ditto-train --predict-table, its alias, is the same function (examples/predict_table.h):
  # checked to reach it, cheaply, by its first act, trying stdout before the dry runs (with
  # /dev/full it fails at once, naming the alias).
  ditto_expect_exit(DittoTrainCli.PredictTableAlias RC 1
    COMMAND sh -c "exec \"$0\" --predict-table > /dev/full" $<TARGET_FILE:ditto-train>
    REGEX "^ditto-train: --predict-table: error: cannot write the table to stdout: No space left on device\n$")
  # Its tables are fixed: other options were ignored (--trace x.json wrote nothing, exit 0).
  ditto_expect_exit(DittoTrainCli.PredictTableAloneOrRefused RC 2
    COMMAND $<TARGET_FILE:ditto-train> --predict-table --trace ${CMAKE_CURRENT_BINARY_DIR}/predict_table_x.json --devices 3 --profile h200
    REGEX "^ditto-train: error: --predict-table: prints fixed tables and uses no other option: expected it alone, got --devices, --profile, --trace\n$")
  ditto_expect_exit(DittoTrainCli.ProfilePrintsPredictionAndMemory RC 0
    COMMAND $<TARGET_FILE:ditto-train> --trainer ddp --profile h100-sxm --devices 2 --nodes 2 --epochs 1
    REGEX "predicted: 4 x NVIDIA H100 SXM5 80GB \\(2 nodes, nvlink\\) step_time=[0-9.]+ ms samples/s=[0-9]+ comm_share=[0-9.]+% mfu=.*memory: sim:3 live=[0-9.]+ MiB peak=[0-9.]+ MiB capacity=81559.00 MiB")
  # Usage errors naming the option, exit status 2 (issue 31; the library's own names stay for
  # library users: device_profile:, set_slowdown:, SimBackend::set_faults:, optim::SGD:).
  ditto_expect_exit(DittoTrainCli.UnknownProfile RC 2
    COMMAND $<TARGET_FILE:ditto-train> --profile h300 --epochs 0
    REGEX "^ditto-train: error: --profile: expected one of h100-sxm, h200, a100-sxm-80gb, a100-sxm-40gb, rtx4070-laptop or a .json file, got 'h300'")
  # An interconnect the cost model does not have was priced "as asked" with a warning, then failed
  # with exit status 1 ("interconnect_profile: unknown interconnect 'nvlink5'"); the list is the
  # cost model's table (builtin_interconnects).
  ditto_expect_exit(DittoTrainCli.UnknownInterconnect RC 2
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2 --dry-run --profile h100-sxm --trainer ddp
            --dtype bf16 --devices 2 --batch-size 2 --interconnect nvlink5
    REGEX "^ditto-train: error: --interconnect: expected auto, nvlink, nvlink3, pcie5 or pcie4, got 'nvlink5'\n$")
  ditto_expect_exit(DittoTrainCli.MalformedStraggler RC 2
    COMMAND $<TARGET_FILE:ditto-train> --straggler 3x2 --epochs 0
    REGEX "ditto-train: error: --straggler: expected DEVICE:FACTOR such as 3:2.5, got '3x2'")
  ditto_expect_exit(DittoTrainCli.StragglerOutOfRange RC 2
    COMMAND $<TARGET_FILE:ditto-train> --profile h100-sxm --straggler 9:2 --devices 4 --epochs 0
    REGEX "^ditto-train: error: --straggler 9:2: expected a device in 0..3, got 9")
  ditto_expect_exit(DittoTrainCli.StragglerFactorOutOfRange RC 2
    COMMAND $<TARGET_FILE:ditto-train> --profile h100-sxm --straggler 0:-2 --epochs 0
    REGEX "^ditto-train: error: --straggler 0:-2: expected a factor in 0.001..1000, got -2")
  # Tester 6, F9: below 1 GiB the GPT's peak line printed "0.07 GiB of 0.07 GiB" (hiding a 0.33
  # MiB margin), and the predicted: line named the profile's "80GB" for a capacity of 67 MiB.
  ditto_expect_exit(DittoTrainCli.SmallCapacityInMiBAndNamedOverridden RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --n-layer 2 --n-head 4 --n-embd 256 --block-size 128 --batch-size 16 --devices 2 --trainer ddp --profile h100-sxm --sim-memory-gib 0.5 --dry-run
    REGEX "predicted: 2 x NVIDIA H100 SXM5 80GB with 512.00 MiB \\(--sim-memory-gib\\) \\(1 node, nvlink\\) step_time=.*predicted GPT: peak memory [0-9]+[.][0-9][0-9] MiB of 512.00 MiB on the fullest device")
  # Tester 6, F15: DataParallel (one process) across nodes was priced without a word.
  ditto_expect_exit(DittoTrainCli.DataParallelAcrossNodesRefused RC 2
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2 --dry-run --profile h100-sxm --devices 8 --nodes 2 --trainer dp --batch-size 16 --dtype bf16
    REGEX "^ditto-train: error: --nodes 2: DataParallel is one process on one node: expected --trainer ddp \\(DistributedDataParallel, a rank a GPU, spans nodes\\), got --trainer dp\n$")
  # A simulated cluster's devices are nodes x devices: too few micro-shards for them is a usage
  # error like the others (it was refused in fit() with exit status 1).
  ditto_expect_exit(DittoTrainCli.NodesNeedMicroShardsForEveryDevice RC 2
    COMMAND $<TARGET_FILE:ditto-train> --trainer ddp --nodes 2 --devices 8 --profile h200 --dry-run --determinism bitwise --micro-shards 8 --epochs 1
    REGEX "^ditto-train: error: --micro-shards: bitwise mode gives every device at least one micro-shard: expected a power of two >= 16 \\(the devices\\), got 8\n")
  # The simulator's options with another backend named are a usage error before any backend
  # starts (exit status 1 before: without a GPU the CUDA backend's "no CUDA device" came first;
  # with one, fit() refused them once the backend existed).
  foreach(case "profile|--profile;h100-sxm" "trace|--trace;sim-only.json"
               "fault|--fault;fail:device=0,step=0")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 key)
    list(GET parts 1 flag)
    list(GET parts 2 value)
    ditto_expect_exit(DittoTrainCli.SimOptionWithTheCudaBackendIsAUsageError_${key} RC 2
      COMMAND $<TARGET_FILE:ditto-train> --backend cuda ${flag} ${value} --epochs 0
      REGEX "^ditto-train: error: ${flag}: the simulator's \\(its cost model and faults\\): expected --backend sim \\(or auto\\), got --backend cuda\n")
  endforeach()
  # A backend nothing is registered under, likewise (exit status 1 before: fit()'s init_backend).
  ditto_expect_exit(DittoTrainCli.UnknownBackendIsAUsageError RC 2
    COMMAND $<TARGET_FILE:ditto-train> --backend foo --epochs 0
    REGEX "^ditto-train: error: --backend: expected one of cpu, sim, (cuda, )?auto, got 'foo'\n")
  foreach(case "momentum|--momentum;-0.5|--momentum: expected a number >= 0, got -0.5"
               "weight_decay|--weight-decay;-1|--weight-decay: expected a number >= 0, got -1"
               "batch_size|--batch-size;0|--batch-size: expected an integer >= 1, got 0"
               "micro_shards|--micro-shards;3|--micro-shards: expected a power of two in 1..65536, got 3"
               "micro_shards_devices|--micro-shards;2|--micro-shards: bitwise mode gives every device at least one micro-shard: expected a power of two >= 4 \\(the devices\\), got 2"
               "fault_kind|--fault;explode|--fault 'explode': expected a fault kind fail, alloc or skip-collective before ':', got 'explode'"
               "fault_device|--fault;fail:device=9,step=0|--fault 'fail:device=9,step=0': expected a device in 0..3, got 9"
               "classes_65537|--classes;65537|--classes: expected an integer in 1..65536, got 65537"
               "classes_1000000|--classes;1000000|--classes: expected an integer in 1..65536, got 1000000")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 key)
    list(GET parts 1 flag)
    list(GET parts 2 value)
    list(GET parts 3 message)
    ditto_expect_exit(DittoTrainCli.UsageErrorNamesTheFlag_${key} RC 2
      COMMAND $<TARGET_FILE:ditto-train> ${flag} ${value} --epochs 1
      REGEX "^ditto-train: error: ${message}\n")
  endforeach()
  # Tester 6, F7: the refusal named only the bytes, nothing of what to change. (The laptop's
  # capacity is nvidia-smi's 8188 MiB, F3.) Note [Out-of-memory hints] (examples/ditto_train.cpp):
  # the run's peak predicted by a dry run with the capacity lifted, and only the changes whose
  # own dry runs lower it. 2.5e9 parameters of SGD with momentum on one device: 12 bytes each in
  # f32 and in bf16 (2 + 2 + a 4-byte f32 master + 4), so neither --dtype bf16 nor a smaller
  # micro-batch helps, and ZeRO-1 needs more than one device: it suggested all three.
  ditto_expect_exit(DittoTrainCli.ModelLargerThanLaptopProfile RC 1
    COMMAND $<TARGET_FILE:ditto-train> --profile rtx4070-laptop --devices 1 --hidden 50000,50000 --epochs 1
    REGEX "ditto-train: error: sim:0: out of memory: tried to allocate 10000000000 bytes \\(9536.74 MiB\\); [0-9]+ bytes \\([0-9.]+ MiB\\) in use of capacity 8585740288 bytes \\(8188.00 MiB\\) \\(peak [^)]*\\)\\); predicted by a dry run with the capacity lifted, the run needs 28.19 GiB at its peak on its fullest device \\(sim:0, NVIDIA GeForce RTX 4070 Laptop GPU 8GB\\) of 8.00 GiB, at least 28.12 GiB of it between steps \\(the weights, gradients and optimizer state\\); what stays between steps alone exceeds the capacity: a smaller model or a device with more memory\n$")
  # Only settings the same command accepts, each predicted by its own dry run: bitwise mode's 8
  # micro-shards on 8 devices leave no micro-shard for a second micro-step (it suggested
  # --grad-accum-steps 2, which this command refuses with exit 2: the _refused case); dp holds the
  # optimizer state on device 0, which ZeRO-1 shards: lower, not enough. A batch of one row has
  # no smaller batch, and --checkpoint refuses --dry-run (it suggested all three).
  ditto_expect_exit(DittoTrainCli.OutOfMemoryHintNamesOnlyAcceptedSettings_micro_shards RC 1
    COMMAND $<TARGET_FILE:ditto-train> --profile rtx4070-laptop --devices 8 --micro-shards 8 --hidden 50000,50000 --epochs 1
    REGEX "ditto-train: error: sim:[0-7]: out of memory: tried to allocate 10000000000 bytes [^\n]*; predicted by a dry run with the capacity lifted, the run needs 55.97 GiB at its peak on its fullest device \\(sim:0, [^)]*\\) of 8.00 GiB, at least 46.65 GiB of it between steps [^\n]*; lower, not enough: --trainer ddp --zero-stage 1 \\(peak 21.02 GiB\\); what stays between steps alone exceeds the capacity: a smaller model or a device with more memory\n$")
  ditto_expect_exit(DittoTrainCli.OutOfMemoryHintNamesOnlyAcceptedSettings_refused RC 2
    COMMAND $<TARGET_FILE:ditto-train> --profile rtx4070-laptop --devices 8 --micro-shards 8 --hidden 50000,50000 --epochs 1 --grad-accum-steps 2
    REGEX "^ditto-train: error: --grad-accum-steps x --devices: bitwise mode gives every micro-step of every device whole micro-shards")
  ditto_expect_exit(DittoTrainCli.OutOfMemoryHintNamesOnlyAcceptedSettings_one_row RC 1
    COMMAND $<TARGET_FILE:ditto-train> --profile rtx4070-laptop --devices 1 --determinism fast --batch-size 1 --hidden 50000,50000 --epochs 1
            --checkpoint ${CMAKE_CURRENT_BINARY_DIR}/oom_hint_one_row
    REGEX "ditto-train: error: sim:0: out of memory: tried to allocate 10000000000 bytes [^\n]*; predicted by a dry run with the capacity lifted, the run needs 28.18 GiB at its peak [^\n]*; what stays between steps alone exceeds the capacity: a smaller model or a device with more memory\n$")
  # Tester 7, defect 3: gpt2-large in bf16 on one 8 GB laptop GPU at a micro-batch of 1 was told
  # "to fit: --trainer ddp --zero-stage 1", which fails again (ZeRO-1 on one device adds the f32
  # gradient shard: 15.95 GiB against 14.49); 6.58e9 parameters on 8 H100s at a micro-batch of 1
  # were told to lower --batch-size, and neither said how much the run needs.
  ditto_expect_exit(DittoTrainCli.OutOfMemoryHint_gpt2_large_laptop RC 1
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2-large --dry-run --profile rtx4070-laptop --devices 1 --batch-size 1 --dtype bf16
    REGEX "ditto-train: error: sim:0: out of memory: [^\n]*; predicted by a dry run with the capacity lifted, the run needs 14.49 GiB at its peak on its fullest device \\(sim:0, NVIDIA GeForce RTX 4070 Laptop GPU 8GB\\) of 8.00 GiB, at least 13.05 GiB of it between steps \\(the weights, gradients and optimizer state\\); what stays between steps alone exceeds the capacity: a smaller model or a device with more memory\n$")
  ditto_expect_exit(DittoTrainCli.OutOfMemoryHint_gpt2_large_laptop_zero1 RC 1
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2-large --dry-run --profile rtx4070-laptop --devices 1 --batch-size 1 --dtype bf16 --trainer ddp --zero-stage 1
    REGEX "ditto-train: error: sim:0: out of memory: tried to allocate 3099295744 bytes [^\n]*; predicted by a dry run with the capacity lifted, the run needs 15.95 GiB at its peak on its fullest device [^\n]* of 8.00 GiB, at least 8.65 GiB of it between steps [^\n]*; what stays between steps alone exceeds the capacity: a smaller model or a device with more memory\n$")
  ditto_expect_exit(DittoTrainCli.OutOfMemoryHint_micro_batch_one RC 1 TIMEOUT 120
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --n-layer 32 --n-embd 4096 --n-head 32 --block-size 2048 --vocab-size 32000 --dry-run --profile h100-sxm --trainer ddp --dtype bf16 --devices 8 --batch-size 8
    REGEX "ditto-train: error: sim:[0-7]: out of memory: [^\n]*; predicted by a dry run with the capacity lifted, the run needs 106.38 GiB at its peak on its fullest device \\(sim:0, NVIDIA H100 SXM5 80GB\\) of 79.65 GiB, at least 73.56 GiB of it between steps \\(the weights, gradients and optimizer state\\); to fit: --zero-stage 1 \\(peak 44.98 GiB\\)\n$")
  # A host allocation that fails (std::aligned_alloc's null, the simulator's memory in this
  # machine's RAM or a host tensor's: 2^61 bytes for the first layer of --hidden 2^53): its
  # OutOfMemory (Kind::host) with the host's message, not the device's "to fit" hint. Under ASan
  # (the check preset) and TSan the allocator aborts on such a request unless
  # allocator_may_return_null=1, set for these two tests only (appended to the suite's options).
  ditto_expect_exit(DittoTrainCli.HostOutOfMemory_sim RC 1
    COMMAND $<TARGET_FILE:ditto-train> --devices 1 --sim-memory-gib 4294967296 --hidden 9007199254740992 --epochs 1
    REGEX "ditto-train: error: sim:0: host out of memory allocating 2305843009213693952 bytes \\(2199023255552.00 MiB\\): the simulated devices' memory lives in this machine's RAM \\(the simulator holds [^\n]*, less under a ulimit\\): --dry-run predicts a model larger than the machine without holding its tensors\n$")
  ditto_expect_exit(DittoTrainCli.HostOutOfMemory_cpu RC 1
    COMMAND $<TARGET_FILE:ditto-train> --backend cpu --devices 1 --hidden 9007199254740992 --epochs 1
    REGEX "ditto-train: error: cpu: out of memory allocating 2305843009213693952 bytes \\(2199023255552.00 MiB\\): host tensors live in this machine's RAM \\([^\n]*, less under a ulimit\\), as a simulator's devices' do: --dry-run predicts a model larger than the machine without holding its tensors\n$")
  set_property(TEST DittoTrainCli.HostOutOfMemory_sim DittoTrainCli.HostOutOfMemory_cpu APPEND
    PROPERTY ENVIRONMENT_MODIFICATION "ASAN_OPTIONS=string_append::allocator_may_return_null=1"
                                      "TSAN_OPTIONS=string_append::allocator_may_return_null=1")
  # Fast mode's micro-steps against the epoch's last batch too (1437 training rows: 22 batches of
  # 64, then one of 29): --grad-accum-steps 32 fits a batch of 64 but not that one, which the run
  # refuses (GradAccumStepsPastTheShortLastBatchFast); the hint offered it.
  ditto_expect_exit(DittoTrainCli.OutOfMemoryHintNamesOnlyAcceptedSettings_short_last_batch RC 1
    COMMAND $<TARGET_FILE:ditto-train> --profile rtx4070-laptop --devices 1 --determinism fast --grad-accum-steps 16 --hidden 50000,50000 --epochs 1
    REGEX "ditto-train: error: sim:0: out of memory: tried to allocate 10000000000 bytes [^\n]*; predicted by a dry run with the capacity lifted, the run needs 28.18 GiB at its peak [^\n]*; what stays between steps alone exceeds the capacity: a smaller model or a device with more memory\n$")
endif()

# --grad-accum-steps (Note [Gradient accumulation], core/train/grad_accumulation.h): in bitwise
# mode K micro-steps of the batch give the checksum of one step (the default MLP run's over 2
# epochs, 8752fbcdc769a975, pinned by the K = 1 run below; dp and ddp; and a tiny GPT's against
# its own K = 1 run in ditto_train_gpt.sh), and a K that cannot split the batch is refused with
# the numbers.
if(TARGET ditto-train)
  # 2 epochs (44 steps) and not the default 20: under CI's ASan on a 2-core machine without
  # AVX-512 (the portable GEMM) the 20-epoch runs of 4 x 4 and 8 x 8 micro-steps took 50-60 s
  # each. The 20-epoch run itself (eda947d0bde4cbf6) is Docs.README's and Docs.determinism's.
  ditto_expect_exit(DittoTrainCli.GradAccumStepsKeepTheChecksum_reference RC 0 TIMEOUT 120
    COMMAND $<TARGET_FILE:ditto-train> --epochs 2
    REGEX "final: backend=sim devices=4 determinism=bitwise .*params_checksum=8752fbcdc769a975")
  ditto_expect_exit(DittoTrainCli.GradAccumStepsKeepTheChecksum RC 0 TIMEOUT 120
    COMMAND $<TARGET_FILE:ditto-train> --grad-accum-steps 4 --epochs 2
    REGEX "grad_accum_steps=4 .*final: backend=sim devices=4 determinism=bitwise .*params_checksum=8752fbcdc769a975")
  ditto_expect_exit(DittoTrainCli.GradAccumStepsKeepTheChecksumDdp RC 0 TIMEOUT 120
    COMMAND $<TARGET_FILE:ditto-train> --grad-accum-steps 8 --trainer ddp --devices 8 --epochs 2
    REGEX "final: backend=sim devices=8 determinism=bitwise .*params_checksum=8752fbcdc769a975")
  ditto_expect_exit(DittoTrainCli.GradAccumStepsNotAPowerOfTwo RC 2
    COMMAND $<TARGET_FILE:ditto-train> --grad-accum-steps 3 --epochs 1
    REGEX "^ditto-train: error: --grad-accum-steps: bitwise mode folds the micro-steps with the canonical tree over a power of two of them \\(Note \\[Gradient accumulation\\]\\): expected a power of two, got 3")
  ditto_expect_exit(DittoTrainCli.GradAccumStepsTimesDevicesPastMicroShards RC 2
    COMMAND $<TARGET_FILE:ditto-train> --grad-accum-steps 16 --devices 8 --epochs 1
    REGEX "^ditto-train: error: --grad-accum-steps x --devices: bitwise mode gives every micro-step of every device whole micro-shards: expected --micro-shards \\(64\\) divisible by --grad-accum-steps \\(16\\) x --devices \\(8\\) = 128")
  # Session 56 (A1): on 3 devices it advised raising --micro-shards, a power of two: none is
  # divisible by 2 x 3. It says what works instead.
  ditto_expect_exit(DittoTrainCli.GradAccumStepsOnThreeDevicesSaysWhatWorks RC 2
    COMMAND $<TARGET_FILE:ditto-train> --grad-accum-steps 2 --devices 3 --epochs 1
    REGEX "^ditto-train: error: --grad-accum-steps x --devices: bitwise mode gives every micro-step of every device whole micro-shards, and --micro-shards is a power of two: expected a power-of-two device count \\(1, 2, 4, \\.\\.\\.\\) with --grad-accum-steps 2, got --devices 3 \\(use --determinism fast, a power-of-two --devices, or --grad-accum-steps 1\\)\n$")
  ditto_expect_exit(DittoTrainCli.GradAccumStepsPastTheRowsFast RC 2
    COMMAND $<TARGET_FILE:ditto-train> --grad-accum-steps 65 --determinism fast --epochs 1
    REGEX "^ditto-train: error: --grad-accum-steps: every micro-step needs at least one row: expected at most 64 \\(the rows of a batch of 64\\), got 65")
  # The epoch's last batch of 29 rows (1437 training rows: 22 batches of 64, then 29): refused
  # before training (nothing on stdout), not at the end of the first epoch as before.
  ditto_expect_exit(DittoTrainCli.GradAccumStepsPastTheShortLastBatchFast RC 1
    COMMAND $<TARGET_FILE:ditto-train> --grad-accum-steps 32 --determinism fast --epochs 1
    REGEX "^ditto-train: error: --grad-accum-steps: every micro-step needs at least one row: expected at most 29 \\(the rows of a batch of 29\\), got 32 \\(raise --batch-size or lower --grad-accum-steps\\)\n$")
endif()

# --dry-run (Note [Dry run], backend_sim/sim_backend.h): GPT-2 124M predicted for 8 A100s without
# running it; GPT-2 1.5B on 8 x 40 GB without ZeRO fails with the device's OutOfMemory (Note
# [GPT-2 memory], core/nn/gpt_config.h); the refusals.
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.DryRunGpt2PredictsStepAndMemory RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2 --dry-run --profile a100-sxm-80gb
            --devices 8 --trainer ddp --batch-size 128
    REGEX "params=124475904 \\(123.69M without wpe\\).*determinism=fast.*data=zeros.*predicted: 8 x NVIDIA A100 SXM4 80GB.*memory: sim:7 live=[0-9.]+ MiB peak=[0-9.]+ MiB capacity=81920.00 MiB.*dry run: priced, not run.*predicted GPT: [0-9]+ tokens/s \\(131072 tokens per step\\) step_time=[0-9.]+ ms comm_share=[0-9.]+%.*mfu=[0-9.]+% of FP32 peak 19.5 TFLOP/s per GPU with nanoGPT's estimate_mfu.*predicted GPT: peak memory [0-9.]+ GiB of 80.00 GiB")
  ditto_expect_exit(DittoTrainCli.DryRunGpt2XlOutOfMemoryOn40GB RC 1
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2-xl --dry-run --profile a100-sxm-40gb
            --devices 8 --trainer ddp --batch-size 32
    REGEX "ditto-train: error: sim:[0-7]: out of memory: tried to allocate [0-9]+ bytes \\([0-9.]+ MiB\\); [0-9]+ bytes \\([0-9.]+ MiB\\) in use of capacity 42949672960 bytes \\(40960.00 MiB\\) \\(peak [^)]*\\)\\); predicted by a dry run with the capacity lifted, the run needs 43.59 GiB at its peak on its fullest device \\(sim:0, NVIDIA A100 SXM4 40GB\\) of 40.00 GiB, at least 11.61 GiB of it between steps \\(the weights, gradients and optimizer state\\); to fit: --batch-size 16 \\(peak 33.40 GiB\\), --grad-accum-steps 2 \\(the same batch. peak 39.20 GiB\\), --dtype bf16 \\(peak 33.42 GiB\\), --zero-stage 1 \\(peak 33.44 GiB\\)\n$")
  ditto_expect_exit(DittoTrainCli.DryRunGpt2XlFitsOn40GBWithZero1 RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2-xl --dry-run --profile a100-sxm-40gb
            --devices 8 --trainer ddp --batch-size 32 --zero-stage 1
    REGEX "memory: sim:0 live=[0-9.]+ MiB peak=[0-9.]+ MiB capacity=40960.00 MiB optimizer_state=1485.49 MiB.*predicted GPT: peak memory [0-9.]+ GiB of 40.00 GiB")
  # A bf16 run's predicted: line gives MFU against the BF16 peak (it gave 639% of the FP32 peak).
  # 60.3% since ZeRO-1's reduce_scatters overlap the backward (Note [ZeRO overlapped
  # reduce_scatter]), 60.0% since the cross-entropy forward and backward became one pass (fast mode), 59.3% since ZeRO-1's copies took one launch per list (Note [ZeRO copies]), the MLP's
  # GELU went into its GEMMs' epilogues and issue 29's cost model prices what ditto's CUDA code
  # runs: attention on its
  # mma.sync flash attention at mma_efficiency 0.25 (an estimate), every bf16 op of the step on a
  # typed kernel, the residual adds in the LayerNorm forward, the LayerNorm weight and bias
  # gradients in the backward's launch, and the first step starting after the setup its host waited
  # for (Note [Host clock]: 60.3% while it overlapped DDP's broadcast; 55.2% before these and
  # the GELU epilogues, 54.7% before the LayerNorm backward took the residual gradient's add and the
  # moments were zeroed in one launch, 46.8% while the row sums and the embedding gradient went through f32 scratch,
  # 18.7% while attention ran on the SIMT cores and every bf16 kernel but the GEMMs through f32
  # scratch, 64.2% with all on the tensor cores).
  ditto_expect_exit(DittoTrainCli.DryRunBf16MfuAgainstTheBf16Peak RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2 --dry-run --profile a100-sxm-80gb
            --devices 8 --trainer ddp --batch-size 512 --dtype bf16 --zero-stage 1 --max-iters 2
            --eval-iters 0 --sample 0
    REGEX "predicted: 8 x NVIDIA A100 SXM4 80GB [^\n]* comm_share=[0-9.]+% \\(virtual time\\)\n.*predicted GPT: [^\n]*; mfu=60\\.0% of BF16 peak 312 TFLOP/s per GPU with nanoGPT's estimate_mfu")
  # f32 with --allow-tf32 in fast mode: the GEMMs are priced on the TF32 tensor cores, so MFU is
  # against the TF32 peak (it said "208.8% of FP32 peak 67" for the char model on an H200).
  ditto_expect_exit(DittoTrainCli.DryRunTf32MfuAgainstTheTf32Peak RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --n-layer 6 --n-head 6 --n-embd 384
            --block-size 256 --batch-size 64 --dtype f32 --allow-tf32 --determinism fast
            --dry-run --profile h200 --devices 1 --max-iters 2 --eval-iters 0 --sample 0
    REGEX "GEMMs on tensor cores \\(cuBLASLt, TF32 494.5 TFLOP/s[^\n]*\n.*predicted GPT: [^\n]*; mfu=[0-9]+\\.[0-9]% of TF32 peak 494.5 TFLOP/s per GPU")
  # f16 on a profile with an FP16 rate and no BF16 one (a V100): the GEMMs priced at FP16 125,
  # MFU of that peak (it said "mfu=424.5% of BF16 peak 15.7", the loader's FP32 fallback).
  ditto_expect_exit(DittoTrainCli.DryRunF16MfuAgainstTheFp16Peak RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2 --dry-run --devices 1 --dtype f16
            --batch-size 4 --profile ${CMAKE_CURRENT_SOURCE_DIR}/data/profile_v100_f16_only.json
    REGEX "GEMMs on tensor cores \\(cuBLASLt, FP16 125 TFLOP/s[^\n]*\n.*predicted GPT: [^\n]*; mfu=[1-9][0-9]\\.[0-9]% of FP16 peak 125 TFLOP/s per GPU")
  # A small model's peak memory in MiB on an 80 GB card (it said "0.00 GiB of 79.65 GiB").
  ditto_expect_exit(DittoTrainCli.DryRunSmallPeakInMiB RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --dry-run --profile h100-sxm
    REGEX "predicted GPT: peak memory [1-9][0-9]*\\.[0-9][0-9] MiB of 79\\.65 GiB on the fullest device")
  # --verbose (issue 29 item 5): the units each kernel class is priced on, and the step's kernels
  # by kind with FLOP and bytes, their rows adding up to the predicted step (Note [Compute units]);
  # the optimizer and the clip as the CUDA backend's multi-tensor launches, the GEMMs as its typed
  # gemm_ex (a Linear's bias in the epilogue: no add_bias), attention as its typed flash
  # attention on the tensor cores (the backward two launches), the row ops typed, MixedOp's f32
  # scratch (what has no typed kernel) as its cast launches (Note [Predicted launches], Note
  # [Typed kernels]).
  ditto_expect_exit(DittoTrainCli.DryRunVerboseKernelTable RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2 --batch-size 8 --dtype bf16
            --dry-run --profile h200 --devices 1 --verbose
    REGEX "determinism=fast dtype=bf16; GEMMs on tensor cores \\(cuBLASLt, BF16 989.5 TFLOP/s x gemm_efficiency 0.803\\), attention on tensor cores \\(ditto's mma.sync flash attention, BF16 989.5 TFLOP/s x mma_efficiency 0.25, an estimate\\), other kernels at memory bandwidth 4800 GB/s x memory_efficiency 0.865\n.*predicted GPT: 563098 tokens/s .*\n  kernel +per step +GFLOP +MB +unit +time ms +share\n  gemm_ex +147 +6073.621 +11707.582 +tensor core bf16 .*\n  attention_backward_ex +24 +573.283 +1840.251 +tensor core bf16 mma .*\n  attention_forward_ex +12 +169.279 +613.417 +tensor core bf16 mma .*\n  adam_step_multi_ex +1 +2.240 +3485.325 +memory .*\n  sum_rows_ex +49 +0.686 +1386.179 +memory .*\n  layernorm_backward_params +25 +2.668 +1414.579 +memory .*\n  layernorm_forward_add +24 +1.359 +1209.643 +memory .*\n  fill_multi +0.5 +0.000 +497.904 +memory .*\n  sum_squares_multi_ex +2 +0.249 +249.075 +memory .*\n  embedding_backward_ex +6 +0.045 +167.182 +memory .*\n  layernorm_forward_ex +1 +0.050 +25.236 +memory .*  total \\(sim:0 busy\\) +303.5 +6825.547 +24284.580 +14.5481 +100.0%\n  predicted step +14.5481 +100.0%")
  ditto_expect_exit(DittoTrainCli.DryRunVerboseBitwiseGemmsOnSimt RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2 --batch-size 8 --dtype bf16
            --dry-run --profile h200 --devices 1 --verbose --determinism bitwise
    REGEX "determinism=bitwise dtype=bf16; GEMMs on SIMT cores \\(ditto's fma-chain kernel, FP32 67 TFLOP/s x simt_efficiency 0.471\\).*attention on SIMT cores \\(ditto's kernels, FP32 67 TFLOP/s x simt_efficiency 0.471\\).*predicted GPT: 36174 tokens/s .*\n  gemm_ex +98 +4049.080 +6999.804 +SIMT f32 \\(ditto\\) .*\n  gemm_tn_sharded_ex +56 +2024.540 +4828.692 +SIMT f32 \\(ditto\\) .*  predicted step +226.4631 +100.0%")
  ditto_expect_exit(DittoTrainCli.VerboseNeedsAProfile RC 2
    COMMAND $<TARGET_FILE:ditto-train> --verbose --epochs 0
    REGEX "ditto-train: error: --verbose: prints the cost model's table of the predicted step: expected --profile")
  # Issue 29 (tester 2, item 1): past 818 devices of 80 GB a dry run failed ("sim:818: dry run:
  # no free address range ..."), each device reserving twice its capacity of host address space;
  # so did one device of 60000 GiB. Dry addresses are no host memory's now (Note [Dry addresses],
  # backend_sim/sim_dry_arena.h); what their span cannot hold is refused before the run, naming
  # the options.
  ditto_expect_exit(DittoTrainCli.DryRunOf1024Devices RC 0
    COMMAND $<TARGET_FILE:ditto-train> --dry-run --profile h100-sxm --nodes 128 --devices 8
            --trainer ddp --micro-shards 1024 --batch-size 1024 --epochs 1
    REGEX "predicted: 1024 x NVIDIA H100 SXM5 80GB \\(128 nodes, nvlink\\) step_time=[0-9.]+ ms.*memory: sim:1023 live=[0-9.]+ MiB peak=[0-9.]+ MiB capacity=81559.00 MiB")
  ditto_expect_exit(DittoTrainCli.DryRunOneDeviceOf60000GiB RC 0
    COMMAND $<TARGET_FILE:ditto-train> --dry-run --profile h100-sxm --sim-memory-gib 60000
            --devices 1 --epochs 1
    REGEX "memory: sim:0 live=[0-9.]+ MiB peak=[0-9.]+ MiB capacity=61440000.00 MiB")
  ditto_expect_exit(DittoTrainCli.DryRunPastTheAddressSpanRefusedBeforeTheRun RC 1
    COMMAND $<TARGET_FILE:ditto-train> --dry-run --profile h100-sxm --devices 65536
            --sim-memory-gib 100000 --micro-shards 65536 --batch-size 65536 --epochs 1
    REGEX "ditto-train: error: --devices x --sim-memory-gib: a dry run's devices take their addresses \\(never host memory\\) from one span of [0-9]+ GiB, at least their capacity each: expected at most [0-9]+ GiB per device for 65536 devices, got 100000 GiB")
  # Issue 29 (tester 2, item 2): --trace of a run that failed (here out of memory) is written, up
  # to the failure, and said; the exit status stays the failure's.
  ditto_expect_exit(DittoTrainCli.DryRunOutOfMemoryWritesItsTrace RC 1
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2-xl --dry-run --profile a100-sxm-40gb
            --devices 8 --trainer ddp --batch-size 32 --trace ${CMAKE_CURRENT_BINARY_DIR}/dry_oom_trace.json
    REGEX "ditto-train: note: --trace: wrote [^\n]*dry_oom_trace.json for the failed run: what ran up to the failure \\(Chrome trace JSON; open in https://ui.perfetto.dev\\)\nditto-train: error: sim:[0-7]: out of memory: tried to allocate")
  # GPTs deeper than 85 blocks (GPT-3 has 96) were refused: the dropout sites passed 8 bits. Their
  # sites >= 256 take kStreamDropoutWide (Note [Dropout masks], core/numerics/gpt_math.h), up to
  # 21845 blocks with dropout.
  ditto_expect_exit(DittoTrainCli.DryRunGptOf96BlocksWithDropout RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --n-layer 96 --n-head 2 --n-embd 16
            --block-size 16 --vocab-size 64 --dropout 0.1 --batch-size 4 --dry-run
            --profile h100-sxm --devices 2
    REGEX "model=gpt n_layer=96 n_head=2 n_embd=16 block_size=16 vocab_size=64 bias=False dropout=0.1 params=299280 .*predicted GPT: [0-9]+ tokens/s")
  ditto_expect_exit(DittoTrainCli.GptDropoutPast21845BlocksRefused RC 2
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --n-layer 21846 --dropout 0.1 --dry-run
            --profile h100-sxm --vocab-size 64
    REGEX "^ditto-train: error: --n-layer: expected at most 21845 with --dropout > 0 \\(each block's dropout sites must fit in the 16 bits of Note \\[Dropout masks\\]\\), got 21846")
  ditto_expect_exit(DittoTrainCli.DryRunOnlyOnTheSimulator RC 2
    COMMAND $<TARGET_FILE:ditto-train> --dry-run --backend cuda --profile h100-sxm --epochs 0
    REGEX "ditto-train: error: --dry-run: expected --backend sim in one process")
  ditto_expect_exit(DittoTrainCli.DryRunNeedsAProfile RC 2
    COMMAND $<TARGET_FILE:ditto-train> --dry-run --epochs 0
    REGEX "ditto-train: error: --dry-run: expected --profile")
  ditto_expect_exit(DittoTrainCli.UnknownPreset RC 2
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt3 --dry-run --profile h100-sxm
    REGEX "ditto-train: error: --preset: expected one of gpt2, gpt2-medium, gpt2-large, gpt2-xl")
endif()

# Fast mode splits a batch over DDP's ranks as DataParallel's fast scatter does (torch.chunk):
# 24 rows over 3 ranks are 8 each, so the ranks' peaks are equal (they were 7, 8 and 9 rows:
# 6.65, 7.37 and 8.08 MiB; with --micro-shards 4, 6, 6 and 12), and --micro-shards does nothing
# in fast mode, as its warning says.
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.FastDdpSplitsThreeRanksEvenly RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --n-layer 2 --n-head 2 --n-embd 64
            --block-size 64 --batch-size 24 --max-iters 2 --eval-iters 0 --sample 0 --devices 3
            --trainer ddp --determinism fast --micro-shards 4
    REGEX "memory: sim:0 live=[0-9.]+ MiB peak=7\\.37 MiB[^\n]*\nmemory: sim:1 live=[0-9.]+ MiB peak=7\\.37 MiB[^\n]*\nmemory: sim:2 live=[0-9.]+ MiB peak=7\\.37 MiB")
endif()

# A dry run's evaluations print no losses and no wall-clock speed, on the line or in the JSON
# record (they printed "train loss 0.0000, val loss 0.0000" and "train_loss":0.0).
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.DryRunEvaluationsHaveNoLosses RC 0
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --n-layer 2 --n-head 2 --n-embd 16
            --block-size 16 --batch-size 8 --max-iters 6 --eval-iters 1 --eval-interval 3
            --sample 0 --dry-run --profile h100-sxm --metrics-jsonl /dev/stdout
    REGEX "\nstep 0: no losses \\(dry run: nothing ran; lr 9\\.901e-06\\)\n\\{\"dry_run\":true,\"event\":\"eval\",\"lr\":[0-9.e-]+,\"max_iters\":6,\"step\":0,\"tokens\":0\\}\nstep 3: no losses \\(dry run: nothing ran; lr 2\\.970e-05\\)\n\\{\"dry_run\":true,\"event\":\"eval\",\"lr\":[0-9.e-]+,\"max_iters\":6,\"step\":3,\"tokens\":384\\}\n")
endif()

# More GPUs on a node than a node holds (8) are priced as asked, with a warning naming the flags
# of 8-GPU nodes (--devices 64 printed "(1 node, nvlink)" and nothing else).
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.MoreGpusOnANodeThanANodeHoldsWarns RC 0
    COMMAND $<TARGET_FILE:ditto-train> --devices 16 --profile h100-sxm --dry-run --epochs 1
    REGEX "predicted: 16 x NVIDIA H100 SXM5 80GB \\(1 node, nvlink\\).*ditto-train: warning: --devices 16: 16 GPUs on one node, priced as one nvlink node of 16 \\(its collectives at one node's link bandwidth, none across a network\\); a node holds 8 GPUs \\(an HGX board\\): for 16 GPUs in nodes of at most 8 \\(InfiniBand between them\\) use --nodes 2 --devices 8 --trainer ddp \\(DataParallel is one node's\\)\n")
endif()

# A real run's prediction says it priced the simulator's own kernels and points to --dry-run
# (the two differ: docs/prediction.md).
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.RealRunPredictionPointsToTheDryRun RC 0
    COMMAND $<TARGET_FILE:ditto-train> --profile h100-sxm --devices 2 --epochs 1
    REGEX "predicted: 2 x NVIDIA H100 SXM5 80GB \\(1 node, nvlink\\) [^\n]* \\(virtual time; FP32 peak 67\\.0 TFLOP/s per GPU; the simulator's own kernels: --dry-run prices a GPU's\\)\nmeasured:  CPU simulator")
endif()
