-- Snapshot reads: GET /v1/signals/<visitorId>?sessionId=<s> with the bench key.
-- args: visitorId, sessionId, key, origin.
local path
local headers = {}

function init(args)
  path = "/v1/signals/" .. args[1] .. "?sessionId=" .. args[2]
  headers["X-API-Key"] = args[3]
  headers["Origin"] = args[4]
end

function request()
  return wrk.format("GET", path, headers, nil)
end

-- done() comes from summary.lua, appended by bench/scenarios.py
