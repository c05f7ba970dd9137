-- A scheduler for several data centers (docs/datacenters.md): each DC runs `per-node` workers
-- on every node, and wants `demand.<dc>` of them (runtime/site.yaml). A DC whose load (demand
-- over capacity) is above `threshold` asks the other DCs for what it lacks; a DC lends what it
-- has spare below its own threshold, only to DCs whose published load is above the threshold.
-- Grants are leases of `lease-ms`: renewed while both keep asking and answering, gone by
-- themselves when the link between them is cut.
--
-- What each DC publishes (its summary): {load, spare}. The schedule shows what this DC borrows
-- and lends, so every node of the DC (and an operator) sees it.

local function count(t)
    local n = 0
    for _ in pairs(t) do n = n + 1 end
    return n
end

local function sorted_keys(t)
    local keys = {}
    for k in pairs(t) do keys[#keys + 1] = k end
    table.sort(keys)
    return keys
end

local function settings(state)
    local site = state.runtime.site or {}
    return {
        per_node = math.tointeger(site["per-node"]) or 10,
        threshold = tonumber(site.threshold) or 0.8,
        lease_ms = math.tointeger(site["lease-ms"]) or 30000,
        demand = type(site.demand) == "table" and site.demand or {},
    }
end

local function scheduler(state)
    local s = settings(state)
    -- nil on a node in no DC, or before its exchange runs.
    local dcs = state.datacenters or {dcs = {}}
    local me = dcs.self
    local capacity = s.per_node * (1 + count(state.peers))
    local demand = math.tointeger(me and s.demand[me]) or 0
    -- Workers this DC runs before it borrows; what is under it may be lent.
    local limit = math.floor(capacity * s.threshold)
    local spare = math.max(0, limit - demand)
    local out = {
        summary = {load = demand / capacity, spare = spare},
        requests = {},
        answers = {},
    }
    local schedule = {
        datacenter = me,
        capacity = capacity,
        demand = demand,
        borrowed = {},
        lent = {},
        datacenters = out,
    }
    local log = {}
    local others = sorted_keys(dcs.dcs)

    -- Lending: answer the requests of DCs whose load is above the threshold, from what is spare.
    for _, name in ipairs(others) do
        local dc = dcs.dcs[name]
        local load = dc.summary and tonumber(dc.summary.load)
        for _, request in ipairs(dc.requests or {}) do
            local want = math.tointeger(request.data and request.data.workers) or 0
            if load ~= nil and load > s.threshold and want > 0 and spare > 0 then
                local give = math.min(want, spare)
                spare = spare - give
                out.answers[name] = out.answers[name] or {}
                table.insert(out.answers[name], {
                    request = request.id, data = {workers = give}, lease_ms = s.lease_ms,
                })
                schedule.lent[name] = (schedule.lent[name] or 0) + give
                log[#log + 1] = string.format("lend %d worker(s) to %s", give, name)
            end
        end
    end

    -- Borrowing: above the threshold, ask each DC that publishes spare workers for its part of
    -- what is missing, in name order.
    local missing = math.max(0, demand - limit)
    for _, name in ipairs(others) do
        local summary = dcs.dcs[name].summary
        local offered = math.tointeger(summary and summary.spare) or 0
        if missing > 0 and offered > 0 then
            local ask = math.min(missing, offered)
            missing = missing - ask
            out.requests[name] = {{id = "workers", data = {workers = ask}, lease_ms = s.lease_ms}}
            log[#log + 1] = string.format("ask %s for %d worker(s)", name, ask)
        end
    end
    -- What the other DCs granted (an answer is there only while its lease runs).
    for _, name in ipairs(others) do
        for _, answer in ipairs(dcs.dcs[name].answers or {}) do
            local got = math.tointeger(answer.data and answer.data.workers) or 0
            schedule.borrowed[name] = (schedule.borrowed[name] or 0) + got
            log[#log + 1] = string.format("borrowed %d worker(s) from %s", got, name)
        end
    end
    log[#log + 1] = string.format("%s: demand %d of %d", me or "no data center", demand, capacity)
    return schedule, table.concat(log, "\n")
end

return {scheduler = scheduler}
