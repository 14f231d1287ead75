-- Every request gets fresh event ids: @ID@ in the body template becomes a
-- per-run random prefix plus a counter. Optional: a key per request from
-- a pool (mixed-tenants), read from keys.txt.
-- Arguments: body, key, origin, keys file, mode, first counter value, seed.
-- The bench passes each run its own seed, and a timed run the counter where
-- its warm-up stopped: the pools (gzip bodies, keys) then carry on past what
-- the warm-up used instead of starting over (which resent the warm-up's ids).
local template, keys, counter, prefix = nil, nil, 0, nil
local headers = {}

function init(args)
  local f = io.open(args[1], "rb"); template = f:read("*a"); f:close()
  wrk.method = "POST"
  headers["Content-Type"] = "application/json"
  headers["Origin"] = args[3] or "https://bench.example"
  if args[2] and args[2] ~= "" then headers["X-API-Key"] = args[2] end
  if args[4] and args[4] ~= "" then
    keys = {}
    for line in io.lines(args[4]) do keys[#keys + 1] = line end
  end
  if args[5] == "static" then template_static = true end
  if args[5] == "gzpool" then
    -- a pool of pre-gzipped bodies with unique ids: "<length>\n<bytes>" records
    pool = {}
    local f = io.open(args[1], "rb"); local data = f:read("*a"); f:close()
    local pos = 1
    while pos <= #data do
      local nl = data:find("\n", pos, true)
      local len = tonumber(data:sub(pos, nl - 1))
      pool[#pool + 1] = data:sub(nl + 1, nl + len)
      pos = nl + len + 1
    end
    headers["Content-Encoding"] = "gzip"
  end
  counter = tonumber(args[6] or "") or 0
  math.randomseed(tonumber(args[7] or "") or (os.time() + math.floor(os.clock() * 1e6)))
  -- The id's shape is the same in every run: digits never run for twelve or
  -- more characters (letters split them), as in the UUIDs SDKs send. With a
  -- bare hex prefix, a run whose random prefix happened to end in digits gave
  -- every event a digit run the payment scan must confirm: ~110 us more per
  -- 25-event request (29 against 140 us of has_card_candidate), ~8% of batch25.
  prefix = string.format("e%06xe%06xe", math.random(0, 0xffffff), math.random(0, 0xffffff))
end

function request()
  counter = counter + 1
  if keys then headers["X-API-Key"] = keys[(counter % #keys) + 1] end
  local body = template
  if pool then
    body = pool[(counter % #pool) + 1]
  elseif not template_static then
    body = template:gsub("@ID@", prefix .. "-" .. counter)
  end
  return wrk.format(nil, nil, headers, body)
end

-- done() comes from summary.lua, appended by bench/scenarios.py
