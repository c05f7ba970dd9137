# The storage and log dirs, when missing (an upgrade from verwalter 0.13 keeps its own): the
# schedule in force and its backups can carry secrets to templates; the deployment log is
# root's. (cargo-generate-rpm 0.21 cannot put empty directories in a package.)
[ -d /etc/verwalter ] || install -d -o root -g root -m 0755 /etc/verwalter
[ -d /var/lib/verwalter ] || install -d -o root -g root -m 0700 /var/lib/verwalter
[ -d /var/log/verwalter ] || install -d -o root -g root -m 0750 /var/log/verwalter
# The API token the packaged settings name: every request that changes something needs it.
# Made once, root's alone; never overwritten.
token=/etc/verwalter.d/api-token
if [ ! -e "$token" ] && [ ! -L "$token" ]; then
    (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$token.new" &&
        echo >> "$token.new" && mv "$token.new" "$token") &&
        echo "verwalter: made the API token for writes: $token (show it: sudo cat $token)"
fi
# A unit of the site's own (verwalter 0.13 shipped none; sites wrote theirs) overrides the
# packaged one silently.
unit=/etc/systemd/system/verwalter.service
if [ -L "$unit" ] && [ "$(readlink "$unit")" = /dev/null ]; then
    echo "verwalter: WARNING: verwalter.service is masked ($unit -> /dev/null): it will not start (systemctl unmask verwalter)." >&2
elif [ -e "$unit" ]; then
    echo "verwalter: WARNING: $unit overrides the packaged unit (/usr/lib/systemd/system/verwalter.service): systemd runs that one, with its own command line and settings. Remove it, and keep changes in a drop-in (systemctl edit verwalter); see /usr/share/doc/verwalter/packaging.md." >&2
fi
# $1: 1 on a first install, 2 and more on an upgrade. As %systemd_post: enable the unit if the
# system's presets say so; it is not started (`systemctl enable --now verwalter`).
if [ "$1" -eq 1 ] && command -v systemctl >/dev/null 2>&1; then
    systemctl --no-reload preset verwalter.service >/dev/null 2>&1 || :
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
