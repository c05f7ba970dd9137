-- A small JSON encoder: tables with keys 1..n are arrays, other tables objects.
local M = {}

local escapes = {['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f',
                 ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t'}

local function encode_string(s)
    return '"' .. s:gsub('[%c"\\]', function(c)
        return escapes[c] or string.format("\\u%04x", c:byte())
    end) .. '"'
end

local encode

local function is_array(t)
    local n = #t
    if n == 0 then return false end
    local count = 0
    for _ in pairs(t) do count = count + 1 end
    return count == n
end

encode = function(value)
    local kind = type(value)
    if kind == "nil" then return "null"
    elseif kind == "boolean" then return tostring(value)
    elseif kind == "number" then
        if value ~= value or value == math.huge or value == -math.huge then
            error("cannot encode " .. tostring(value) .. " as JSON", 2)
        end
        if math.type(value) == "integer" then return string.format("%d", value) end
        return string.format("%.17g", value)
    elseif kind == "string" then return encode_string(value)
    elseif kind == "table" then
        local out = {}
        if is_array(value) then
            for i = 1, #value do out[i] = encode(value[i]) end
            return "[" .. table.concat(out, ",") .. "]"
        end
        for k, v in pairs(value) do
            out[#out + 1] = encode_string(tostring(k)) .. ":" .. encode(v)
        end
        table.sort(out)
        return "{" .. table.concat(out, ",") .. "}"
    end
    error("cannot encode a " .. kind .. " as JSON", 2)
end

M.encode = encode
return M
