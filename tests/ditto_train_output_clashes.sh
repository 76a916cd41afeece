#!/usr/bin/env bash
# ditto-train's outputs never overwrite the run's own inputs, each other, or a checkpoint, and
# never replace a read-only file (io::check_outputs_are_not_inputs, core/io/file.h), on the token
# fixtures of tests/data/gpt2_tiny with --init-from its llm.c model. Each case must be refused at
# the start (exit 2, "ditto-train: error: OPTION: expected ...", before any training) with the
# file it names left as it was (same bytes, same mode):
#   1. --export / --metrics-jsonl / --trace onto a file the run reads: the validation shard found
#      beside --data, an explicit --val-data file, the 2nd file of a --data list, a member of a
#      --data glob, the --init-from file; by identity (a hard link, a symbolic link, ./x);
#   2. two outputs on one file (--export with --trace, --export with --metrics-jsonl);
#   3. --export into the --checkpoint directory, the --resume directory or an --init-from
#      checkpoint directory (as --trace and --metrics-jsonl already were);
#   4. an existing read-only (0444) file given to --trace or --metrics-jsonl (as --export), as
#      this user and, when run as root, as the user nobody.
# Each case prints its command, exit status and error line, and "FAIL: ..." when it is not
# refused as above (the script goes on); "PASS" at the end when none failed.
# Usage: ditto_train_output_clashes.sh PATH/TO/ditto-train FIXTURE_DIR WORK_DIR
fixtures=$(realpath "$2")
set -- "$(realpath "$1")" "$3"
source "$(dirname "$0")/ditto_train_common.sh"  # train, work
cd "$work" || exit 1
failed=0
bad() {
  echo "FAIL: $*"
  failed=1
}
G=(--model gpt --max-iters 1 --eval-iters 1 --devices 1 --sample 0 --log-interval 0)
reset() {
  rm -rf -- * .[!.]* 2> /dev/null
  cp "$fixtures/model_f32.bin" m.bin
  cp "$fixtures/tiny_train_000001.bin" x_train_000001.bin
  cp "$fixtures/tiny_train_000001.bin" x_train_000002.bin
  cp "$fixtures/tiny_val_000000.bin" x_val_000000.bin
  cp "$fixtures/tiny_val_000000.bin" v.bin
  mkdir -p keep && cp m.bin x_*.bin v.bin keep/
}
# refused VICTIM MESSAGE ARGS...: ditto-train ARGS exits 2 with MESSAGE before training, and
# VICTIM keeps its bytes (those of keep/VICTIM, or KEEP=FILE's) and its mode (MODE=... when set).
refused() {
  local victim=$1 msg=$2 rc=0
  shift 2
  local keep=${KEEP:-keep/$(basename "$victim")} mode
  mode=$(stat -c %a "$victim")
  "$@" > out.txt 2>&1 || rc=$?
  local what="${*:2}"
  what=${what/"${G[*]} "/}
  echo "$what -> exit $rc: $(grep -m1 error out.txt | cut -c1-200)"
  [ $rc = 2 ] || bad "$what: expected exit 2 at the start, got $rc: $(grep -m1 error out.txt)"
  grep -qF -- "ditto-train: error: $msg" out.txt || bad "$what: expected '$msg', got: $(head -c 300 out.txt)"
  grep -qE '^(step|iter) ' out.txt && bad "$what: trained before refusing"
  cmp -s "$victim" "$keep" || bad "$what: $victim was overwritten ($(stat -c %s "$victim") bytes)"
  [ "$(stat -c %a "$victim")" = "$mode" ] || bad "$what: $victim's mode $mode is now $(stat -c %a "$victim")"
  return 0
}
D=(--init-from m.bin --data x_train_000001.bin)
other() { echo "expected a file other than $1 '$3', got '$2', which it would overwrite"; }
# The validation shard found beside --data (no --val-data given: session 56, B3 named it so).
beside='--data (validation file found beside it)'

# 1. Outputs onto the run's inputs.
reset
refused x_val_000000.bin "--export llmc: $(other "$beside" x_val_000000.bin x_val_000000.bin)" \
  "$train" "${G[@]}" "${D[@]}" --export llmc x_val_000000.bin
reset
refused v.bin "--export hf: $(other --val-data v.bin v.bin)" \
  "$train" "${G[@]}" "${D[@]}" --val-data v.bin --export hf v.bin
reset
refused x_train_000002.bin "--export llmc: $(other --data x_train_000002.bin x_train_000002.bin)" \
  "$train" "${G[@]}" --init-from m.bin --data x_train_000001.bin,x_train_000002.bin \
  --export llmc x_train_000002.bin
reset
refused x_train_000002.bin "--export llmc: $(other --data x_train_000002.bin x_train_000002.bin)" \
  "$train" "${G[@]}" --init-from m.bin --data 'x_train_*.bin' --export llmc x_train_000002.bin
reset
refused x_val_000000.bin "--metrics-jsonl: $(other "$beside" x_val_000000.bin x_val_000000.bin)" \
  "$train" "${G[@]}" "${D[@]}" --metrics-jsonl x_val_000000.bin
reset
refused x_train_000002.bin "--metrics-jsonl: $(other --data x_train_000002.bin x_train_000002.bin)" \
  "$train" "${G[@]}" --init-from m.bin --data x_train_000001.bin,x_train_000002.bin \
  --metrics-jsonl x_train_000002.bin
reset
refused x_val_000000.bin "--trace: $(other "$beside" x_val_000000.bin x_val_000000.bin)" \
  "$train" "${G[@]}" "${D[@]}" --trace x_val_000000.bin
reset
refused m.bin "--metrics-jsonl: $(other --init-from m.bin m.bin)" \
  "$train" "${G[@]}" "${D[@]}" --metrics-jsonl m.bin
reset
refused m.bin "--trace: $(other --init-from m.bin m.bin)" "$train" "${G[@]}" "${D[@]}" --trace m.bin
# By identity: a hard link to the validation shard, a symbolic link to a --data list's file,
# ./x for x.
reset
ln x_val_000000.bin hard.bin
KEEP=keep/x_val_000000.bin refused x_val_000000.bin \
  "--export llmc: $(other "$beside" hard.bin x_val_000000.bin)" \
  "$train" "${G[@]}" "${D[@]}" --export llmc hard.bin
reset
ln -s x_train_000002.bin sym.bin
refused x_train_000002.bin "--metrics-jsonl: $(other --data sym.bin x_train_000002.bin)" \
  "$train" "${G[@]}" --init-from m.bin --data x_train_000001.bin,x_train_000002.bin \
  --metrics-jsonl sym.bin
reset
refused x_val_000000.bin "--trace: $(other "$beside" ./x_val_000000.bin x_val_000000.bin)" \
  "$train" "${G[@]}" "${D[@]}" --trace ./x_val_000000.bin

# 2. Two outputs on one file.
reset
printf 'keep' > same.out
cp same.out keep/
refused same.out "--trace: $(other '--export hf' same.out same.out)" \
  "$train" "${G[@]}" "${D[@]}" --export hf same.out --trace same.out
refused same.out "--metrics-jsonl: $(other '--export llmc' same.out same.out)" \
  "$train" "${G[@]}" "${D[@]}" --export llmc same.out --metrics-jsonl same.out
# ... and through a dangling symbolic link to the other's file, which neither has made yet
# (what the write reaches: io::resolve_links; before, the link's own path was compared, so both
# wrote new.out, the --trace over the export).
reset
ln -s new.out dangling.out
rc=0
"$train" "${G[@]}" "${D[@]}" --export hf new.out --trace dangling.out > out.txt 2>&1 || rc=$?
echo "--export hf new.out --trace dangling.out (-> new.out) -> exit $rc: $(grep -m1 error out.txt | cut -c1-200)"
[ $rc = 2 ] || bad "a dangling link to another output: expected exit 2, got $rc: $(head -c 300 out.txt)"
grep -qF -- "ditto-train: error: --trace: $(other '--export hf' dangling.out new.out)" out.txt ||
  bad "a dangling link to another output: $(head -c 300 out.txt)"
[ -e new.out ] && bad "a dangling link to another output: new.out was written"

# 3. --export into a checkpoint directory: the one written, the one resumed from, --init-from's.
reset
"$train" "${G[@]}" "${D[@]}" --checkpoint ck > out.txt 2>&1 || bad "the checkpoint run: $(cat out.txt)"
step=ck/step-00000001/model.safetensors
if [ -f "$step" ]; then
  cp "$step" keep/model.safetensors
  cp ck/latest keep/latest
  refused "$step" "--export hf: expected a file outside the --checkpoint directory 'ck', got '$step'" \
    "$train" "${G[@]}" --max-iters 2 "${D[@]}" --resume ck --checkpoint ck --export hf "$step"
  refused ck/latest "--export llmc: expected a file outside the --resume directory 'ck', got 'ck/latest'" \
    "$train" "${G[@]}" --max-iters 2 "${D[@]}" --resume ck --export llmc ck/latest
  refused "$step" "--export hf: expected a file outside the --init-from directory 'ck', got '$step'" \
    "$train" "${G[@]}" --init-from ck --data x_train_000001.bin --export hf "$step"
else
  bad "the checkpoint run wrote no $step: $(cat out.txt)"
fi

# 4. Read-only files, left as they are (as --export does).
ro_case() {  # WHO "OPTION [FORMAT]"
  local who=$1 opt=$2
  reset
  printf 'keep' > ro.txt
  cp ro.txt keep/
  chmod 444 ro.txt
  local run=()
  if [ "$who" = nobody ]; then
    chmod 777 . && chmod a+r ./* && run=(runuser -u nobody --)
  fi
  # shellcheck disable=SC2086  # $opt: the option and its format
  refused ro.txt "$opt: expected a file it may replace, got 'ro.txt': Permission denied / read-only: remove it or chmod u+w" \
    "${run[@]}" "$train" "${G[@]}" "${D[@]}" $opt ro.txt
}
for opt in "--trace" "--metrics-jsonl" "--export llmc"; do
  ro_case "$(id -un)" "$opt"
done
if [ "$(id -u)" = 0 ] && command -v runuser > /dev/null &&
  runuser -u nobody -- test -x "$train" 2> /dev/null; then
  for opt in "--trace" "--metrics-jsonl"; do ro_case nobody "$opt"; done
fi

[ $failed = 0 ] && echo PASS
exit $failed
