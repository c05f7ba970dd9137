# The settings file moved out of the config dir in 0.14.1, from /etc/verwalter/settings.yaml
# (where a deploy of the config dir with `rsync --delete` or a checkout deletes it) to
# /etc/verwalter.d/settings.yaml. When the earlier package went, rpm kept an edited settings file
# as /etc/verwalter/settings.yaml.rpmsave: it becomes the settings in force, the packaged file
# is kept beside it as settings.yaml.rpmnew.
old=/etc/verwalter/settings.yaml.rpmsave
new=/etc/verwalter.d/settings.yaml
if [ -f "$old" ] && [ ! -L "$old" ]; then
    mv -f "$new" "$new.rpmnew" 2>/dev/null || :
    mv -f "$old" "$new" &&
        echo "verwalter: moved your settings $old to $new (the packaged file is $new.rpmnew)"
    # The earlier package's removal restarted the daemon before the move: again, on them.
    if [ -d /run/systemd/system ]; then
        systemctl try-restart verwalter.service >/dev/null 2>&1 || :
    fi
fi
if ! grep -qs '^[[:space:]]*token-file:' "$new"; then
    echo "verwalter: WARNING: $new names no http.token-file: anyone who reaches the port can press buttons and post actions. Add it (see /usr/share/doc/verwalter/packaging.md)." >&2
fi
:
