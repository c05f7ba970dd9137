-- Version names ("v1", "v1.10.2") compared number by number.
local string = require "string"
local table = require "table"
local math = require "math"

local M = {}

local function numbers(name)
    local out = {}
    for n in string.gmatch(name, "%d+") do out[#out + 1] = math.tointeger(tonumber(n)) end
    return out
end

local function newer(a, b)
    local na, nb = numbers(a), numbers(b)
    for i = 1, math.max(#na, #nb) do
        local x, y = na[i] or -1, nb[i] or -1
        if x ~= y then return x > y end
    end
    return a > b
end

-- The newest version key of a role's runtime table, or nil.
function M.newest(available)
    local list = {}
    for name in pairs(available) do
        if type(name) == "string" and string.match(name, "^v%d") then list[#list + 1] = name end
    end
    table.sort(list, newer)
    return list[1]
end

return M
