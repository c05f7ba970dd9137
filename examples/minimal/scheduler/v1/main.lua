-- A minimal verwalter scheduler: every role found under runtime/ runs on this node, at its newest
-- version unless an operator pinned another one, with as many instances as its metadata asks
-- unless an operator scaled it. The state argument and the returned schedule are described in
-- docs/scheduler.md.
--
-- Operator buttons (docs/frontend.md): each role lists its `versions` (the frontend shows a
-- "Switch To" button for each; `frontend.kind = "version"` is what 0.13's frontend looked for)
-- and three `global_actions`; a press arrives in `state.actions` as
-- {button = {role, action, version?, data?}}. What operators chose is kept in the schedule's
-- `state` and read back from `state.parents[1]` on the next run, and each action is answered
-- through the schedule's `actions` (what /v1/wait_action returns).
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

local function scheduler(state)
    local host = state.current_host
    local parent = state.parents[1] or {}
    local kept = type(parent.state) == "table" and parent.state or {}
    local schedule = {
        vars = {cluster = "demo", template = "minimal/v1"},
        roles = {},
        nodes = {[host] = {roles = {}}},
        state = kept,
        actions = {},
    }
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
            schedule.nodes[host].roles[role] = {instances = instances}
            log[#log + 1] = string.format("%s: %s x%d on %s%s", role, version, instances, host,
                choice.pinned and " (pinned)" or "")
        end
    end
    -- An empty table would encode as {}, and `changes` is a list: leave it out instead.
    if #changes > 0 then schedule.changes = changes end
    return json.encode(schedule), table.concat(log, "\n")
end

return {scheduler = scheduler}
