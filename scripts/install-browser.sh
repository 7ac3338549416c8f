#!/usr/bin/env bash
# A real headless browser for the dashboard test: Debian's `chromium` package (Playwright's
# own browser downloads are not reachable here). Does nothing when chromium is installed.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
as_root=()
if [ "$(id -u)" != 0 ]; then
  as_root=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq chromium >/dev/null
chromium --version
