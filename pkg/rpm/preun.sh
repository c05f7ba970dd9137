# $1: 0 when the package goes (not on an upgrade). As %systemd_preun.
if [ "$1" -eq 0 ] && command -v systemctl >/dev/null 2>&1; then
    systemctl --no-reload disable --now verwalter.service >/dev/null 2>&1 || :
fi
