-- The scheduler of examples/wasm-query: every role of runtime/ runs on every node at its newest
-- version. It sets variables at all four levels of the schedule (`vars`, `roles.<role>`,
-- `nodes.<host>.vars`, `nodes.<host>.roles.<role>`), so that what `query.wasm` derives from them,
-- and how the levels override each other, shows in the rendered files.

-- The newest version key (`v<N>`, by N).
local function newest(versions)
    local best, best_n = nil, -1
    for key in pairs(versions) do
        local n = tonumber(key:match("^v(%d+)"))
        if n ~= nil and n > best_n then best, best_n = key, n end
    end
    return best
end

local function scheduler(state)
    local hosts = {state.current_host}
    for _, peer in pairs(state.peers) do
        if peer.hostname ~= nil then hosts[#hosts + 1] = peer.hostname end
    end
    table.sort(hosts)

    local roles, names, log = {}, {}, {}
    for role, versions in pairs(state.runtime) do
        local version = newest(versions)
        if version ~= nil then
            local meta = versions[version]
            -- `port`, `limits` and `log` only where the role's metadata has them: `port` falls
            -- back to the cluster's (`vars.port`), `log` is merged into the cluster's.
            roles[role] = {version = version, image = meta.image, port = meta.port,
                           limits = meta.limits, log = meta.log}
            names[#names + 1] = role
        end
    end
    table.sort(names)
    -- A role only under `roles` supplies variables but is rendered nowhere.
    roles.retired = {version = "v0", image = "retired.v0"}

    local nodes = {}
    for index, host in ipairs(hosts) do
        local mine = {}
        for _, role in ipairs(names) do
            local meta = state.runtime[role][roles[role].version]
            -- This role on this node: its instances; `web` also gets a smaller CPU limit here
            -- (merged into the role's `limits`) and its own log format (merged into `log`).
            mine[role] = {instances = meta.instances or 1}
            if role == "web" then
                mine[role].limits = {cpu = 1}
                mine[role].log = {format = "json"}
            end
            log[#log + 1] = string.format("%s: %s on %s", role, roles[role].version, host)
        end
        -- Every role on this node logs at `debug`, whatever the role's own `log.level` says.
        nodes[host] = {
            vars = {zone = "zone-" .. index, log = {level = "debug"}},
            roles = mine,
        }
    end

    return {
        vars = {
            template = "svc/v1",
            cluster = "example",
            port = 80,
            log = {level = "info", format = "text"},
        },
        roles = roles,
        nodes = nodes,
    }, table.concat(log, "\n")
end

return {scheduler = scheduler}
