#!/usr/bin/env bash
# The README's embedding example is examples/quickstart.c, which make test builds and runs:
# fail when the two drift apart.
set -eu
cd "$(dirname "$0")/.."
diff <(awk '/^```c$/{on=1; next} /^```$/{on=0} on' README.md) examples/quickstart.c >/dev/null ||
  { echo "readme_check: README.md's C example differs from examples/quickstart.c"; exit 1; }
echo "readme_check: ok"
