-- Placement helpers: the nodes to place on, and a total split into per-node shares.
local M = {}

-- The keys of a table, sorted (only string keys: runtime keys are file names).
function M.sorted_keys(t)
    local keys = {}
    for k in pairs(t or {}) do
        if type(k) == "string" then keys[#keys + 1] = k end
    end
    table.sort(keys)
    return keys
end

-- This node and every peer with a hostname, sorted and without duplicates, so that every
-- leader computes the same placement from the same peers.
function M.hosts(state)
    local seen = {[state.current_host] = true}
    local hosts = {state.current_host}
    for _, id in ipairs(M.sorted_keys(state.peers)) do
        local name = state.peers[id].hostname
        if type(name) == "string" and name ~= "" and not seen[name] then
            seen[name] = true
            hosts[#hosts + 1] = name
        end
    end
    table.sort(hosts)
    return hosts
end

-- `total` split over `n` nodes as evenly as possible. When it does not divide, the remainder
-- goes one each to the nodes from position `start` on (wrapping around), so that different roles
-- do not all put their extra instance on the same node. Nil when `total` is not an integer.
-- Negative totals are not refused here (see main.lua).
function M.shares(total, n, start)
    if math.type(total) ~= "integer" then return nil end
    local base, extra = total // n, total % n
    local out = {}
    for i = 1, n do
        local pos = (i - start) % n  -- 0 for the node at `start`
        out[i] = base + ((pos < extra) and 1 or 0)
    end
    return out
end

-- A position in 1..n that depends only on `name`: the same role starts at the same node on
-- every run and every leader.
function M.start(name, n)
    local sum = 0
    for i = 1, #name do sum = sum + name:byte(i) end
    return sum % n + 1
end

return M
