#!/usr/bin/env bash
# The installed package is the public API and nothing else: four headers under include/ckcheck,
# and link interfaces that bring neither the fixture models nor RapidCheck.
# Usage: check_installed.sh PREFIX
set -euo pipefail
prefix=$1
expected=$'ckcheck/checkpoint.h\nckcheck/model.h\nckcheck/testing.h\nckcheck/version.h'
actual=$(cd "$prefix/include" && find . -type f | sed 's|^\./||' | sort)
if [[ "$actual" != "$expected" ]]; then
  echo "installed headers differ from the public API:"
  diff <(echo "$expected") <(echo "$actual") || true
  exit 1
fi
cmake_dir=$(dirname "$(find "$prefix" -name ckcheckConfig.cmake | head -1)")
if grep -l -E "fixtures|rapidcheck|validate_op|cli_lib" "$cmake_dir"/*.cmake; then
  echo "the exported targets above name fixtures, RapidCheck, validate-op or the CLI"
  exit 1
fi
for lib in "$prefix"/lib*/libckcheck_*.a; do
  case "$(basename "$lib")" in
    libckcheck_fixtures.a|libckcheck_validate_op.a|libckcheck_cli_lib.a) echo "installed: $lib"; exit 1 ;;
  esac
done
echo "installed: $(echo "$actual" | tr '\n' ' ')"
