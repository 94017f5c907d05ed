#!/usr/bin/env bash
# Debian packages the test suite uses: real servers and tools, not mocks.
#   prometheus (+ promtool): a real Prometheus scrapes the collector; alert rules are checked.
#   chromium: Playwright drives Debian's browser against `kvtier dashboard` (no browser download).
#   a Java runtime (17): Spark (pyspark, local mode) reads the Parquet segments.
# Installs what is missing when run as root with apt-get; otherwise says which tests will skip.
set -euo pipefail
packages=()
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || packages+=(prometheus)
[ -x /usr/bin/chromium ] || packages+=(chromium)
command -v java >/dev/null 2>&1 || packages+=(openjdk-17-jre-headless)
[ ${#packages[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
else
  echo "note: missing Debian packages ${packages[*]}; the tests that need them will be skipped" >&2
fi
