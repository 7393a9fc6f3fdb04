#!/usr/bin/env bash
# Runs each fuzz target for a chosen time, seeded from tests/fixtures; fails (exit 1) on the first
# target that crashes, printing libFuzzer's report and the crashing input (base64).
#   fuzz/run.sh [seconds-per-target] [target...]     (default: 600 s; mutate validate convert)
# Needs cargo-fuzz (`cargo install cargo-fuzz`; .ci/run installs it under target/tools). The
# stable toolchain is enough: RUSTC_BOOTSTRAP lets it take the sanitizer flags cargo-fuzz passes.
set -euo pipefail
cd "$(dirname "$0")"
command -v cargo-fuzz >/dev/null 2>&1 || {
  echo "fuzz/run.sh: cargo-fuzz is not installed (cargo install cargo-fuzz --locked)" >&2
  exit 2
}
secs=${1:-600}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(mutate validate convert)
for t in "${targets[@]}"; do
  corpus=corpus/$t
  mkdir -p "$corpus" "artifacts/$t"
  for f in ../tests/fixtures/*.json; do
    case "$(basename "$f")" in
      expectations.json) ;;
      convert-*|malformed-admission-to-convert*) [[ $t == convert ]] && cp "$f" "$corpus/" ;;
      *) [[ $t != convert ]] && cp "$f" "$corpus/" ;;
    esac
  done
  echo "== fuzzing $t for ${secs}s"
  log=fuzz-$t.log
  status=0
  # Built under the project's target/ (cached with everything else). No sanitizer: the crate
  # forbids unsafe code, so AddressSanitizer would only watch its dependencies' unsafe blocks,
  # at the cost of a slower build and slower runs; a panic or a failed assertion is what these
  # targets look for, and libFuzzer catches those without it.
  # The lib is built without its default features (fuzz/Cargo.toml): the decisions and the
  # reviews' codec alone, 78 crates instead of ~270 (the cold build 175 s instead of 628 s).
  RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none --target-dir ../target/fuzz "$t" "$corpus" -- \
    -max_total_time="$secs" -max_len=65536 -print_final_stats=1 >"$log" 2>&1 || status=$?
  if [[ $status -ne 0 ]]; then
    echo "fuzz target $t FAILED (cargo fuzz exit $status); the end of $log:" >&2
    tail -n 60 "$log" >&2
    for a in "artifacts/$t"/*; do
      [[ -f $a ]] || continue
      echo "crashing input $a (base64):" >&2
      base64 "$a" >&2
    done
    exit 1
  fi
  execs=$(grep -oE "stat::number_of_executed_units: [0-9]+" "$log" | tail -1 | grep -oE "[0-9]+$" || true)
  if [[ -z $execs ]]; then
    echo "fuzz target $t: no execution count in $log (did libFuzzer run?)" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  echo "$t: $execs executions in ${secs}s, no crash"
done
