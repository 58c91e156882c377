#!/usr/bin/env bash
# Headless Chromium for the HTML page's browser tests (tests/test_explain_html.py, _browser.py), called by
# install-test-deps.sh (`make test`). Tested by tests/test_install_browser.py with a stand-in apt-get.
# CI runs as root on Debian: install it there, with a CJK font so that Chinese reports render as
# text, not boxes. Elsewhere nothing is installed and the tests skip.
set -euo pipefail
# What is installed: chromium, fonts-wqy-zenhei and dbus-x11, with their dependencies only
# (--no-install-recommends: no upower, avahi, cups, printer or notification services). dbus-x11 gives
# GTK's "a D-Bus session bus" dependency a provider that needs no systemd; otherwise apt picks
# dbus-user-session, which brings systemd. Nothing already installed is ever upgraded: the install is
# simulated first, and when it would upgrade a package (a dependency that needs a newer libc, libudev...),
# nothing is installed, the browser tests skip, and the command to run by hand is printed.
browser=(chromium fonts-wqy-zenhei dbus-x11)
if ! dpkg -s chromium fonts-wqy-zenhei >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    install=(apt-get install -y -qq --no-install-recommends --no-upgrade "${browser[@]}")
    # a simulated upgrade reads "Inst NAME [installed version] (new version ...)"
    if ! simulated=$(DEBIAN_FRONTEND=noninteractive "${install[@]}" --simulate 2>&1); then
        echo "install-browser: apt cannot install ${browser[*]} here; the browser tests will skip." >&2
        echo "$simulated" | tail -n 3 >&2
        exit 0
    fi
    upgrades=$(echo "$simulated" | awk '/^Inst [^ ]+ \[/ {print $2}')
    if [ -n "$upgrades" ]; then
        echo "install-browser: not installing ${browser[*]}: it would upgrade installed packages" \
             "($(echo $upgrades)); the browser tests will skip. To install it anyway: ${install[*]}" >&2
    else
        DEBIAN_FRONTEND=noninteractive "${install[@]}"
    fi
fi
