-- Version helpers: keys like "v1", "v1.10.2" compared numerically part by part.
local M = {}

local function parts(v)
    local out = {}
    for n in v:gmatch("%d+") do out[#out + 1] = tonumber(n) end
    return out
end

function M.less(a, b)
    local pa, pb = parts(a), parts(b)
    for i = 1, math.max(#pa, #pb) do
        local x, y = pa[i] or -1, pb[i] or -1
        if x ~= y then return x < y end
    end
    return a < b
end

function M.sorted(available)
    local list = {}
    for v in pairs(available) do
        if type(v) == "string" and v:match("^v%d") then list[#list + 1] = v end
    end
    table.sort(list, function(a, b) return M.less(b, a) end)
    return list
end

function M.newest(available)
    return M.sorted(available)[1]
end

return M
