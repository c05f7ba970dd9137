-- Placement: the newest version of every role, with the instances its metadata asks for.
local table = require "table"
local string = require "string"

-- This module's directory ("lib/"), so siblings are found wherever the library is copied.
local here = (...):match("(.-)[^/]+$")
local versions = require(here .. "versions")
local text = require(here .. "text")

local M = {}

-- Returns role -> {version, instances} and one log line per role, sorted by role.
function M.place(runtime, host)
    local names = {}
    for role in pairs(runtime) do names[#names + 1] = role end
    table.sort(names)
    local roles, lines = {}, {}
    for _, role in ipairs(names) do
        local version = versions.newest(runtime[role])
        if version == nil then
            lines[#lines + 1] = string.format("%s: no versions, skipped", role)
        else
            local instances = runtime[role][version].instances or 1
            roles[role] = {version = version, instances = instances}
            lines[#lines + 1] = text.placed(role, version, instances, host)
        end
    end
    return roles, lines
end

return M
