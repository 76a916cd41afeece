#!/usr/bin/env bash
# ditto-train --trainer ddp with checkpoints (registered in tests/cmake/train_ddp.cmake); bitwise mode,
# so every run below must print the params_checksum of an uninterrupted --trainer dp --epochs 4:
#   1. ddp --epochs 2 --checkpoint A, then ddp --resume A --epochs 4 (all ranks resume from A);
#   2. ddp --epochs 2 --checkpoint-every 7 into B, the last checkpoint (step 46) removed, so ddp
#      --resume B falls back to step 42, mid-epoch 2: the epoch's loss (summed over the ranks in
#      the checkpoint) and the checksum are those of the uninterrupted ddp run;
#   3. --trainer dp resumes from ddp's checkpoint A, and ddp from dp's checkpoint C.
# Usage: ditto_train_ddp_checkpoint.sh PATH/TO/ditto-train WORK_DIR
source "$(dirname "$0")/ditto_train_common.sh"  # train, work, fail, checksum

U=$("$train" --trainer dp --epochs 4 | checksum)
[ -n "$U" ] || fail "no checksum from the uninterrupted dp run"
echo "uninterrupted dp --epochs 4: $U"
D=$("$train" --trainer ddp --epochs 4 | tee "$work/ddp.out" | checksum)
[ "$D" = "$U" ] || fail "uninterrupted ddp $D != dp $U"

"$train" --trainer ddp --epochs 2 --checkpoint "$work/a" > /dev/null || fail "ddp --checkpoint"
[ -f "$work/a/step-00000046/model.safetensors" ] || fail "ddp saved no checkpoint at step 46"
R=$("$train" --trainer ddp --resume "$work/a" --epochs 4 | checksum)
echo "ddp --epochs 2, then ddp --resume --epochs 4: $R"
[ "$R" = "$U" ] || fail "ddp resumed $R != uninterrupted $U"

"$train" --trainer ddp --epochs 2 --checkpoint "$work/b" --checkpoint-every 7 > /dev/null \
  || fail "ddp --checkpoint-every 7"
rm -rf "$work/b/step-00000046"
out=$("$train" --trainer ddp --resume "$work/b" --epochs 4 2> "$work/stderr")
echo "$out" | grep -q "resumed from $work/b at step 42 (epoch 2, batch 19)" || fail "$out"
M=$(echo "$out" | checksum)
echo "ddp resumed mid-epoch from step 42: $M"
[ "$M" = "$U" ] || fail "ddp resumed mid-epoch $M != uninterrupted $U"
want=$(grep '^epoch   2 ' "$work/ddp.out" | cut -d' ' -f1-8)
got=$(echo "$out" | grep '^epoch   2 ' | cut -d' ' -f1-8)
[ -n "$want" ] && [ "$got" = "$want" ] || fail "epoch 2 after the mid-epoch resume: '$got', uninterrupted: '$want'"
[ "$(grep -c 'falling back' "$work/stderr")" = 1 ] || fail "stderr: $(cat "$work/stderr")"

X=$("$train" --trainer dp --resume "$work/a" --epochs 4 | checksum)
[ "$X" = "$U" ] || fail "dp resumed from ddp's checkpoint: $X != $U"
"$train" --trainer dp --epochs 2 --checkpoint "$work/c" > /dev/null || fail "dp --checkpoint"
Y=$("$train" --trainer ddp --resume "$work/c" --epochs 4 --devices 2 | checksum)
[ "$Y" = "$U" ] || fail "ddp (2 ranks) resumed from dp's checkpoint: $Y != $U"
echo "PASS"
