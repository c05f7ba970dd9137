-- Same placement scheduler and generated input as benches/scheduler.rs, in plain lua5.4:
-- the baseline for the Lua part of the round. Run from the repository root:
--   lua5.4 benches/placement/baseline.lua
local main = dofile("benches/placement/scheduler/v1/main.lua")
local runtime = {}
for r = 0, 99 do
  local versions = {}
  for v = 1, 3 do versions["v" .. v] = {image = string.format("role-%03d.v%d", r, v), instances = 5 + r % 11, cpu = 1 + r % 4, memory = 2 + r % 8} end
  runtime[string.format("role-%03d", r)] = versions
end
local peers = {}
for i = 1, 1000 do
  local id = string.format("77985419c732412ea38b94db%08x", i)
  peers[id] = {id = id, hostname = string.format("node-%04d", i), name = "x"}
end
local state = {current_host = "node-0000", runtime = runtime, peers = peers}
local times = {}
for i = 1, 41 do
  local t = os.clock(); main.scheduler(state); times[#times + 1] = os.clock() - t
end
table.sort(times)
print(string.format("lua5.4 (41 runs, CPU time): median %.2f ms min %.2f max %.2f", times[21] * 1000, times[1] * 1000, times[41] * 1000))
