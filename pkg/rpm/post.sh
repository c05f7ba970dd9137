# The storage and log dirs, when missing (an upgrade from verwalter 0.13 keeps its own): the
# schedule in force and its backups can carry secrets to templates; the deployment log is
# root's. (cargo-generate-rpm 0.21 cannot put empty directories in a package.)
[ -d /var/lib/verwalter ] || install -d -o root -g root -m 0700 /var/lib/verwalter
[ -d /var/log/verwalter ] || install -d -o root -g root -m 0750 /var/log/verwalter
# $1: 1 on a first install, 2 and more on an upgrade. As %systemd_post: enable the unit if the
# system's presets say so; it is not started (`systemctl enable --now verwalter`).
if [ "$1" -eq 1 ] && command -v systemctl >/dev/null 2>&1; then
    systemctl --no-reload preset verwalter.service >/dev/null 2>&1 || :
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
