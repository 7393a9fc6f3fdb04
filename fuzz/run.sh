#!/usr/bin/env bash
# Runs each fuzz target for a chosen time, seeded from tests/fixtures; fails (exit 1) when a
# target crashes, printing libFuzzer's report and the crashing input (base64).
#   fuzz/run.sh [seconds-per-target] [target...]     (default: 600 s; mutate validate convert)
#   fuzz/run.sh --build-only [target...]             (builds them and stops; .ci/run does this
#                                                      in the background while the tests run)
# The targets are built once, then run side by side, as many at a time as the machine has
# cores (FUZZ_JOBS overrides): each libFuzzer process is single-threaded, so each target still
# gets a whole core for its time, and on 2 cores the three take 2 x secs instead of 3 x secs.
# Needs cargo-fuzz (`cargo install cargo-fuzz`; .ci/run installs it under target/tools). The
# stable toolchain is enough: RUSTC_BOOTSTRAP lets it take the sanitizer flags cargo-fuzz passes.
set -euo pipefail
cd "$(dirname "$0")"
command -v cargo-fuzz >/dev/null 2>&1 || {
  echo "fuzz/run.sh: cargo-fuzz is not installed (cargo install cargo-fuzz --locked)" >&2
  exit 2
}
build_only=0
if [[ ${1:-} == --build-only ]]; then
  build_only=1
  shift
  secs=0
else
  secs=${1:-600}
  shift || true
fi
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(mutate validate convert)
jobs=${FUZZ_JOBS:-$(nproc)}
[[ $jobs -ge 1 ]] || jobs=1

# Built under the project's target/ (cached with everything else). No sanitizer: the crate
# forbids unsafe code, so AddressSanitizer would only watch its dependencies' unsafe blocks,
# at the cost of a slower build and slower runs; a panic or a failed assertion is what these
# targets look for, and libFuzzer catches those without it.
# The lib is built without its default features (fuzz/Cargo.toml): the decisions and the
# reviews' codec alone, 78 crates instead of ~270 (the cold build 175 s instead of 628 s).
echo "== building the fuzz targets (${targets[*]})"
for t in "${targets[@]}"; do
  RUSTC_BOOTSTRAP=1 cargo fuzz build --sanitizer none --target-dir ../target/fuzz "$t"
done
[[ $build_only == 0 ]] || exit 0

# One target: seed its corpus, fuzz it for $secs, and leave its exit status in status-$t.
fuzz_one() {
  local t=$1 corpus=corpus/$1 status=0
  mkdir -p "$corpus" "artifacts/$t"
  for f in ../tests/fixtures/*.json; do
    case "$(basename "$f")" in
      expectations.json) ;;
      convert-*|malformed-admission-to-convert*) [[ $t == convert ]] && cp "$f" "$corpus/" ;;
      *) [[ $t != convert ]] && cp "$f" "$corpus/" ;;
    esac
  done
  RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none --target-dir ../target/fuzz "$t" "$corpus" -- \
    -max_total_time="$secs" -max_len=65536 -print_final_stats=1 >"fuzz-$t.log" 2>&1 || status=$?
  echo "$status" >"status-$t"
}

# Side by side, at most $jobs at a time, in the order given.
running=0
for t in "${targets[@]}"; do
  echo "== fuzzing $t for ${secs}s"
  rm -f "status-$t"
  fuzz_one "$t" &
  running=$((running + 1))
  if [[ $running -ge $jobs ]]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

failed=0
for t in "${targets[@]}"; do
  log=fuzz-$t.log
  status=$(cat "status-$t" 2>/dev/null || echo "none")
  rm -f "status-$t"
  if [[ $status != 0 ]]; then
    echo "fuzz target $t FAILED (cargo fuzz exit $status); the end of $log:" >&2
    tail -n 60 "$log" >&2
    for a in "artifacts/$t"/*; do
      [[ -f $a ]] || continue
      echo "crashing input $a (base64):" >&2
      base64 "$a" >&2
    done
    failed=1
    continue
  fi
  execs=$(grep -oE "stat::number_of_executed_units: [0-9]+" "$log" | tail -1 | grep -oE "[0-9]+$" || true)
  if [[ -z $execs ]]; then
    echo "fuzz target $t: no execution count in $log (did libFuzzer run?)" >&2
    tail -n 30 "$log" >&2
    failed=1
    continue
  fi
  echo "$t: $execs executions in ${secs}s, no crash"
done
exit "$failed"
