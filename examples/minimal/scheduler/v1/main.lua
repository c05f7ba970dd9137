-- A minimal verwalter scheduler: every role found under runtime/ runs at its newest version
-- unless an operator pinned another one, with as many instances as its metadata asks unless an
-- operator scaled it. The instances are dealt out over the nodes one at a time, going on where
-- the previous role stopped: first to this node (the leader), then to `state.peers` in host name
-- order (so a new leader deals anew: a schedule of its own). Every node gets every role with its
-- share, so a node whose share is 0 renders that too (and stops what it ran before). Alone, a
-- node takes all instances. The state argument and the returned schedule are
-- described in docs/scheduler.md.
--
-- Operator buttons (docs/frontend.md): each role lists its `versions` (the frontend shows a
-- "Switch To" button for each; `frontend.kind = "version"` is what 0.13's frontend looked for)
-- and three `global_actions`; a press arrives in `state.actions` as
-- {button = {role, action, version?, data?}}. What operators chose is kept in the schedule's
-- `state` and read back from `state.parents[1]` on the next run, and each action is answered
-- through the schedule's `actions` (what /v1/wait_action returns). Only `parents[1]` is read: after
-- a split, the choices made on the other side are lost (docs/clustering.md, "What a scheduler must
-- do with parents", has a merge that keeps them).
local json = require "lib/json"
local versions = require "lib/versions"

local GLOBAL_ACTIONS = {
    {title = "Add instance", id = "scale", data = {delta = 1}},
    {title = "Remove instance", id = "scale", data = {delta = -1}},
    {title = "Follow newest", id = "unpin",
     confirm = "Go back to the newest version?"},
}

-- The version a role runs: the pinned one while it exists, else the newest.
local function in_force(choice, available)
    if choice.pinned ~= nil and available[choice.pinned] ~= nil then return choice.pinned end
    return versions.newest(available)
end

-- Applies one button press to `kept` (role -> {pinned, instances}); returns the answer.
local function apply_button(kept, available_roles, button)
    local role = button.role
    if type(role) ~= "string" or available_roles[role] == nil then
        return {error = "unknown role " .. tostring(role)}
    end
    local choice = kept[role] or {}
    kept[role] = choice
    if button.action == "quick_switch" then
        if available_roles[role][button.version] == nil then
            return {error = role .. " has no version " .. tostring(button.version)}
        end
        choice.pinned = button.version
        return {ok = role .. " pinned to " .. button.version}
    elseif button.action == "unpin" then
        choice.pinned = nil
        return {ok = role .. " follows the newest version"}
    elseif button.action == "scale" then
        local delta = math.tointeger(button.data and button.data.delta) or 0
        local available = available_roles[role]
        local meta = available[in_force(choice, available)] or {}
        local now = choice.instances or meta.instances or 1
        choice.instances = math.max(0, now + delta)
        return {ok = string.format("%s: %d instance(s)", role, choice.instances)}
    end
    return {error = "unknown action " .. tostring(button.action)}
end

-- The host names of this node, then of its peers in sorted order.
local function node_names(state)
    local names = {}
    local seen = {[state.current_host] = true}
    for _, peer in pairs(state.peers) do
        local name = peer.hostname
        if type(name) ~= "string" or name == "" then name = peer.name end
        if type(name) == "string" and name ~= "" and not seen[name] then
            seen[name] = true
            names[#names + 1] = name
        end
    end
    table.sort(names)
    table.insert(names, 1, state.current_host)
    return names
end

local function scheduler(state)
    local host = state.current_host
    local parent = state.parents[1] or {}
    local kept = type(parent.state) == "table" and parent.state or {}
    local nodes = node_names(state)
    local schedule = {
        vars = {cluster = "demo", template = "minimal/v1"},
        roles = {},
        nodes = {},
        state = kept,
        actions = {},
    }
    for _, name in ipairs(nodes) do schedule.nodes[name] = {roles = {}} end
    -- The node the next instance goes to (an index into `nodes`), across roles.
    local next_node = 1
    local changes = {}
    local log = {}

    local ids = {}
    for id in pairs(state.actions) do ids[#ids + 1] = id end
    table.sort(ids)
    for _, id in ipairs(ids) do
        local action = state.actions[id]
        local answer = type(action.button) == "table"
            and apply_button(kept, state.runtime, action.button)
            or {error = "not a button press"}
        schedule.actions[id] = answer
        local text = string.format("action %s: %s", tostring(id), answer.ok or answer.error)
        log[#log + 1] = text
        if answer.ok then changes[#changes + 1] = answer.ok end
    end

    local names = {}
    for role in pairs(state.runtime) do names[#names + 1] = role end
    table.sort(names)
    for _, role in ipairs(names) do
        local available = state.runtime[role]
        local choice = kept[role] or {}
        local version = in_force(choice, available)
        if version == nil then
            log[#log + 1] = role .. ": no versions, skipped"
        else
            local meta = available[version]
            local instances = choice.instances or meta.instances or 1
            schedule.roles[role] = {
                version = version,
                versions = versions.sorted(available),
                pinned = choice.pinned,
                frontend = {kind = "version"},
                global_actions = GLOBAL_ACTIONS,
                shortinfo = {{"num", "Instances", instances}},
            }
            local share = {}
            for _ = 1, instances do
                share[next_node] = (share[next_node] or 0) + 1
                next_node = next_node % #nodes + 1
            end
            local where = {}
            for i, name in ipairs(nodes) do
                schedule.nodes[name].roles[role] = {instances = share[i] or 0}
                where[#where + 1] = string.format("%s=%d", name, share[i] or 0)
            end
            log[#log + 1] = string.format("%s: %s x%d on %s%s", role, version, instances,
                #nodes == 1 and host or table.concat(where, " "),
                choice.pinned and " (pinned)" or "")
        end
    end
    -- An empty table would encode as {}, and `changes` is a list: leave it out instead.
    if #changes > 0 then schedule.changes = changes end
    return json.encode(schedule), table.concat(log, "\n")
end

return {scheduler = scheduler}
