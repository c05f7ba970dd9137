-- A minimal verwalter scheduler: every role found under runtime/ runs on this node, at its newest
-- version. The state argument and the returned schedule are described in docs/scheduler.md.
local json = require "lib/json"
local versions = require "lib/versions"

local function scheduler(state)
    local host = state.current_host
    local schedule = {
        vars = {cluster = "demo", template = "minimal/v1"},
        roles = {},
        nodes = {[host] = {roles = {}}},
    }
    local log = {}
    local names = {}
    for role in pairs(state.runtime) do names[#names + 1] = role end
    table.sort(names)
    for _, role in ipairs(names) do
        local available = state.runtime[role]
        local newest = versions.newest(available)
        if newest == nil then
            log[#log + 1] = role .. ": no versions, skipped"
        else
            local meta = available[newest]
            schedule.roles[role] = {version = newest, versions = versions.sorted(available)}
            schedule.nodes[host].roles[role] = {instances = meta.instances or 1}
            log[#log + 1] = string.format("%s: %s x%d on %s", role, newest, meta.instances or 1, host)
        end
    end
    return json.encode(schedule), table.concat(log, "\n")
end

return {scheduler = scheduler}
