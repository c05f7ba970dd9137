-- Benchmark scheduler using the placement library: the same input and output shape as
-- ../../scheduler/v1/main.lua (the hand-written one), but the bin packing is one call of
-- placement.place with wca's LeastUsedBAR on cpu and mem, at most one instance of a role per
-- node. Every node has 16 cpu and 64 mem.
local CPU, MEM = 16, 64

local function newest(versions)
    local best, best_n
    for v in pairs(versions) do
        local n = tonumber(v:match("^v(%d+)"))
        if n and (best_n == nil or n > best_n) then best, best_n = v, n end
    end
    return best
end

local function scheduler(state)
    local nodes = {[state.current_host] = {cpu = CPU, mem = MEM}}
    for _, peer in pairs(state.peers) do nodes[peer.hostname] = {cpu = CPU, mem = MEM} end

    local role_names = {}
    for r in pairs(state.runtime) do role_names[#role_names + 1] = r end
    table.sort(role_names)

    local roles, apps, instances = {}, {}, {}
    for i, role in ipairs(role_names) do
        local versions = state.runtime[role]
        local v = newest(versions)
        local meta = versions[v]
        roles[role] = {version = v, image = meta.image, template = "svc/v1"}
        apps[role] = {cpu = meta.cpu, mem = meta.memory}
        instances[i] = {app = role, count = meta.instances}
    end

    local result = placement.place{
        algorithm = {kind = "LeastUsedBAR", dimensions = {"cpu", "mem"}},
        nodes = nodes,
        apps = apps,
        instances = instances,
        max_per_node = 1,
    }

    local out, unplaced = {}, 0
    for node, placed in pairs(result.placed) do
        local node_roles = {}
        for role in pairs(placed) do
            local r = roles[role]
            node_roles[role] = {instances = 1, version = r.version, image = r.image}
        end
        out[node] = {roles = node_roles}
    end
    for _, n in pairs(result.unplaced) do unplaced = unplaced + n end
    return {vars = {cluster = "bench"}, roles = roles, nodes = out},
        string.format("placed %d roles over the nodes, %d instances unplaced", #role_names, unplaced)
end

return {scheduler = scheduler}
