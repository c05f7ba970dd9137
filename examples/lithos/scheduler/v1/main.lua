-- The lithos example's scheduler. Every role found under runtime/ runs at its newest version, and
-- the version's `instances` (a total for the cluster) are spread over the nodes this node knows:
-- itself and its peers. Each node then renders, for each role, the lithos processes config of its
-- share (templates/), and hands it to lithos_switch.
--
-- The schedule it returns (docs/scheduler.md; how the parts merge is in controllers/src/render/vars.rs):
--
--   vars.template                       the template dir roles use unless they say otherwise
--   roles.<role>                        {version, template?}: the same on every node
--   nodes.<host>.roles.<role>.daemons   {<process name> = {image, config, instances, variables?}}
--
-- Every node gets every role, with an empty `daemons` where its share is zero, so that a node
-- whose share dropped to nothing stops its processes instead of keeping the old config.
--
-- A role's variables hold only that role's data: a new version of one role changes nothing the
-- other roles' templates see, so only that role is rendered and applied again.
--
-- The metadata is passed through as uploaded, not second-guessed: a bad value (say
-- `instances: -1`) ends up in the rendered file, which lithos_switch refuses, and the role's
-- deployment fails visibly (/v1/status `failed_roles`) while the other roles go on.
local json = require "lib/json"
local versions = require "lib/versions"
local spread = require "lib/spread"

local DEFAULT_TEMPLATE = "lithos-tera/v1"

local function scheduler(state)
    local hosts = spread.hosts(state)
    local schedule = {
        vars = {template = DEFAULT_TEMPLATE},
        roles = {},
        nodes = {},
    }
    for _, host in ipairs(hosts) do
        schedule.nodes[host] = {roles = {}}
    end
    local log = {"nodes: " .. table.concat(hosts, ", ")}

    for _, role in ipairs(spread.sorted_keys(state.runtime)) do
        local available = state.runtime[role]
        local newest = type(available) == "table" and versions.newest(available) or nil
        local meta = newest and available[newest]
        if type(meta) ~= "table" then
            log[#log + 1] = role .. ": no usable version, skipped"
        else
            schedule.roles[role] = {version = newest, template = meta.template}
            local total = meta.instances or 1
            local shares = spread.shares(total, #hosts, spread.start(role, #hosts))
            if not shares then
                log[#log + 1] = string.format(
                    "%s: instances %s is not an integer; passed on as it is", role, tostring(total))
            end
            local placed = {}
            for i, host in ipairs(hosts) do
                local daemons = {}
                local share = shares and shares[i] or total
                if share ~= 0 then
                    daemons[role] = {
                        image = meta.image,
                        config = meta.config,
                        instances = share,
                        variables = meta.variables,
                    }
                end
                schedule.nodes[host].roles[role] = {daemons = daemons}
                placed[#placed + 1] = host .. "=" .. tostring(share)
            end
            log[#log + 1] = string.format("%s: %s, %s instance(s): %s",
                role, newest, tostring(total), table.concat(placed, " "))
        end
    end
    return json.encode(schedule), table.concat(log, "\n")
end

return {scheduler = scheduler}
