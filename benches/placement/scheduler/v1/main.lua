-- Benchmark scheduler: places every role's instances over all nodes, spreading them (one
-- instance of a role per node) onto the nodes with the most free CPU and memory. Per role it
-- scores every node once and keeps the best few: roles x nodes capacity checks, like a real
-- placement pass.
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
    local names = {state.current_host}
    for _, peer in pairs(state.peers) do names[#names + 1] = peer.hostname end
    table.sort(names)
    local free_cpu, free_mem, count = {}, {}, {}
    for _, n in ipairs(names) do free_cpu[n], free_mem[n], count[n] = CPU, MEM, 0 end

    local role_names = {}
    for r in pairs(state.runtime) do role_names[#role_names + 1] = r end
    table.sort(role_names)

    local roles, nodes, unplaced = {}, {}, 0
    for _, role in ipairs(role_names) do
        local versions = state.runtime[role]
        local v = newest(versions)
        local meta = versions[v]
        roles[role] = {version = v, image = meta.image, template = "svc/v1"}
        -- One pass over the nodes keeps the `instances` best-scored ones that fit, in order.
        local want, cpu, mem = meta.instances, meta.cpu, meta.memory
        local best_nodes, best_scores, kept = {}, {}, 0
        for _, n in ipairs(names) do
            local fc, fm = free_cpu[n], free_mem[n]
            if fc >= cpu and fm >= mem then
                local score = fc / CPU + fm / MEM - count[n] * 0.01
                if kept < want or score > best_scores[kept] then
                    local i = kept < want and kept + 1 or kept
                    while i > 1 and best_scores[i - 1] < score do
                        best_scores[i], best_nodes[i] = best_scores[i - 1], best_nodes[i - 1]
                        i = i - 1
                    end
                    best_scores[i], best_nodes[i] = score, n
                    if kept < want then kept = kept + 1 end
                end
            end
        end
        for i = 1, kept do
            local n = best_nodes[i]
            free_cpu[n] = free_cpu[n] - cpu
            free_mem[n] = free_mem[n] - mem
            count[n] = count[n] + 1
            local node = nodes[n]
            if node == nil then node = {roles = {}}; nodes[n] = node end
            node.roles[role] = {instances = 1, version = v, image = meta.image}
        end
        unplaced = unplaced + (want - kept)
    end
    return {vars = {cluster = "bench"}, roles = roles, nodes = nodes},
        string.format("placed %d roles over %d nodes, %d instances unplaced", #role_names, #names, unplaced)
end

return {scheduler = scheduler}
