-- gelbridge JSON for adapter sandboxes (Lua 5.4 and LuaJIT 2.1).
--
-- Loaded by the host before any adapter script and before the sandbox removes
-- libraries, so it captures the original string functions as upvalues.
-- Rules (see gelbridge/_adapters/__init__.py for the full contract):
--   * json.decode(s) -> value, or nil plus a message on bad input (never raises).
--     Raw control characters inside strings are accepted (lenient).
--     null -> nil (in arrays it leaves a hole; trailing nulls are dropped on re-encode).
--     Integers stay integers (Lua 5.4 integer subtype; LuaJIT: exact up to 2^53).
--     Numbers out of double range decode to +-math.huge.
--     Arrays get the marker metatable "json.array", so [] stays [] on re-encode.
--   * json.encode(v) -> string; raises on functions, cycles, too deep nesting,
--     non-string/number keys, NaN/inf encode as null.
--     A table is an array when it carries the "json.array" marker or when all its
--     keys are positive integers (holes become null); otherwise an object.
--     An empty table with no marker encodes as {}. Object keys are sorted.
--   * json.array(t?) marks t (or a new table) as an array; json.empty_array is a
--     read-only empty array; json.object(t?) forces object encoding.

local byte, sub, find, char, format, gsub, rep =
  string.byte, string.sub, string.find, string.char, string.format, string.gsub, string.rep
local concat, sort = table.concat, table.sort
local tostring, tonumber, type, next, pcall, error, setmetatable, getmetatable, select =
  tostring, tonumber, type, next, pcall, error, setmetatable, getmetatable, select
local floor, huge = math.floor, math.huge
local mtype = math.type -- nil on LuaJIT
local is_jit = rawget(_G, "jit") ~= nil
-- LuaJIT's table.new presizes a table: growing a fresh table key by key rehashes
-- it at every power of two, which costs more than the decoding around it.
local tnew = nil
if is_jit then
  local ok, m = pcall(require, "table.new")
  if ok and type(m) == "function" then tnew = m end
end
if not tnew then tnew = function() return {} end end

local MAX_DEPTH = 128
local ARRAY, OBJECT = "json.array", "json.object"
local array_mt = { __metatable = ARRAY }
local object_mt = { __metatable = OBJECT }

local json = {}

-- ---------------------------------------------------------------- decode

local DECODE_FAIL = {} -- unique error value; never escapes this module

local function fail(s, pos, what)
  error({ DECODE_FAIL, format("json.decode: %s at byte %d", what, pos) }, 0)
end

-- Anchored greedy runs are much faster than unanchored searches in Lua's matcher.
local str_plain_run = is_jit and '^[^"\\%z\1-\31]*' or '^[^"\\\0-\31]*'
local str_special = is_jit and '["\\%z\1-\31]' or '["\\\0-\31]'

local escapes = {
  [34] = '"', [92] = "\\", [47] = "/", [98] = "\b", [102] = "\f",
  [110] = "\n", [114] = "\r", [116] = "\t",
}

local function utf8_char(cp)
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return char(0xE0 + floor(cp / 4096), 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return char(0xF0 + floor(cp / 262144), 0x80 + floor(cp / 4096) % 64,
    0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
end

local function hex4(s, pos)
  local h = sub(s, pos, pos + 3)
  if not find(h, "^%x%x%x%x$") then fail(s, pos, "bad \\u escape") end
  return tonumber(h, 16)
end

-- Position of the next backslash at or after the current string (huge: none left).
-- Decoding moves forward only, so one plain find serves every string up to that
-- backslash: without it a text with no backslash is scanned to its end per string.
local next_bs = 0

local function decode_string(s, pos) -- pos: opening quote
  -- Plain finds (memchr) locate the closing quote and backslashes: much faster
  -- than character-class patterns. Raw control characters are accepted.
  local i = pos + 1
  local q = find(s, '"', i, true)
  if not q then fail(s, pos, "unterminated string") end
  local b = next_bs
  if b < i then
    b = find(s, "\\", i, true) or huge
    next_bs = b
  end
  if b > q then return sub(s, i, q - 1), q + 1 end
  local buf, n = {}, 0
  while true do
    n = n + 1; buf[n] = sub(s, i, b - 1)
    local x = byte(s, b + 1)
    if x == 117 then
      local cp = hex4(s, b + 2)
      i = b + 6
      if cp >= 0xD800 and cp <= 0xDBFF then
        if sub(s, i, i + 1) == "\\u" then
          local lo = hex4(s, i + 2)
          if lo >= 0xDC00 and lo <= 0xDFFF then
            cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
            i = i + 6
          else
            cp = 0xFFFD
          end
        else
          cp = 0xFFFD
        end
      elseif cp >= 0xDC00 and cp <= 0xDFFF then
        cp = 0xFFFD -- lone low surrogate
      end
      n = n + 1; buf[n] = utf8_char(cp)
    else
      local m = escapes[x]
      if not m then fail(s, b, "bad escape") end
      n = n + 1; buf[n] = m
      i = b + 2
    end
    if q < i then
      q = find(s, '"', i, true)
      if not q then fail(s, pos, "unterminated string") end
    end
    b = find(s, "\\", i, true) or huge
    next_bs = b
    if b > q then
      n = n + 1; buf[n] = sub(s, i, q - 1)
      return concat(buf), q + 1
    end
  end
end

-- Byte loops instead of patterns: LuaJIT compiles them (a pattern find is not
-- compiled and costs a C call); integers of up to 15 digits are built directly.
local function decode_number(s, pos)
  local i, neg = pos, false
  local c = byte(s, i)
  if c == 45 then neg = true; i = i + 1; c = byte(s, i) end
  local d0, v = i, 0
  while c and c >= 48 and c <= 57 do
    v = v * 10 + (c - 48)
    i = i + 1; c = byte(s, i)
  end
  if i == d0 then fail(s, pos, "unexpected character") end
  if i > d0 + 1 and byte(s, d0) == 48 then fail(s, pos, "leading zero in number") end
  local integral = true
  if c == 46 then -- .
    local f0 = i + 1
    i = f0; c = byte(s, i)
    while c and c >= 48 and c <= 57 do i = i + 1; c = byte(s, i) end
    if i == f0 then fail(s, f0 - 1, "bad number") end
    integral = false
  end
  if c == 101 or c == 69 then -- e E
    local e = i
    i = i + 1; c = byte(s, i)
    if c == 43 or c == 45 then i = i + 1; c = byte(s, i) end
    local x0 = i
    while c and c >= 48 and c <= 57 do i = i + 1; c = byte(s, i) end
    if i == x0 then fail(s, e, "bad number") end
    integral = false
  end
  if integral and i - d0 <= 15 then
    if neg then v = -v end
    return v, i
  end
  v = tonumber(sub(s, pos, i - 1))
  if not integral and mtype and mtype(v) == "integer" then v = v + 0.0 end
  return v, i
end

local decode_value

local function skip(s, pos)
  local c = byte(s, pos)
  while c == 32 or c == 10 or c == 13 or c == 9 do
    pos = pos + 1; c = byte(s, pos)
  end
  return pos
end

local function decode_array(s, pos, depth)
  if depth > MAX_DEPTH then fail(s, pos, "nesting too deep") end
  local t, n = setmetatable(tnew(4, 0), array_mt), 0
  pos = skip(s, pos + 1)
  if byte(s, pos) == 93 then return t, pos + 1 end
  while true do
    local v
    v, pos = decode_value(s, pos, depth)
    n = n + 1
    t[n] = v
    pos = skip(s, pos)
    local c = byte(s, pos)
    if c == 44 then
      pos = skip(s, pos + 1)
    elseif c == 93 then
      return t, pos + 1
    else
      fail(s, pos, "expected ',' or ']'")
    end
  end
end

local function decode_object(s, pos, depth)
  if depth > MAX_DEPTH then fail(s, pos, "nesting too deep") end
  local t = tnew(0, 4)
  pos = skip(s, pos + 1)
  if byte(s, pos) == 125 then return t, pos + 1 end
  while true do
    if byte(s, pos) ~= 34 then fail(s, pos, "expected string key") end
    local k, v
    k, pos = decode_string(s, pos)
    pos = skip(s, pos)
    if byte(s, pos) ~= 58 then fail(s, pos, "expected ':'") end
    v, pos = decode_value(s, skip(s, pos + 1), depth)
    t[k] = v
    pos = skip(s, pos)
    local c = byte(s, pos)
    if c == 44 then
      pos = skip(s, pos + 1)
    elseif c == 125 then
      return t, pos + 1
    else
      fail(s, pos, "expected ',' or '}'")
    end
  end
end

decode_value = function(s, pos, depth)
  local c = byte(s, pos)
  if c == 34 then return decode_string(s, pos) end
  if c == 123 then return decode_object(s, pos, depth + 1) end
  if c == 91 then return decode_array(s, pos, depth + 1) end
  if c == 116 then
    if sub(s, pos, pos + 3) == "true" then return true, pos + 4 end
  elseif c == 102 then
    if sub(s, pos, pos + 4) == "false" then return false, pos + 5 end
  elseif c == 110 then
    if sub(s, pos, pos + 3) == "null" then return nil, pos + 4 end
  elseif c == nil then
    fail(s, pos, "unexpected end of input")
  else
    return decode_number(s, pos)
  end
  fail(s, pos, "unexpected character")
end

local function decode_all(s)
  next_bs = 0
  local v, pos = decode_value(s, skip(s, 1), 0)
  pos = skip(s, pos)
  if pos <= #s then fail(s, pos, "trailing data") end
  return v
end

--- Decode a JSON text. Returns the value, or nil and a message on bad input.
function json.decode(s)
  if type(s) ~= "string" then return nil, "json.decode: expected a string, got " .. type(s) end
  local ok, v = pcall(decode_all, s)
  if ok then return v end
  if type(v) == "table" and v[1] == DECODE_FAIL then return nil, v[2] end
  error(v, 0) -- not a parse error (e.g. a sandbox limit): let it through
end

-- ---------------------------------------------------------------- encode

local esc_map = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
  ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
for i = 0, 31 do
  local ch = char(i)
  if not esc_map[ch] then esc_map[ch] = format("\\u%04x", i) end
end

-- Length of the leading run that needs no escaping. LuaJIT: plain finds (memchr)
-- bound the run by the next quote and backslash, then a compiled loop looks for a
-- control character 8 bytes at a time (one branch-free math.min per 8 bytes: about
-- twice as fast as testing each byte); Lua 5.4 is faster with an anchored class run.
local plain_prefix
if is_jit then
  local min = math.min
  plain_prefix = function(s, i)
    local lim = #s
    local q = find(s, '"', i, true)
    if q and q <= lim then lim = q - 1 end
    q = find(s, "\\", i, true)
    if q and q <= lim then lim = q - 1 end
    local j = i
    while j + 7 <= lim do
      if min(byte(s, j, j + 7)) < 32 then break end
      j = j + 8
    end
    for k = j, lim do
      if byte(s, k) < 32 then return k - 1 end
    end
    return lim
  end
else
  plain_prefix = function(s, i)
    local _, e = find(s, str_plain_run, i)
    return e
  end
end

local function enc_string(s)
  local e = plain_prefix(s, 1)
  local len = #s
  if e == len then return '"' .. s .. '"' end
  -- Escape char by char between plain runs: gsub over the whole string is slower.
  local buf, n, i = { '"' }, 1, 1
  while true do
    n = n + 1; buf[n] = sub(s, i, e)
    if e >= len then break end
    n = n + 1; buf[n] = esc_map[sub(s, e + 1, e + 1)]
    i = e + 2
    e = plain_prefix(s, i)
  end
  n = n + 1; buf[n] = '"'
  return concat(buf, "", 1, n)
end

local function enc_number(v)
  if v ~= v or v == huge or v == -huge then return "null" end
  if mtype then
    if mtype(v) == "integer" then return format("%d", v) end
  elseif v == floor(v) and v > -2^53 and v < 2^53 then
    return format("%d", v)
  end
  local s = format("%.14g", v)
  if tonumber(s) ~= v then s = format("%.17g", v) end
  if mtype and not find(s, "[%.eEn]") then s = s .. ".0" end
  return s
end

local function key_string(k)
  local tk = type(k)
  if tk == "string" then return k end
  if tk == "number" then return enc_number(k):gsub("%.0$", "") end
  error("json.encode: object key of type " .. tk .. " cannot be encoded", 0)
end

local encode_value

-- '{"key":' and ',"key":' for keys already seen (bounded: keys repeat, values do not).
local key_first, key_next, key_count, KEY_CACHE_MAX = {}, {}, 0, 2048
local kstack, ktop = {}, 0

local function encode_table(t, buf, n, depth)
  if depth > MAX_DEPTH then
    error("json.encode: nesting deeper than " .. MAX_DEPTH .. " (cycle?)", 0)
  end
  local marker = getmetatable(t)
  local is_array = marker == ARRAY
  local max, count = 0, 0
  if marker ~= OBJECT then
    local k = next(t)
    if k == nil then
      n = n + 1; buf[n] = is_array and "[]" or "{}"
      return n
    end
    local all_int = true
    while k ~= nil do
      count = count + 1
      if type(k) == "number" and k >= 1 and k == floor(k) then
        if k > max then max = k end
      else
        all_int = false
        if is_array then
          error("json.encode: array has non-index key '" .. tostring(k) .. "'", 0)
        end
        break
      end
      k = next(t, k)
    end
    if all_int then is_array = true end
  end
  if is_array then
    if max > 2 * count + 16 then error("json.encode: array too sparse", 0) end
    n = n + 1; buf[n] = "["
    for i = 1, max do
      if i > 1 then n = n + 1; buf[n] = "," end
      n = encode_value(t[i], buf, n, depth)
    end
    n = n + 1; buf[n] = "]"
    return n
  end
  -- Keys go on one shared stack (no table per object); nested objects push above.
  local base, nk, map = ktop, 0, nil
  for k in next, t do
    local ks = k
    if type(k) ~= "string" then
      ks = key_string(k)
      map = map or {}
      map[ks] = k
    end
    nk = nk + 1; kstack[base + nk] = ks
  end
  if nk == 0 then
    n = n + 1; buf[n] = "{}"
    return n
  end
  ktop = base + nk
  if nk <= 12 then -- insertion sort: compiled by LuaJIT, where table.sort is not
    for i = base + 2, base + nk do
      local v, j = kstack[i], i - 1
      while j > base and v < kstack[j] do
        kstack[j + 1] = kstack[j]; j = j - 1
      end
      kstack[j + 1] = v
    end
  else
    local tmp = {}
    for i = 1, nk do tmp[i] = kstack[base + i] end
    sort(tmp)
    for i = 1, nk do kstack[base + i] = tmp[i] end
  end
  for i = 1, nk do
    local ks = kstack[base + i]
    local cache = i == 1 and key_first or key_next
    local kq = cache[ks]
    if not kq then
      kq = (i == 1 and "{" or ",") .. enc_string(ks) .. ":"
      if key_count < KEY_CACHE_MAX and #ks <= 64 then
        key_count = key_count + 1
        cache[ks] = kq
      end
    end
    n = n + 1; buf[n] = kq
    local k = ks
    if map and map[ks] ~= nil then k = map[ks] end
    n = encode_value(t[k], buf, n, depth)
  end
  ktop = base
  n = n + 1; buf[n] = "}"
  return n
end

encode_value = function(v, buf, n, depth)
  local tv = type(v)
  if tv == "string" then
    -- No memo of strings seen before: this runtime serves every conversation, and
    -- keeping their text alive between calls is not worth the ~10% it would save.
    if plain_prefix(v, 1) == #v then -- no escapes: no intermediate quoted copy
      buf[n + 1] = '"'; buf[n + 2] = v; buf[n + 3] = '"'
      return n + 3
    end
    n = n + 1; buf[n] = enc_string(v)
  elseif tv == "table" then
    return encode_table(v, buf, n, depth + 1)
  elseif tv == "number" then
    n = n + 1; buf[n] = enc_number(v)
  elseif tv == "boolean" then
    n = n + 1; buf[n] = v and "true" or "false"
  elseif v == nil then
    n = n + 1; buf[n] = "null"
  else
    error("json.encode: cannot encode a value of type " .. tv, 0)
  end
  return n
end

-- The output buffer is kept between calls (growing a fresh table to ~1000 pieces
-- reallocates it about ten times); emptied after use, dropped if it grew large.
local spare_buf = nil
local SPARE_MAX = 8192

--- Encode a Lua value as JSON text. Raises on values JSON cannot hold.
function json.encode(v)
  local tv = type(v)
  if tv == "string" then return enc_string(v) end
  local buf = spare_buf or {}
  spare_buf = nil -- an encode that raises leaves it nil: the next one starts afresh
  ktop = 0 -- an earlier encode that raised may have left keys on the stack
  local n = encode_value(v, buf, 0, 0)
  local out = concat(buf, "", 1, n)
  if n <= SPARE_MAX then
    for i = 1, n do buf[i] = nil end
    spare_buf = buf
  end
  return out
end

--- Mark t (or a new table) as a JSON array, so it encodes as [] even when empty.
function json.array(t)
  if t == nil then t = {} end
  if type(t) ~= "table" then error("json.array: expected a table", 2) end
  return setmetatable(t, array_mt)
end

--- Mark t (or a new table) as a JSON object, so it encodes as {} and never as an array.
function json.object(t)
  if t == nil then t = {} end
  if type(t) ~= "table" then error("json.object: expected a table", 2) end
  return setmetatable(t, object_mt)
end

json.empty_array = setmetatable({}, {
  __metatable = ARRAY,
  __newindex = function() error("json.empty_array is read-only; use json.array() for a new array", 2) end,
})

return json
