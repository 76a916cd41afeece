# Bad option values of ditto-train, and the option checks of its newer features.
# include()d by tests/CMakeLists.txt: its directory, ditto_expect_exit, CMAKE_CURRENT_SOURCE_DIR.

# Bad option values found by a newcomer: each must end the run at startup with
# "ditto-train: error: <option>: expected ..." (nothing printed before it), never be ignored.
if(TARGET ditto-train)
  # ZeRO-1 (core/optim/zero.h): the checksum of the same run without it (ddp Adam, 4 ranks, the
  # optimizer state of rank 0: its part of the bucket-major layout of overlap_comm, Note [ZeRO
  # overlapped reduce_scatter], the last layer's 1290 of the 9610 parameters; 8192 with
  # --zero-overlap-comm=false); dp is refused.
  ditto_expect_exit(DittoTrainCli.ZeroStage1SameChecksumAsWithout RC 0
    REGEX "params_checksum=184c519e7f1f0218.*memory: sim:0 live=[0-9.]+ MiB peak=[0-9.]+ MiB capacity=81920.00 MiB optimizer_state=0.01 MiB"
    COMMAND $<TARGET_FILE:ditto-train> --trainer ddp --optimizer adam --zero-stage 1 --devices 4)
  ditto_expect_exit(DittoTrainCli.ZeroStage1NeedsDdp RC 2
    REGEX "^ditto-train: error: --zero-stage 1: expected --trainer ddp \\(ZeRO shards the optimizer state over DDP's ranks\\), got --trainer dp"
    COMMAND $<TARGET_FILE:ditto-train> --zero-stage 1 --epochs 1)
  # A dry run (no tensor data) with --checkpoint wrote all-zero checkpoints and rotated a real
  # run's out of the directory; a resume then trained on from zeros without a word.
  ditto_expect_exit(DittoTrainCli.DryRunRefusesCheckpoint RC 2
    REGEX "^ditto-train: error: --checkpoint: expected none with --dry-run \\(a dry run holds no tensor data, so its checkpoints would be all zeros\\), got '[^']*dry_ck'"
    COMMAND $<TARGET_FILE:ditto-train> --dry-run --profile h100-sxm --epochs 1
            --checkpoint ${CMAKE_CURRENT_BINARY_DIR}/cli_dry_ck)
  # Likewise its sample (copies to the host read zeros): noise printed as the model's sample, and
  # --sample 99999999999999999999 generated until killed. --sample 0 (none) is a dry run's own.
  ditto_expect_exit(DittoTrainCli.DryRunRefusesSample RC 2
    REGEX "^ditto-train: error: --sample: expected 0 \\(none\\) with --dry-run \\(a dry run holds no tensor data, so its sample would be noise, not the model's\\), got 20\n$"
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --dry-run --profile h100-sxm --sample 20)
  ditto_expect_exit(DittoTrainCli.DryRunTakesSampleZero RC 0 REGEX "predicted GPT: "
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --dry-run --profile h100-sxm --sample 0)
  # --metrics-jsonl or --trace naming the --data file overwrote the data set; inside the
  # --checkpoint directory, its files. (The data file does not exist: nothing can be lost.)
  ditto_expect_exit(DittoTrainCli.MetricsOverTheDataIsRefused RC 2
    REGEX "^ditto-train: error: --metrics-jsonl: expected a file other than --data '[^']*/cli_collide.csv', got '[^']*/\\./cli_collide.csv', which it would overwrite"
    COMMAND $<TARGET_FILE:ditto-train> --data ${CMAKE_CURRENT_BINARY_DIR}/cli_collide.csv
            --metrics-jsonl ${CMAKE_CURRENT_BINARY_DIR}/./cli_collide.csv)
  ditto_expect_exit(DittoTrainCli.TraceInsideTheCheckpointDirIsRefused RC 2
    REGEX "^ditto-train: error: --trace: expected a file outside the --checkpoint directory '[^']*cli_trace_ck', got '[^']*cli_trace_ck/latest'"
    COMMAND $<TARGET_FILE:ditto-train> --epochs 1 --checkpoint ${CMAKE_CURRENT_BINARY_DIR}/cli_trace_ck
            --trace ${CMAKE_CURRENT_BINARY_DIR}/cli_trace_ck/latest)
  # CLI11 saturated a seed past 2^64 - 1 at 2^64 - 1 and the run went on with it.
  ditto_expect_exit(DittoTrainCli.SeedPast64BitsIsRefused RC 2
    REGEX "--seed: expected an integer in 0..18446744073709551615 \\(or 0x0..0xffffffffffffffff\\), got 18446744073709551616"
    COMMAND $<TARGET_FILE:ditto-train> --seed 18446744073709551616 --epochs 0)
  # CLI11 converts a signed integer with strtoll, which saturates: --batch-size
  # 99999999999999999999 ran as 9223372036854775807 (the start line printed it). Every int64
  # option is refused past the type as typed (ditto_cli::numeric_value, examples/cli_common.h);
  # an int option (--devices) already was, by CLI11's own check.
  foreach(case "batch_size|--batch-size;99999999999999999999|--batch-size: expected an integer >= 1, got '99999999999999999999': past the largest 64-bit integer, 9223372036854775807"
               "max_iters|--model;gpt;--max-iters;-99999999999999999999|--max-iters: expected an integer >= 1, got '-99999999999999999999': below the smallest 64-bit integer, -9223372036854775808"
               "hex|--comm-timeout-ms;0x8000000000000000|--comm-timeout-ms: expected [^\n]*, got '0x8000000000000000': past the largest 64-bit integer, 9223372036854775807")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 name)
    list(GET parts -1 regex)
    list(SUBLIST parts 1 -1 args)
    list(REMOVE_AT args -1)
    ditto_expect_exit(DittoTrainCli.Int64PastItsRange_${name} RC 2
      REGEX "^ditto-train: error: ${regex}\n"
      COMMAND $<TARGET_FILE:ditto-train> ${args} --epochs 0)
  endforeach()
  # The MLP's sizes in 64 bits too: a batch near 2^63 overflowed the batches of an epoch
  # (LoaderSource::batches_per_epoch, data::DataLoader::size: UBSan stopped the run), and a
  # --hidden whose parameters overflow failed in the first step ("Linear: expected in_features *
  # out_features <= ...", exit 1).
  ditto_expect_exit(DittoTrainCli.MlpBatchSizeOfInt64Max RC 0
    REGEX "final: backend=sim devices=4 determinism=bitwise epochs=1 "
    COMMAND $<TARGET_FILE:ditto-train> --batch-size 9223372036854775807 --epochs 1)
  ditto_expect_exit(DittoTrainCli.MlpHiddenPast64Bits RC 2
    REGEX "^ditto-train: error: --hidden: expected layer sizes whose weights' f32 bytes \\(in x out x 4\\) and parameter count fit in 64 bits, got '3037000500,3037000500' \\(the model 64-3037000500-3037000500-10\\)\n"
    COMMAND $<TARGET_FILE:ditto-train> --hidden 3037000500,3037000500 --epochs 1)
  # now + 2^63-1 ms overflowed: the collective timed out at once, naming the wrong rank.
  ditto_expect_exit(DittoTrainCli.CommTimeoutTooLarge RC 2
    REGEX "^ditto-train: error: --comm-timeout-ms: expected 0 \\(the communicators' own\\) to 2147483648 ms \\(2\\^31, about 24.9 days\\), got 9223372036854775807"
    COMMAND $<TARGET_FILE:ditto-train> --comm-timeout-ms 9223372036854775807 --fault skip-collective:rank=1,index=3 --epochs 1)
  ditto_expect_exit(DittoTrainCli.SkipCollectiveRankOutOfRange RC 2
    REGEX "^ditto-train: error: --fault 'skip-collective:rank=9,index=0': expected a rank in 0..3, got 9"
    COMMAND $<TARGET_FILE:ditto-train> --trainer ddp --devices 4 --fault skip-collective:rank=9,index=0 --epochs 1)
  # --checkpoint and --trace are checked before training, not when the run ends.
  ditto_expect_exit(DittoTrainCli.CheckpointNotADirectoryFailsAtStartup RC 2
    REGEX "^ditto-train: error: --checkpoint: expected a directory it may create or write, got '[^']*/CMakeLists.txt/ckpt': cannot create directory '[^']*/CMakeLists.txt/ckpt': Not a directory"
    COMMAND $<TARGET_FILE:ditto-train> --trainer ddp --checkpoint ${CMAKE_CURRENT_SOURCE_DIR}/CMakeLists.txt/ckpt --epochs 1)
  ditto_expect_exit(DittoTrainCli.TraceInMissingDirectoryFailsAtStartup RC 2
    REGEX "^ditto-train: error: --trace: expected a file in an existing directory, got '[^']*/no_such_dir/t.json'"
    COMMAND $<TARGET_FILE:ditto-train> --trace ${CMAKE_CURRENT_BINARY_DIR}/no_such_dir/t.json --epochs 1)
  # An empty path is refused, not taken for "not given"; an empty --hidden item too.
  foreach(opt checkpoint resume trace profile)
    ditto_expect_exit(DittoTrainCli.Empty_${opt} RC 2
      REGEX "ditto-train: error: --${opt}: expected [a-z .]+, got an empty string"
      COMMAND bash -c "\"$1\" --${opt} '' --epochs 0" _ $<TARGET_FILE:ditto-train>)
  endforeach()
  ditto_expect_exit(DittoTrainCli.HiddenEmptyItem RC 2
    COMMAND $<TARGET_FILE:ditto-train> --hidden 128,,64 --epochs 0
    REGEX "ditto-train: error: --hidden: expected comma-separated positive sizes such as 128 or 256,128 \\('' for no hidden layer\\), got '128,,64' \\(an empty item\\)")
  ditto_expect_exit(DittoTrainCli.HiddenEmptyIsNoHiddenLayer RC 0 REGEX "model=64-10 "
    COMMAND bash -c "\"$1\" --hidden '' --epochs 0" _ $<TARGET_FILE:ditto-train>)
  # Rank 0's own error is reported, not the other ranks' errors its abort caused (a race).
  ditto_expect_exit(DittoTrainCli.DdpReportsTheRootErrorNotTheAbortItCaused RC 0 REGEX "PASS"
    COMMAND ${CMAKE_COMMAND} -DTRAIN=$<TARGET_FILE:ditto-train> -DRUNS=6
            -DDIR=${CMAKE_CURRENT_BINARY_DIR}/ditto_train_ddp_root_error
            -P ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_ddp_root_error.cmake)
endif()
