-- gelbridge adapter sandbox prelude: runs first in every fresh runtime, while the
-- standard library is still complete. It captures what the host needs as upvalues,
-- installs the limits, wraps what scripts may use, and removes everything else.
-- Arguments come from gelbridge/_adapters/sandbox.py.
local json_src, luxkit_src, now, py_log, py_http, HOOK_EVERY, MAX_STRING, STEPS_PER_SEC = ...

local _G = _G
local type, error, tostring, select, next, rawget, rawset, setmetatable, getmetatable, ipairs =
  type, error, tostring, select, next, rawget, rawset, setmetatable, getmetatable, ipairs
local t_insert, t_move = table.insert, table.move
local raw_pcall, raw_xpcall, raw_load, raw_collect = pcall, xpcall, load, collectgarbage
local byte, sub, find, format = string.byte, string.sub, string.find, string.format
local s_find, s_match, s_gmatch, s_gsub, s_rep = string.find, string.match, string.gmatch, string.gsub, string.rep
local huge, floor = math.huge, math.floor
local sethook, getinfo = debug.sethook, debug.getinfo
local jit = rawget(_G, "jit")
local jit_off = jit and jit.off
local co_create, co_resume = coroutine.create, coroutine.resume
local os_time, os_clock, os_date = os.time, os.clock, os.date

-- JSON: trusted host code, loaded as text while the library is intact.
local json = raw_load(json_src, "=json", "t")()

-- ------------------------------------------------------------------- limits
local PREFIX = "gelbridge sandbox limit exceeded: "
local MSG = {}
for _, k in ipairs({ "time", "instructions", "memory", "pattern", "string_size" }) do
  MSG[k] = PREFIX .. k
end
local deadline, hooks_left, violation = huge, huge, nil

local function violate(kind)
  violation = kind
  error(MSG[kind], 0)
end

local function hook()
  if violation then error(MSG[violation], 0) end
  hooks_left = hooks_left - 1
  if hooks_left < 0 then violate("instructions") end
  if now() > deadline then violate("time") end
end
sethook(hook, "", HOOK_EVERY)

-- A violation must not be swallowed by the script: every error-catching entry
-- point re-raises once a limit was hit.
local function pass(ok, ...)
  if violation then error(MSG[violation], 0) end
  if not ok and (...) == "not enough memory" then violate("memory") end
  return ok, ...
end

local function safe_pcall(f, ...) return pass(raw_pcall(f, ...)) end
-- Lua 5.4 runs a message handler for an error raised by the hook with hooks
-- still disabled, so a script's handler must never run once a limit was hit.
local function safe_xpcall(f, h, ...)
  local function guarded(e)
    if violation then return MSG[violation] end
    return h(e)
  end
  return pass(raw_xpcall(f, guarded, ...))
end

local function new_coroutine(f)
  local c = co_create(f)
  sethook(c, hook, "", HOOK_EVERY) -- Lua 5.4 hooks are per coroutine
  return c
end

local function wrap_pass(ok, ...)
  if violation then error(MSG[violation], 0) end
  if not ok then
    if (...) == "not enough memory" then violate("memory") end
    error((...), 0)
  end
  return ...
end

local safe_coroutine = {
  create = new_coroutine,
  resume = function(c, ...) return pass(co_resume(c, ...)) end,
  wrap = function(f)
    local c = new_coroutine(f)
    return function(...) return wrap_pass(co_resume(c, ...)) end
  end,
  yield = coroutine.yield, status = coroutine.status, running = coroutine.running,
  isyieldable = coroutine.isyieldable, close = coroutine.close,
}

-- --------------------------------------------- string functions with C loops
-- Lua's matcher backtracks inside C where no hook fires, so the worst-case
-- number of steps is estimated before each call and refused when it would not
-- fit in the remaining time: (n+1)^q * 2^opt * starts * #pattern, where q is
-- the number of backtracking quantifiers (* + - %b, backreferences) except a
-- trailing one, opt the number of ?, starts n+1 unless anchored with ^.
local SPECIALS = "[%^%$%*%+%?%.%(%)%[%]%%%-]"

local function class_end(p, i) -- i at '['; returns index of the closing ']'
  local j = i + 1
  if byte(p, j) == 94 then j = j + 1 end
  repeat
    local c = byte(p, j)
    if c == nil then return #p end
    if c == 37 then j = j + 1 end
    j = j + 1
  until byte(p, j) == 93
  return j
end

local function pattern_steps(p, n, anchorable)
  local len, i, q, opt = #p, 1, 0, 0
  local starts = n + 1
  if anchorable and byte(p, 1) == 94 then starts = 1; i = 2 end
  while i <= len do
    local c = byte(p, i)
    local item_end
    if c == 40 or c == 41 then
      i = i + 1
    elseif c == 36 and i == len then
      i = i + 1
    elseif c == 37 then
      local d = byte(p, i + 1)
      if d == 98 then
        q = q + 1; i = i + 4
      elseif d == 102 then
        i = (byte(p, i + 2) == 91) and class_end(p, i + 2) + 1 or i + 3
      else
        if d and d >= 48 and d <= 57 then q = q + 1 end -- %1..%9 backreference
        item_end = i + 1
      end
    elseif c == 91 then
      item_end = class_end(p, i)
    else
      item_end = i
    end
    if item_end then
      local nx = byte(p, item_end + 1)
      if nx == 42 or nx == 43 or nx == 45 then
        if not find(p, "^%)*$", item_end + 2) then q = q + 1 end
        i = item_end + 2
      elseif nx == 63 then
        opt = opt + 1; i = item_end + 2
      else
        i = item_end + 1
      end
    end
  end
  if opt > 60 then opt = 60 end
  return (n + 1) ^ q * 2 ^ opt * starts * (len + 1)
end

local function guard(s, p, plain, anchorable)
  if type(s) ~= "string" or type(p) ~= "string" then return end -- the C function checks types
  local n = #s
  local steps
  if plain or not find(p, SPECIALS) then
    steps = n * (#p + 1)
  else
    steps = pattern_steps(p, n, anchorable)
  end
  if steps > 1e5 and steps > (deadline - now()) * STEPS_PER_SEC then violate("pattern") end
end

local string_lib = string
string_lib.find = function(s, p, init, plain)
  guard(s, p, plain, true)
  return s_find(s, p, init, plain)
end
string_lib.match = function(s, p, init)
  guard(s, p, false, true)
  return s_match(s, p, init)
end
string_lib.gmatch = function(s, p, ...)
  guard(s, p, false, false)
  return s_gmatch(s, p, ...)
end
string_lib.gsub = function(s, p, r, n)
  guard(s, p, false, true)
  return s_gsub(s, p, r, n)
end
string_lib.rep = function(s, n, sep)
  if type(n) == "number" and n > 0 and type(s) == "string" then
    local each = #s + ((type(sep) == "string") and #sep or 0)
    if each * n > MAX_STRING then violate("string_size") end
  end
  return s_rep(s, n, sep)
end
string_lib.dump = nil
-- Scripts may not read or change the string metatable (its __index is `string`).
getmetatable("").__metatable = false

-- ------------------------------------------------------------- host globals
local function log(level, ...)
  local msg = select("#", ...) > 0 and tostring((...)) or ""
  py_log(sub(tostring(level), 1, 16), sub(msg, 1, 2000))
end

-- py_http answers (false, nil) when its answer would not fit in the memory left: this
-- message exists already, so raising it needs none.
local HTTP_NO_ROOM = "http: the answer does not fit in the sandbox's memory"
local function http_result(ok, body, status)
  if not ok then error(body or HTTP_NO_ROOM, 0) end
  return body, status
end

local function http_get(url)
  if type(url) ~= "string" then error("http_get: url must be a string", 2) end
  return http_result(py_http("GET", url, nil, deadline))
end

local function http_post(url, body)
  if type(url) ~= "string" then error("http_post: url must be a string", 2) end
  if body ~= nil and type(body) ~= "string" then error("http_post: body must be a string", 2) end
  return http_result(py_http("POST", url, body, deadline))
end

local function safe_setmetatable(t, mt)
  if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
    error("setmetatable: __gc metamethods are not allowed in adapter scripts", 2)
  end
  return setmetatable(t, mt)
end

-- --------------------------------------------------------- frozen host tables
-- A frozen table is an empty proxy: reads go to the hidden original, writes raise,
-- its metatable is locked, and rawset refuses it, as do table.insert and table.move
-- on LuaJIT (its table library writes raw; the proxy stays empty, so nothing else
-- of the library can write to it). A script can still rebind the global name in
-- its own runtime; it can never change the table that luxkit's code or another
-- runtime uses.
local frozen = setmetatable({}, { __mode = "k" })

local function freeze(t, name)
  local msg = name .. " is read-only (it belongs to gelbridge); keep your own values in locals"
  local proxy = {}
  for k, v in next, t do
    if type(v) == "table" then t[k] = freeze(v, name .. "." .. tostring(k)) end
  end
  setmetatable(proxy, {
    __index = t,
    __newindex = function() error(msg, 2) end,
    __pairs = function() return function(_, k) return next(t, k) end, proxy, nil end, -- Lua 5.4
    __metatable = name,
  })
  frozen[proxy] = msg
  return proxy
end

local function refuse_frozen(t)
  local msg = frozen[t]
  if msg then error(msg, 3) end
end

local function safe_rawset(t, k, v)
  refuse_frozen(t)
  return rawset(t, k, v)
end

local safe_table = table
if jit then
  safe_table.insert = function(t, ...) refuse_frozen(t) return t_insert(t, ...) end
  if t_move then
    safe_table.move = function(a1, f, e, t, ...)
      refuse_frozen((select("#", ...) > 0 and (...) ~= nil) and (...) or a1)
      return t_move(a1, f, e, t, ...)
    end
  end
end

-- luxkit (lua/luxkit.lua): trusted helpers for scripts, loaded as text like json.lua
-- but now, after the string wrappers, so its pattern calls are guarded like a
-- script's, and with the JIT off like script code, so the instruction hook fires in
-- its loops. It captures json and log here: a script that replaces json.encode in
-- its own runtime does not change luxkit.
local luxkit_chunk = raw_load(luxkit_src, "=luxkit", "t")
if jit_off then jit_off(luxkit_chunk, true) end
-- What luxkit's text_delta_json built last (see open_stream); only luxkit and this
-- prelude hold it.
local last_delta = {}
local luxkit = freeze(luxkit_chunk(json, log, last_delta), "luxkit")

local function safe_collectgarbage(opt)
  if opt == "count" then return raw_collect("count") end
  error("collectgarbage('" .. tostring(opt) .. "') is not available in adapter scripts", 2)
end

for _, k in ipairs({ "python", "io", "os", "package", "require", "load", "loadstring",
  "dofile", "loadfile", "debug", "jit", "getfenv", "setfenv", "newproxy", "gcinfo",
  "module", "warn", "collectgarbage", "print" }) do
  rawset(_G, k, nil)
end
_G.os = { time = os_time, clock = os_clock, date = os_date }
_G.pcall, _G.xpcall = safe_pcall, safe_xpcall
_G.coroutine = safe_coroutine
_G.setmetatable = safe_setmetatable
_G.collectgarbage = safe_collectgarbage
_G.json = json
_G.luxkit = luxkit
_G.rawset = safe_rawset
_G.log = log
_G.print = function(...) log("debug", ...) end
_G.http_get, _G.http_post = http_get, http_post

-- ----------------------------------------------------------- host entry points
local adapter = nil
local ERR_LOCATED = "^[^\n]-:%d+: "

local function script_location()
  for level = 3, 60 do
    local info = getinfo(level, "Sl")
    if not info then break end
    if byte(info.source, 1) == 64 and info.currentline and info.currentline > 0 then
      return info.short_src .. ":" .. info.currentline
    end
  end
  return nil
end

local function handler(e)
  if violation then return MSG[violation] end
  if e == "not enough memory" then violation = "memory"; return e end
  local where = script_location()
  if type(e) == "string" then
    if where and (not find(e, ERR_LOCATED) or find(e, "^luxkit:%d+: ")) then return where .. ": " .. e end
    return e
  end
  local ok, desc = raw_pcall(json.encode, e)
  if not ok then desc = tostring(e) end
  desc = "error object " .. sub(desc, 1, 300)
  return where and (where .. ": " .. desc) or desc
end

local function begin(dl, budget)
  deadline, hooks_left, violation = dl, budget, nil
end

local function finish(ok, res)
  deadline, hooks_left = huge, huge
  if violation then return "violation", violation end
  if not ok then
    if res == "not enough memory" then return "violation", "memory" end
    return "error", res
  end
  return nil
end

local FUNCTIONS = { "transform_request", "transform_response", "transform_stream_chunk",
  "build_headers", "build_url", "transform_error" }
local REQUIRED = { transform_request = true, transform_response = true }

local function describe(a)
  local d = { functions = json.object() }
  local name, version, endpoint, headers = a.name, a.version, a.endpoint, a.headers
  if name ~= nil and (type(name) ~= "string" or name == "") then
    return nil, "adapter.name must be a non-empty string, got " .. type(name)
  end
  if version ~= nil and type(version) ~= "string" and type(version) ~= "number" then
    return nil, "adapter.version must be a string, got " .. type(version)
  end
  if endpoint ~= nil and type(endpoint) ~= "string" then
    return nil, "adapter.endpoint must be a string, got " .. type(endpoint)
  end
  local h = json.object()
  if headers ~= nil then
    if type(headers) ~= "table" then return nil, "adapter.headers must be a table, got " .. type(headers) end
    for k, v in next, headers do
      if type(k) ~= "string" or (type(v) ~= "string" and type(v) ~= "number") then
        return nil, "adapter.headers must map strings to strings (bad entry " .. tostring(k) .. ")"
      end
      h[k] = tostring(v)
    end
  end
  for _, f in ipairs(FUNCTIONS) do
    local v = a[f]
    if v ~= nil and type(v) ~= "function" then
      return nil, "adapter." .. f .. " must be a function, got " .. type(v)
    end
    if v == nil and REQUIRED[f] then return nil, "adapter." .. f .. " is missing" end
    d.functions[f] = v ~= nil
  end
  d.name, d.version, d.endpoint, d.headers = name, version and tostring(version), endpoint, h
  return json.encode(d)
end

local function load_script(src, chunkname, dl, budget)
  begin(dl, budget)
  local chunk, err = raw_load(src, chunkname, "t")
  if not chunk then finish(true); return "syntax", err end
  if jit_off then jit_off(chunk, true) end -- script code is never JIT-compiled: hooks must fire
  local ok, res = raw_xpcall(chunk, handler)
  local st, v = finish(ok, res)
  if st then return st, v end
  if type(res) ~= "table" then
    return "contract", "the script must return the adapter table, got " .. type(res)
  end
  local desc, problem = describe(res)
  if not desc then return "contract", problem end
  adapter = res
  return "ok", desc
end

-- kind: "string" (transform_*: string in, string out), "headers", "url", "error".
local ERROR_FIELDS = { "kind", "message", "code" }

local function invoke(kind, fname, dl, budget, a, b)
  local f = adapter and adapter[fname]
  if type(f) ~= "function" then return "missing", fname end
  if kind == "error" then  -- transform_error(status, body) -> nil | {kind?, message?, code?}
    begin(dl, budget)
    local ok, res = raw_xpcall(f, handler, a, b)
    local st, v = finish(ok, res)
    if st then return st, v end
    if res == nil then return "ok", nil end
    if type(res) ~= "table" then return "type", type(res) end
    local out = json.object()
    for _, key in ipairs(ERROR_FIELDS) do
      local val = res[key]
      if val ~= nil then
        if type(val) ~= "string" then return "type", "table with a non-string " .. key end
        out[key] = val
      end
    end
    return "ok", json.encode(out)
  end
  if kind == "headers" then
    begin(dl, budget)
    local ok, res = raw_xpcall(function() return f(json.decode(a)) end, handler)
    local st, v = finish(ok, res)
    if st then return st, v end
    if res == nil then return "ok", nil end
    if type(res) ~= "table" then return "type", type(res) end
    local out = json.object()
    for k, val in next, res do
      if type(k) ~= "string" or (type(val) ~= "string" and type(val) ~= "number") then
        return "type", "table with a non-string entry " .. tostring(k)
      end
      out[k] = tostring(val)
    end
    return "ok", json.encode(out)
  end
  begin(dl, budget)
  local ok, res
  if kind == "url" then
    ok, res = raw_xpcall(f, handler, a, b)
  else
    ok, res = raw_xpcall(f, handler, a)
  end
  local st, v = finish(ok, res)
  if st then return st, v end
  if kind == "url" and res == nil then return "ok", nil end
  if type(res) ~= "string" then return "type", type(res) end
  return "ok", res
end

-- One stream's entry point: adapter[fname](data, state) with a `state` table of its
-- own for the stream's whole life. Three arguments and no dispatch a chunk: this runs
-- for every chunk of every stream (scripts/bench_scale.py). A result that is the very
-- text luxkit.text_delta_json built last (one plain text or thinking delta, the bulk
-- of a stream) comes back, when `typed`, as what it encodes: type ("text" or
-- "thinking"), index, text. Equal strings have equal content: exactly what decoding
-- the JSON would give.
local function open_stream(fname, typed)
  local f = adapter and adapter[fname]
  if type(f) ~= "function" then return nil end
  local state = {}
  local noted_delta = typed and last_delta or {}
  return function(dl, budget, data)
    begin(dl, budget)
    local ok, res = raw_xpcall(f, handler, data, state)
    local st, v = finish(ok, res)
    if st then return st, v end
    local noted = noted_delta.json
    if noted ~= nil and res == noted then
      return noted_delta.type, noted_delta.index, noted_delta.text
    end
    if type(res) ~= "string" then return "type", type(res) end
    return "ok", res
  end
end

-- A full collection, called by the host before it pushes a large value (LuaJIT has no
-- emergency collection: garbage of earlier calls would otherwise count against the push).
local function collect()
  raw_collect("collect")
end

return load_script, invoke, open_stream, collect
