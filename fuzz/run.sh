#!/usr/bin/env bash
# Runs each fuzz target for a chosen time, seeded from tests/fixtures.
#   fuzz/run.sh [seconds-per-target] [target...]     (default: 600 s; mutate validate convert)
# Needs cargo-fuzz (`cargo install cargo-fuzz`). The stable toolchain is enough:
# RUSTC_BOOTSTRAP lets it take the sanitizer flags cargo-fuzz passes.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-600}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(mutate validate convert)
for t in "${targets[@]}"; do
  corpus=corpus/$t
  mkdir -p "$corpus"
  for f in ../tests/fixtures/*.json; do
    case "$(basename "$f")" in
      expectations.json) ;;
      convert-*|malformed-admission-to-convert*) [[ $t == convert ]] && cp "$f" "$corpus/" ;;
      *) [[ $t != convert ]] && cp "$f" "$corpus/" ;;
    esac
  done
  echo "== fuzzing $t for ${secs}s"
  RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "$corpus" -- -max_total_time="$secs" -max_len=65536 2>&1 | tee "fuzz-$t.log" | grep -E "^(#[0-9]+\s+DONE|==[0-9]+==|SUMMARY|Done)" || true
  grep -E "stat::number_of_executed_units|DONE" "fuzz-$t.log" | tail -2
done
