#!/usr/bin/env bash
# Installs what the chat page's browser test needs (tests/e2e/test_chat_page.py): Debian's chromium and
# chromium-driver (headless; Selenium drives them from the test extra). Nothing is fetched from a browser vendor's
# CDN: both come from Debian's archive. Safe to run again: it only installs what is missing.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "setup_browser.sh: no apt-get here; install Chromium and its chromedriver yourself to run the chat page's test" >&2
  exit 0
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
       chromium chromium-driver >/dev/null; }; then
  echo "setup_browser.sh: could not install chromium and chromium-driver; the chat page's browser test will fail under CI" >&2
fi
