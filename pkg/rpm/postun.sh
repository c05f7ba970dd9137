# $1: 1 and more after an upgrade. As %systemd_postun_with_restart: a running daemon restarts
# on the new binary.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ "$1" -ge 1 ]; then
        systemctl try-restart verwalter.service >/dev/null 2>&1 || :
    fi
fi
