#!/usr/bin/env bash
# tools/gpu-check.sh's dry_profile_of: the speed section's dry run prices the card nvidia-smi
# names (an H100 was priced as an H200 before: its HBM is 3.35 TB/s, not 4.8), taken from the
# script itself (sed). Usage: gpu_check_profile.sh PATH/TO/tools/gpu-check.sh
set -u
eval "$(sed -n '/^dry_profile_of() {/,/^}/p' "$1")"
type dry_profile_of >/dev/null 2>&1 || { echo "FAIL: no dry_profile_of in $1"; exit 1; }
bad=0
check() {  # check NVIDIA-SMI-NAME EXPECTED-FIRST-WORD
  local got; got="$(dry_profile_of "$1")"
  if [ "${got%% *}" != "$2" ]; then echo "FAIL: '$1': expected $2, got '$got'"; bad=1; fi
}
check "NVIDIA H100 80GB HBM3" h100-sxm
check "NVIDIA H100 PCIe" h100-sxm
check "NVIDIA H200" h200
check "NVIDIA H200 NVL" h200
check "NVIDIA A100-SXM4-80GB" a100-sxm-80gb
check "NVIDIA A100-SXM4-40GB" a100-sxm-40gb
check "NVIDIA L4" h200
# A profile that is only the nearest one says so.
case "$(dry_profile_of "NVIDIA H100 PCIe")" in *nearest*) ;; *) echo "FAIL: PCIe: no note"; bad=1 ;; esac
case "$(dry_profile_of "NVIDIA H100 80GB HBM3")" in *nearest*) echo "FAIL: SXM: a note"; bad=1 ;; esac
[ $bad -eq 0 ] && echo PASS
