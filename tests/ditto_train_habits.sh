#!/usr/bin/env bash
# Habits users bring from nanoGPT, torchrun and PyTorch (issue 31), one section per ctest
# (registered in tests/cmake/train_outputs.cmake):
#   progress  --log-interval: nanoGPT's "iter N: loss L, time Tms[, mfu M%]" lines and JSON lines;
#             mfu only with a --profile; the MLP's default prints none in short epochs; the
#             checksum and the prediction do not change with the lines
#   dry_run   the dry run and runs without an evaluation or an epoch print only what ran: one MFU
#             against the dtype's peak, no measured: line, no losses or checksum for what did not
#             run, and no MLP field in the GPT's final JSON record
#   cli       usage errors exit 2 as "ditto-train: error: --FLAG: expected ..., got ...", a
#             repeated option's last value wins, --seed takes hex
#   settings  options that do nothing or change the checksum say so (or are refused)
# Usage: ditto_train_habits.sh PATH/TO/ditto-train WORK_DIR SECTION
set -u
train=$1 work=$2 section=$3
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
checksum() { grep -o 'params_checksum=[0-9a-f]*' | cut -d= -f2; }
tiny=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 8
      --max-iters 12 --eval-interval 6 --eval-iters 1 --warmup-iters 2 --lr-decay-iters 12
      --sample 0)
# expect_usage REGEX ARGS...: exit status 2 and stderr's first line matching REGEX
expect_usage() {
  local re=$1; shift
  "$train" "$@" > "$work/out" 2> "$work/err"
  local rc=$?
  [ $rc = 2 ] || fail "$*: exit status $rc, expected 2: $(cat "$work/err")"
  head -1 "$work/err" | grep -Eq -- "^ditto-train: error: $re" ||
    fail "$*: expected '$re', got: $(cat "$work/err")"
}

case $section in
progress)
  # The GPT's default, 10: iters 0 and 10 of 12, in nanoGPT's format, between the evaluations.
  "$train" "${tiny[@]}" --devices 2 --metrics-jsonl "$work/m.jsonl" > "$work/out" ||
    fail "exit status $?: $(cat "$work/out")"
  [ "$(grep -c '^iter ' "$work/out")" = 2 ] || fail "expected 2 iter lines: $(cat "$work/out")"
  grep -Eq '^iter 0: loss 4\.[0-9]{4}, time [0-9]+\.[0-9]{2}ms$' "$work/out" || fail "$(cat "$work/out")"
  grep -Eq '^iter 10: loss [0-9]+\.[0-9]{4}, time [0-9]+\.[0-9]{2}ms$' "$work/out" || fail "$(cat "$work/out")"
  grep -q mfu "$work/out" && fail "an mfu without a --profile (the simulator's wall clock has no GPU peak): $(cat "$work/out")"
  [ "$(grep -c '"event":"iter"' "$work/m.jsonl")" = 2 ] || fail "expected 2 iter JSON lines: $(cat "$work/m.jsonl")"
  grep '"event":"iter"' "$work/m.jsonl" | grep -q '"mfu"' && fail "mfu in JSON without a profile"
  loss=$(grep '^iter 10:' "$work/out" | sed 's/.*loss \([0-9.]*\),.*/\1/')
  json=$(grep '"iter":10,' "$work/m.jsonl" | grep -o '"loss":[0-9.e-]*' | cut -d: -f2)
  [ "$(printf '%.4f' "$json")" = "$loss" ] || fail "iter 10: loss $loss printed, $json in JSON"
  sum=$(checksum < "$work/out")
  # --log-interval 0: no lines, the same checksum; with a profile (ddp: every rank stops at the
  # logged step): mfu of the step's virtual time against the FP32 peak (f32), the same checksum
  # and the same predicted step as without the lines.
  "$train" "${tiny[@]}" --devices 2 --log-interval 0 > "$work/out0" || fail "$(cat "$work/out0")"
  grep -q '^iter ' "$work/out0" && fail "--log-interval 0 printed iter lines"
  [ "$(checksum < "$work/out0")" = "$sum" ] || fail "--log-interval 0 changed the checksum"
  for t in dp ddp; do
    "$train" "${tiny[@]}" --devices 2 --trainer $t --profile h100-sxm --log-interval 3 \
      --metrics-jsonl "$work/p.jsonl" > "$work/p_$t" || fail "$(cat "$work/p_$t")"
    [ "$(grep -c '^iter ' "$work/p_$t")" = 4 ] || fail "$t: expected iters 0 3 6 9: $(cat "$work/p_$t")"
    grep -Eq '^iter 3: loss [0-9.]+, time [0-9.]+ms, mfu [0-9]+\.[0-9]{2}% \(predicted [0-9.]+ms on h100-sxm, mfu of its FP32 peak\)$' "$work/p_$t" ||
      fail "$t: $(cat "$work/p_$t")"
    [ "$(grep '"event":"iter"' "$work/p.jsonl" | grep -c '"mfu":')" = 4 ] || fail "$t: $(cat "$work/p.jsonl")"
    [ "$(checksum < "$work/p_$t")" = "$sum" ] || fail "$t: the progress lines changed the checksum"
    "$train" "${tiny[@]}" --devices 2 --trainer $t --profile h100-sxm --log-interval 0 > "$work/q_$t"
    [ "$(grep '^predicted:' "$work/p_$t")" = "$(grep '^predicted:' "$work/q_$t")" ] ||
      fail "$t: the progress lines changed the prediction: $(grep '^predicted:' "$work/p_$t" "$work/q_$t")"
  done
  # The MLP: the default prints nothing in the digits' 23-batch epochs; --log-interval 10 prints
  # iters 0, 10, 20 of epoch 1 with their place in the epoch; the same checksum.
  "$train" --epochs 1 > "$work/mlp0" || fail "$(cat "$work/mlp0")"
  grep -q '^iter ' "$work/mlp0" && fail "the MLP's default printed iter lines in 23-step epochs"
  "$train" --epochs 1 --log-interval 10 > "$work/mlp" || fail "$(cat "$work/mlp")"
  [ "$(grep -c '^iter ' "$work/mlp")" = 3 ] || fail "$(cat "$work/mlp")"
  grep -Eq '^iter 20: loss [0-9.]+, time [0-9.]+ms \(epoch 1, batch 21 of 23\)$' "$work/mlp" || fail "$(cat "$work/mlp")"
  [ "$(checksum < "$work/mlp")" = "$(checksum < "$work/mlp0")" ] || fail "the MLP's lines changed the checksum"
  expect_usage "--log-interval: expected an integer >= 0 \\(0: no progress lines\\), got -1" --log-interval -1
  ;;
dry_run)
  "$train" --model gpt --preset gpt2 --batch-size 8 --dtype bf16 --dry-run --profile h200 \
    --devices 1 --metrics-jsonl "$work/d.jsonl" > "$work/out" || fail "$(cat "$work/out")"
  [ "$(grep -o 'mfu=' "$work/out" | wc -l)" = 1 ] || fail "expected one MFU: $(cat "$work/out")"
  grep -q 'mfu=[0-9.]*% of BF16 peak 989.5 TFLOP/s per GPU with nanoGPT' "$work/out" || fail "$(cat "$work/out")"
  grep -q 'FP32 peak' "$work/out" && fail "a bf16 run compared with the FP32 peak: $(cat "$work/out")"
  grep -q '^measured:' "$work/out" && fail "a measured: line when nothing ran"
  grep -Eq '^final: backend=sim devices=1 determinism=fast dtype=bf16 iters=2 train_time_s=[0-9.]+$' "$work/out" ||
    fail "final line: $(grep '^final' "$work/out")"
  final=$(grep '"event":"final"' "$work/d.jsonl")
  for f in epochs val_acc train_loss val_loss params_checksum; do
    echo "$final" | grep -q "\"$f\"" && fail "the dry run's final JSON record has $f: $final"
  done
  echo "$final" | grep -q '"dry_run":true' || fail "$final"
  # The MLP's dry run: one MFU (f32: the FP32 peak), no measured line, no losses or checksum.
  "$train" --dry-run --profile h200 --epochs 1 > "$work/mlp" || fail "$(cat "$work/mlp")"
  [ "$(grep -o 'mfu=' "$work/mlp" | wc -l)" = 1 ] || fail "$(cat "$work/mlp")"
  grep -q '^measured:' "$work/mlp" && fail "a measured: line when nothing ran"
  grep -Eq '^final: backend=sim devices=4 determinism=fast epochs=1 train_time_s=[0-9.]+$' "$work/mlp" ||
    fail "$(grep '^final' "$work/mlp")"
  # Its epoch lines and JSON records: only the predicted epoch time and samples/s, no losses or
  # accuracy (nothing ran; they printed 0.0000 and a made-up val_acc), here and with --nodes,
  # --interconnect or --straggler.
  for extra in "" "--nodes 2 --trainer ddp" "--interconnect pcie4" "--straggler 1:2"; do
    rm -f "$work/dm.jsonl"
    "$train" --dry-run --profile h200 --epochs 2 $extra --metrics-jsonl "$work/dm.jsonl" > "$work/mlp" ||
      fail "$extra: $(cat "$work/mlp")"
    [ "$(grep -c '^epoch ' "$work/mlp")" = 2 ] || fail "$extra: $(cat "$work/mlp")"
    grep '^epoch ' "$work/mlp" | grep -Eq 'loss|acc' && fail "$extra: a dry run's epoch line has a loss: $(cat "$work/mlp")"
    grep -Eq '^epoch   2  predicted: epoch_time=[0-9.]+ ms samples/s=[0-9]+ \(dry run: nothing ran\)$' "$work/mlp" ||
      fail "$extra: $(cat "$work/mlp")"
    [ "$(grep -c '"event":"epoch"' "$work/dm.jsonl")" = 2 ] || fail "$extra: $(cat "$work/dm.jsonl")"
    grep '"event":"epoch"' "$work/dm.jsonl" | sed 's/"predicted":{[^}]*}//' | grep -Eq 'loss|acc|_time_s|_per_s' &&
      fail "$extra: a dry run's epoch JSON has a loss or wall-clock figure: $(cat "$work/dm.jsonl")"
    grep '"event":"epoch"' "$work/dm.jsonl" | grep -q '"predicted":{"epoch_time_s":[0-9.e-]*,"samples_per_s"' ||
      fail "$extra: $(cat "$work/dm.jsonl")"
    grep '"event":"final"' "$work/dm.jsonl" | grep -q '"max_iters"' &&
      fail "the MLP's final JSON record has the GPT's max_iters: $(cat "$work/dm.jsonl")"
  done
  # A dry run resumed from a real checkpoint: still no losses.
  "$train" --epochs 1 --checkpoint "$work/ck" > /dev/null || fail "checkpoint run"
  "$train" --dry-run --profile h200 --determinism bitwise --epochs 2 --resume "$work/ck" > "$work/mlp" || fail "$(cat "$work/mlp")"
  grep '^epoch ' "$work/mlp" | grep -Eq 'loss|acc' && fail "resumed dry run: $(cat "$work/mlp")"
  grep -q '^epoch   2  predicted:' "$work/mlp" || fail "resumed dry run: $(cat "$work/mlp")"
  # --eval-iters 0: no evaluation, so no losses (the checksum ran); the GPT's record has no
  # MLP fields. --epochs 0: no training loss; the evaluation of the initial model is real.
  "$train" "${tiny[@]}" --eval-iters 0 --metrics-jsonl "$work/e.jsonl" > "$work/e" || fail "$(cat "$work/e")"
  grep -Eq '^final: backend=sim devices=4 determinism=bitwise iters=12 train_time_s=[0-9.]+ params_checksum=[0-9a-f]{16}$' "$work/e" ||
    fail "$(grep '^final' "$work/e")"
  final=$(grep '"event":"final"' "$work/e.jsonl")
  for f in epochs val_acc train_loss val_loss; do
    echo "$final" | grep -q "\"$f\"" && fail "--eval-iters 0: the final JSON record has $f: $final"
  done
  echo "$final" | grep -q '"params_checksum"' || fail "$final"
  "$train" "${tiny[@]}" --metrics-jsonl "$work/g.jsonl" > /dev/null || fail "gpt run"
  final=$(grep '"event":"final"' "$work/g.jsonl")
  echo "$final" | grep -q '"val_loss"' || fail "$final"
  for f in epochs val_acc; do
    echo "$final" | grep -q "\"$f\"" && fail "the GPT's final JSON record has the MLP's $f: $final"
  done
  "$train" --epochs 0 --metrics-jsonl "$work/z.jsonl" > "$work/z" || fail "$(cat "$work/z")"
  grep -Eq '^final: backend=sim devices=4 determinism=bitwise epochs=0 val_loss=[0-9.]+ val_acc=[0-9.]+ train_time_s=[0-9.]+ params_checksum=[0-9a-f]{16}$' "$work/z" ||
    fail "$(grep '^final' "$work/z")"
  grep '"event":"final"' "$work/z.jsonl" | grep -q '"train_loss"' && fail "--epochs 0: train_loss in JSON"
  grep '"event":"final"' "$work/z.jsonl" | grep -q '"max_iters"' && fail "the MLP's final JSON record has max_iters"
  grep '"event":"final"' "$work/g.jsonl" | grep -q '"max_iters":12' || fail "the GPT's final record lost max_iters"
  ;;
cli)
  expect_usage "--devices: expected an integer in 1\\.\\.65536, got 'abc'$" --devices abc
  expect_usage "--devices: expected >= 1, got -1$" --devices -1
  expect_usage "--seed: expected an integer >= 0, got -1$" --seed -1
  expect_usage "--lr: expected a number > 0, got 'x'$" --lr x
  expect_usage "--model: expected mlp or gpt, got 'rnn'$" --model rnn
  expect_usage "--n-layer: expected --model gpt, got --model mlp$" --n-layer 2
  # A repeated option: the last value wins (argparse's store); repeatable ones still collect.
  "$train" --epochs 3 --epochs 1 --devices 8 --devices 2 > "$work/out" 2>&1 || fail "$(cat "$work/out")"
  grep -q '^final: backend=sim devices=2 determinism=bitwise epochs=1 ' "$work/out" || fail "$(cat "$work/out")"
  a=$(checksum < "$work/out")
  [ "$("$train" --epochs 1 --devices 2 | checksum)" = "$a" ] || fail "the last values did not win"
  "$train" --epochs 1 --profile h100-sxm --straggler 0:2 --straggler 1:3 > "$work/s" 2>&1 || fail "$(cat "$work/s")"
  # --seed in hex, as every other integer option takes it.
  [ "$("$train" --epochs 1 --seed 0x10 | checksum)" = "$("$train" --epochs 1 --seed 16 | checksum)" ] ||
    fail "--seed 0x10 is not --seed 16"
  expect_usage "--seed: expected an integer in 0\\.\\.18446744073709551615 \\(or 0x0\\.\\.0xffffffffffffffff\\), got 0x10000000000000000$" --seed 0x10000000000000000
  # --resume auto with a --checkpoint that is a file: refused before "starting fresh".
  : > "$work/afile"
  expect_usage "--resume auto --checkpoint: expected a checkpoint directory \\(or one to create\\), got '$work/afile', which is not a directory$" --resume auto --checkpoint "$work/afile" --epochs 1
  grep -q 'starting fresh' "$work/out" && fail "said 'starting fresh' before refusing: $(cat "$work/out")"
  # A resume with another --lr: refused (exit 1, as every setting a checkpoint records) naming
  # the option and both values, not optim::SGD::load_state_dict's option key.
  "$train" --epochs 1 --checkpoint "$work/ck" > /dev/null || fail "checkpoint run"
  "$train" --epochs 2 --lr 0.1 --resume "$work/ck" > /dev/null 2> "$work/err"
  rc=$?
  [ $rc = 1 ] || fail "--lr 0.1 resume: exit status $rc: $(cat "$work/err")"
  grep -Eq "^ditto-train: error: resume: checkpoint '[^']*' does not match this run's optimizer: --lr: checkpoint 0\.05[0-9]*, this run 0\.1[0-9]*$" "$work/err" ||
    fail "--lr 0.1 resume: $(cat "$work/err")"
  # An empty value is refused (CLI11 read it as 0: --epochs '' trained no epoch), for every
  # numeric option; leading zeros are decimal (Python's int('010') == 10; CLI11 read octal).
  expect_usage "--epochs: expected an integer >= 0, got ''$" --epochs ''
  expect_usage "--devices: expected an integer in 1\\.\\.65536, got ''$" --devices ''
  expect_usage "--lr: expected a number > 0, got ''$" --lr ''
  expect_usage "--seed: expected an integer >= 0, got ''$" --seed ''
  expect_usage "--n-layer: expected an integer >= 1, got ''$" --model gpt --n-layer ''
  expect_usage "--momentum: expected a number, got ' '$" --momentum ' '
  "$train" --epochs 010 > "$work/out" 2>&1 || fail "$(cat "$work/out")"
  grep -q '^final: backend=sim devices=4 determinism=bitwise epochs=10 ' "$work/out" || fail "--epochs 010 is not 10: $(cat "$work/out")"
  [ "$(grep -c '^epoch ' "$work/out")" = 10 ] || fail "--epochs 010 is not 10: $(cat "$work/out")"
  [ "$("$train" --epochs 1 --seed 010 | checksum)" = "$("$train" --epochs 1 --seed 10 | checksum)" ] ||
    fail "--seed 010 is not --seed 10"
  [ "$("$train" --epochs 1 --devices 02 | checksum)" = "$("$train" --epochs 1 --devices 2 | checksum)" ] ||
    fail "--devices 02 is not --devices 2"
  ;;
settings)
  # DITTO_SIM_THREADS that is not used is said once, naming the variable and the value.
  for v in abc 0 -3; do
    DITTO_SIM_THREADS=$v "$train" --epochs 1 --devices 8 > /dev/null 2> "$work/err" || fail "$(cat "$work/err")"
    [ "$(grep -c "^ditto: warning: DITTO_SIM_THREADS='$v': expected an integer in 1\.\.1024" "$work/err")" = 1 ] ||
      fail "DITTO_SIM_THREADS=$v: $(cat "$work/err")"
  done
  # Also when the run is too small to use the simulator's thread pool (the warning came with the
  # pool's first use, so a 40-row CSV on 4 or 8 devices said nothing).
  for i in $(seq 40); do echo "$((i % 7)),$((i % 5)),$((i % 3))"; done > "$work/small40.csv"
  DITTO_SIM_THREADS=abc "$train" --data "$work/small40.csv" --epochs 1 --devices 8 > /dev/null 2> "$work/err" ||
    fail "$(cat "$work/err")"
  [ "$(grep -c "^ditto: warning: DITTO_SIM_THREADS='abc': expected an integer in 1\.\.1024" "$work/err")" = 1 ] ||
    fail "DITTO_SIM_THREADS=abc, a 40-row CSV: $(cat "$work/err")"
  DITTO_SIM_THREADS=2 "$train" --epochs 1 > /dev/null 2> "$work/err" || fail "$(cat "$work/err")"
  [ -s "$work/err" ] && fail "a warning for DITTO_SIM_THREADS=2: $(cat "$work/err")"
  "$train" --epochs 1 --bucket-cap-mb 8 > /dev/null 2> "$work/err" || fail "$(cat "$work/err")"
  grep -q '^ditto-train: warning: --bucket-cap-mb: sizes --trainer ddp.s gradient buckets; DataParallel (--trainer dp) has none, so it does nothing in this run$' "$work/err" || fail "$(cat "$work/err")"
  "$train" --epochs 1 --bucket-cap-mb 8 --trainer ddp > /dev/null 2> "$work/err" || fail "$(cat "$work/err")"
  [ -s "$work/err" ] && fail "a warning for ddp's own option: $(cat "$work/err")"
  "$train" --epochs 1 --micro-shards 8 --determinism fast > /dev/null 2> "$work/err" || fail "$(cat "$work/err")"
  grep -q '^ditto-train: warning: --micro-shards: splits the batch in --determinism bitwise only' "$work/err" || fail "$(cat "$work/err")"
  "$train" --epochs 1 --micro-shards 8 > /dev/null 2> "$work/err" || fail "$(cat "$work/err")"
  [ -s "$work/err" ] && fail "a warning for bitwise mode's own option: $(cat "$work/err")"
  "$train" --epochs 1 --devices 3 > /dev/null 2> "$work/err" || fail "$(cat "$work/err")"
  grep -q '^ditto-train: warning: --devices: 3 devices, not a power of two: the params_checksum is the same from run to run but differs from the one every power-of-two device count' "$work/err" || fail "$(cat "$work/err")"
  "$train" --epochs 1 --devices 4 > /dev/null 2> "$work/err" || fail "$(cat "$work/err")"
  [ -s "$work/err" ] && fail "a warning for 4 devices: $(cat "$work/err")"
  expect_usage "--nodes: the nodes are the cost model's cluster .*expected --profile \\(or --trace\\) with it, got neither \\(without them --nodes 3 would only train on 3 x 4 = 12 devices; --devices 12 does that\\)$" --nodes 3 --epochs 1
  "$train" --epochs 1 --nodes 3 --trainer ddp --profile h100-sxm > /dev/null 2> "$work/err" || fail "$(cat "$work/err")"
  grep -q '^ditto-train: warning: --devices x --nodes: 12 devices, not a power of two' "$work/err" || fail "$(cat "$work/err")"
  ;;
*) fail "unknown section '$section'" ;;
esac
echo PASS
