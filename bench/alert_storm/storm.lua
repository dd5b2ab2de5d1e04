-- wrk script: POST Alertmanager payloads read from a file (one JSON body per line, in
-- send order: 90 % repeats), then print one JSON line with the results.
-- usage: wrk -t1 -c16 -d10s -s storm.lua URL -- BODIES_FILE [BEARER_TOKEN]
local bodies = {}
local index = 0
local headers = {["Content-Type"] = "application/json"}

function init(args)
  for line in io.lines(args[1]) do
    bodies[#bodies + 1] = line
  end
  if args[2] then
    headers["Authorization"] = "Bearer " .. args[2]
  end
end

function request()
  index = index + 1
  return wrk.format("POST", nil, headers, bodies[(index - 1) % #bodies + 1])
end

function done(summary, latency, requests)
  local seconds = summary.duration / 1e6
  io.write(string.format(
    '{"requests": %d, "seconds": %.3f, "requests_per_second": %.1f, "p50_ms": %.2f,'
    .. ' "p90_ms": %.2f, "p99_ms": %.2f, "max_ms": %.2f, "non_2xx": %d, "socket_errors": %d}\n',
    summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.timeout))
end
