-- A scheduler split into modules, in the style of the Lua libraries written for verwalter:
-- each module takes the standard libraries it uses through `require` and finds its siblings
-- from its own name (`...`). See README.md and docs/scheduler.md#require.
--
-- Every role under runtime/ runs on this node at its newest version; the schedule is returned
-- as a table, which verwalter converts to JSON.
local plan = require "lib/plan.lua"   -- the name with its suffix loads lib/plan.lua too
local text = require "lib/text"       -- plan.lua required it already: this is the cached module

local function scheduler(state)
    local roles, lines = plan.place(state.runtime, state.current_host)
    local node_roles = {}
    for role, placed in pairs(roles) do
        node_roles[role] = {instances = placed.instances}
    end
    local schedule = {
        vars = {template = "modules/v1"},
        roles = roles,
        nodes = {[state.current_host] = {roles = node_roles}},
    }
    return schedule, text.lines(lines)
end

return {scheduler = scheduler}
