-- A scheduler that leaves the bin packing to the placement library (docs/placement.md, "Lua
-- API"): every role's instances go on the machines listed in runtime/nodes.yaml, one instance of
-- a role per machine at most, chosen by wca's LeastUsedBAR on cpu and memory. Instances stay
-- where the last schedule put them while their machine is still listed; only the missing ones
-- are placed.
--
-- runtime/nodes.yaml gives each machine's capacity; runtime/roles/<role>/<version>.yaml gives a
-- role's instances and what one instance needs (cpu, mem). A real cluster would keep only the
-- machines that are up (this node and `state.peers`); this example places on every machine
-- listed, so that it shows a placement offline:
--   verwalter schedule --config-dir examples/placement --hostname alpha

local function newest(versions)
    local best, best_n
    for v in pairs(versions) do
        local n = tonumber(v:match("^v(%d+)"))
        if n and (best_n == nil or n > best_n) then best, best_n = v, n end
    end
    return best
end

local function sorted_keys(t)
    local keys = {}
    for k in pairs(t) do keys[#keys + 1] = k end
    table.sort(keys)
    return keys
end

local function scheduler(state)
    local nodes = state.runtime.nodes or {}
    local available = state.runtime.roles or {}
    local parent = state.parents[1] or {}
    local names = sorted_keys(available)

    -- What each role runs and what one instance needs.
    local roles, apps = {}, {}
    for _, role in ipairs(names) do
        local version = newest(available[role])
        local meta = available[role][version]
        roles[role] = {version = version, image = meta.image, instances = meta.instances or 1}
        apps[role] = {cpu = meta.cpu, mem = meta.mem}
    end

    -- Keep what the last schedule placed, on machines still listed, up to each role's count.
    local running, have = {}, {}
    local last = parent.nodes or {}
    for _, host in ipairs(sorted_keys(last)) do
        for _, role in ipairs(sorted_keys(last[host].roles or {})) do
            if nodes[host] and roles[role] and (have[role] or 0) < roles[role].instances then
                running[host] = running[host] or {}
                running[host][role] = 1
                have[role] = (have[role] or 0) + 1
            end
        end
    end

    -- Place the missing instances, role by role in name order, each counted before the next.
    local wanted = {}
    for _, role in ipairs(names) do
        local missing = roles[role].instances - (have[role] or 0)
        if missing > 0 then wanted[#wanted + 1] = {app = role, count = missing} end
    end
    local result = placement.place{
        algorithm = {kind = "LeastUsedBAR", dimensions = {"cpu", "mem"}},
        nodes = nodes,
        apps = apps,
        running = running,
        instances = wanted,
        max_per_node = 1,
    }

    -- The schedule: kept and new instances together.
    local schedule = {vars = {template = "placement/v1"}, roles = {}, nodes = {}}
    local on = {}
    for _, where in ipairs({running, result.placed}) do
        for host, placed in pairs(where) do
            for role in pairs(placed) do
                local r = roles[role]
                schedule.nodes[host] = schedule.nodes[host] or {roles = {}}
                schedule.nodes[host].roles[role] = {version = r.version, image = r.image}
                on[role] = on[role] or {}
                on[role][#on[role] + 1] = host
            end
        end
    end
    local log = {}
    for _, role in ipairs(names) do
        local r = roles[role]
        schedule.roles[role] = {version = r.version, instances = r.instances}
        local hosts = on[role] or {}
        table.sort(hosts)
        log[#log + 1] = string.format("%s: %s on %s", role, r.version,
            #hosts > 0 and table.concat(hosts, ", ") or "no machine")
        local missing = result.unplaced[role]
        if missing then
            log[#log + 1] = string.format("  %d instance(s) not placed:", missing)
            local why = result.failed[role]
            for _, host in ipairs(sorted_keys(why)) do
                log[#log + 1] = string.format("    %s: %s", host, why[host])
            end
        end
    end
    return schedule, table.concat(log, "\n")
end

return {scheduler = scheduler}
