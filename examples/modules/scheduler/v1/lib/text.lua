-- Log text. Required as "lib/text" by plan.lua and main.lua: loaded once, then cached.
local string = require "string"
local table = require "table"

local M = {}

function M.placed(role, version, instances, host)
    return string.format("%s: %s x%d on %s", role, version, instances, host)
end

function M.lines(list)
    return table.concat(list, "\n")
end

return M
