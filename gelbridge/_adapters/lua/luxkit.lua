-- gelbridge luxkit: the helpers every Lux-native adapter needs, provided by the host.
--
-- Host code, versioned with gelbridge. lua/sandbox.lua loads this file into every
-- adapter runtime (as it loads json.lua) and installs the returned table as the
-- read-only global `luxkit`; built-in and user adapters use it instead of carrying
-- their own copies. Documented in docs/adapters.md ("luxkit").
--
-- Loaded after the sandbox has wrapped the string library and with the JIT off for
-- every function here (as for script code): these functions run on provider and
-- script data, so their pattern calls go through the same cost guard as a
-- script's and their loops count against the script's instruction and time limits.
-- Nothing here hands out a library function, a loader or the host's internals; the
-- functions are reachable only through the frozen table.
--
--   error_kind(...)            Lux error kind for the first known code (type, code, status)
--   lux_error(kind, msg, code) a Lux error object
--   lux_response(id, model, content, finish, usage, err) -> Lux response JSON text
--   error_response(err)        -> Lux response JSON text with finish "error"
--   pdata(data)                provider_data for a block (the host fills provider/model)
--   is_array(v)                a table decoded from a JSON array (or json.array())
--   args_string(v)             tool-call arguments as a JSON string ("{}" when none)
--   args_object(s)             tool-call arguments as an object
--   safe_id(s)                 s with characters outside [A-Za-z0-9_-] replaced by "_"
--   text_of(blocks, sep)       joined text of the text blocks of a Lux content list
--   media_of(block)            media_type, source type, source data of a media block
--   text_delta_json(event)     JSON text of a plain text/thinking block_delta, or nil
--   emit(events)               stream output: "", one event, or an array of events
--   stream_error(events, kind, msg, code)  emit(events) plus an error event
--   decode_response(raw, body_error)      body table, or nil + the error response to return
--   decode_chunk(data, body_error, what)  payload table, or nil + the stream output to return
--   function_tools(tools, build)          the request's function tools, each from
--                                         build(tool, parameters)
--   openai_family(flavor)      transform_request/_response/_stream_chunk for the
--                              OpenAI Chat Completions wire ("openai", "deepseek" or
--                              "openrouter")

-- `delta`: a host-private table (never reachable from a script) where
-- text_delta_json notes the last text it built and what it encodes, so the host can
-- take a chunk's result that is exactly that text without decoding its JSON.
local json, log, delta = ...

local type, tostring, tonumber, select, next, pairs, getmetatable, error =
  type, tostring, tonumber, select, next, pairs, getmetatable, error
-- The sandbox's guarded versions (see the note above).
local gsub, match, sub, format = string.gsub, string.match, string.sub, string.format
local concat = table.concat
local jdecode, jencode, jarray, jobject = json.decode, json.encode, json.array, json.object

-- ===================================================================== helpers

local ERROR_KINDS = {
  rate_limit = "rate_limit", rate_limit_error = "rate_limit", rate_limit_exceeded = "rate_limit",
  requests = "rate_limit", tokens = "rate_limit", RESOURCE_EXHAUSTED = "rate_limit", ["429"] = "rate_limit",
  authentication = "authentication", authentication_error = "authentication",
  permission_error = "authentication", invalid_api_key = "authentication",
  UNAUTHENTICATED = "authentication", PERMISSION_DENIED = "authentication",
  ["401"] = "authentication", ["403"] = "authentication",
  invalid_request = "invalid_request", invalid_request_error = "invalid_request",
  not_found_error = "invalid_request", request_too_large = "invalid_request",
  INVALID_ARGUMENT = "invalid_request", FAILED_PRECONDITION = "invalid_request",
  NOT_FOUND = "invalid_request", ["400"] = "invalid_request", ["404"] = "invalid_request",
  ["413"] = "invalid_request", ["422"] = "invalid_request",
  server_error = "server_error", api_error = "server_error", overloaded_error = "server_error",
  timeout_error = "server_error", INTERNAL = "server_error", UNAVAILABLE = "server_error",
  DEADLINE_EXCEEDED = "server_error", ["500"] = "server_error", ["502"] = "server_error",
  ["503"] = "server_error", ["504"] = "server_error", ["529"] = "server_error",
  content_filter = "content_filter", content_policy_violation = "content_filter",
}

-- Lux error kind for the first known code among the arguments (type, code, status).
local function error_kind(...)
  local n = select("#", ...)
  for i = 1, n do
    local c = select(i, ...)
    local k = c ~= nil and ERROR_KINDS[tostring(c)]
    if k then return k end
  end
  for i = 1, n do
    local s = tonumber((select(i, ...)))
    if s and s >= 400 and s < 500 then return "invalid_request" end
  end
  return "server_error"
end

local function lux_error(kind, message, code)
  local e = { kind = kind, message = type(message) == "string" and message or "the provider reported an error" }
  if code ~= nil then e.provider_code = tostring(code) end
  return e
end

local function lux_response(id, model, content, finish, usage, err)
  local out = {
    schema_version = "v1", id = id or "", model = model or "",
    choices = { { index = 0, message = { role = "assistant", content = content }, finish_reason = finish } },
  }
  if usage then out.usage = usage end
  if err then out.error = err end
  return jencode(out)
end

local function error_response(err)
  return lux_response("", "", jarray(), "error", nil, err)
end

-- provider_data for a block; the host fills in provider and model.
local function pdata(data)
  return { provider = "", model = "", data = jobject(data) }
end

local function is_array(v)
  return type(v) == "table" and getmetatable(v) == "json.array"
end

-- Tool-call arguments as the JSON string Lux wants ("{}" when there are none).
local function args_string(v)
  if type(v) == "string" then
    if v == "" then return "{}" end
    return v
  end
  if type(v) == "table" then
    if next(v) == nil and not is_array(v) then return "{}" end
    return jencode(v)
  end
  return "{}"
end

-- Tool-call arguments as an object (providers that want objects on the wire).
local function args_object(s)
  if type(s) == "table" then return s end
  if type(s) == "string" and s ~= "" then
    local v = jdecode(s)
    if type(v) == "table" and not is_array(v) then return jobject(v) end
    log("warn", "tool call arguments are not a JSON object; sent as {}")
  end
  return jobject()
end

local function safe_id(s)
  return (gsub(tostring(s or ""), "[^%w_-]", "_"))
end

-- Joined text of the text blocks in a Lux content list.
local function text_of(blocks, sep)
  local parts, n = {}, 0
  if type(blocks) ~= "table" then return "" end
  for i = 1, #blocks do
    local b = blocks[i]
    if b and b.type == "text" and type(b.text) == "string" then
      n = n + 1; parts[n] = b.text
    end
  end
  return concat(parts, sep or "\n")
end

local function media_of(b)
  local m = b[b.type]
  if type(m) ~= "table" or type(m.source) ~= "table" then return nil end
  return m.media_type or "application/octet-stream", m.source.type, m.source.data
end

-- The bulk of a stream is one text or thinking delta per chunk: its JSON is built
-- directly, the same bytes jencode gives (sorted keys), without the generic walk.
local TEXT_DELTA = { text = '"},"event":"block_delta","index":', thinking = '"},"event":"block_delta","index":' }
-- t: "text" or "thinking"; idx: a block index (an integer in [0, 2^31)).
local function delta_json(t, idx, text)
  local s = '{"delta":{"text":' .. jencode(text) .. ',"type":"' .. t .. TEXT_DELTA[t] .. format("%d", idx) .. "}"
  if delta then delta.json, delta.type, delta.index, delta.text = s, t, idx, text end
  return s
end

local function text_delta_json(e)
  local d, idx = e.delta, e.index
  if type(d) ~= "table" or type(idx) ~= "number" or idx < 0 or idx >= 2147483648 or idx % 1 ~= 0 then return nil end
  local t, text = d.type, d.text
  local tail = TEXT_DELTA[t]
  if not tail or type(text) ~= "string" then return nil end
  if next(e, next(e, next(e, next(e)))) ~= nil or next(d, next(d, next(d))) ~= nil then return nil end
  return delta_json(t, idx, text)
end

-- Stream output: "" for no event, one event object, or an array of events.
local function emit(events)
  local n = #events
  if n == 0 then return "" end
  if n == 1 then
    local e = events[1]
    if e.event == "block_delta" then
      local s = text_delta_json(e)
      if s then return s end
    end
    return jencode(e)
  end
  return jencode(events)
end

local function stream_error(events, kind, message, code)
  events[#events + 1] = { event = "error", error = lux_error(kind, message, code) }
  return emit(events)
end

-- A provider's response body as a table; or nil and the Lux response to return: an
-- error response for a body that is not JSON, or for one with an `error` member
-- (body_error turns the provider's error value into a Lux error).
local function decode_response(raw, body_error)
  local body = jdecode(raw)
  if type(body) ~= "table" then
    return nil, error_response(lux_error("server_error", "the provider answered with a body that is not JSON"))
  end
  if body.error ~= nil then return nil, error_response(body_error(body.error)) end
  return body
end

-- One stream payload as a table; or nil and the stream output to return: an error
-- event for a payload that is not JSON ("the provider sent a stream <what> that is
-- not JSON"), or for one with an `error` member.
local function decode_chunk(data, body_error, what)
  local ch = jdecode(data)
  if type(ch) ~= "table" then
    return nil, stream_error({}, "server_error", "the provider sent a stream " .. (what or "chunk") .. " that is not JSON")
  end
  if ch.error ~= nil then return nil, emit({ { event = "error", error = body_error(ch.error) } }) end
  return ch
end

-- A cited web page (provider-native search) as a Lux url annotation; nil without a url.
local function url_annotation(url, title)
  if type(url) ~= "string" or url == "" then return nil end
  return { kind = "url", ref = url, text = type(title) == "string" and title or nil }
end

-- The url annotations of a provider's citation list: pick(entry) returns its
-- (url, title), or nothing to leave it out; nil when no entry gives one.
local function url_annotations(list, pick)
  if type(list) ~= "table" then return nil end
  local out, n = jarray(), 0
  for i = 1, #list do
    local e = list[i]
    local a = type(e) == "table" and url_annotation(pick(e, i))
    if a then n = n + 1; out[n] = a end
  end
  return n > 0 and out or nil
end

-- Prompt caching: whether the host turned it off for this provider
-- (metadata.prompt_cache = "off"), and the conversation's stable cache key
-- (metadata.cache_key, derived from no content) for providers that route by one.
local function prompt_cache_on(req)
  local m = req.metadata
  return not (type(m) == "table" and m.prompt_cache == "off")
end

local function prompt_cache_key(req)
  local m = req.metadata
  if type(m) ~= "table" or m.prompt_cache == "off" or type(m.cache_key) ~= "string" or m.cache_key == "" then
    return nil
  end
  return m.cache_key
end

-- The function tools of a Lux request in the provider's shape: build(tool, parameters)
-- for each (parameters: the tool's JSON schema, or an empty object schema; a nil
-- result leaves the tool out); other tool kinds are dropped with a warning.
local function function_tools(tools, build)
  local out = jarray()
  if type(tools) ~= "table" then return out end
  for i = 1, #tools do
    local t = tools[i]
    if (t.kind or "function") == "function" then
      local d = build(t, t.parameters or { type = "object", properties = jobject() })
      if d ~= nil then out[#out + 1] = d end
    else
      log("warn", "tool kind " .. tostring(t.kind) .. " is not supported by this adapter; dropped")
    end
  end
  return out
end

-- ============================================== OpenAI Chat Completions family
-- OpenAI Chat Completions, for OpenAI and OpenAI-compatible hosts (OpenRouter,
-- Mistral, Groq, GitHub Models: configuration only) and DeepSeek.
--
-- Request:  instructions -> one leading system message; user text/images (image_url,
--           data: URLs for inline), PDFs (file.file_data), wav/mp3 (input_audio);
--           assistant text + tool_calls; tool messages; tools, tool_choice,
--           response_format, reasoning_effort, stream_options.include_usage.
-- Response: reasoning_content / reasoning -> thinking (visible; for deepseek tagged
--           with provider_data so it is sent back to the same model), content ->
--           text, refusal -> refusal, tool_calls -> tool_use. Usage incl. reasoning
--           and cached tokens. Stream: one block per kind, tool calls keyed by index.
-- Flavor "deepseek":
--   * reasoning -> thinking {type = enabled|disabled} (+ reasoning_effort low/high/max);
--     max_output_tokens is always max_tokens;
--   * reasoning_content comes back as a thinking block tagged with provider_data, and
--     is sent back as reasoning_content on assistant turns of the same model (the host
--     keeps provider_data only for that model); DeepSeek requires it after tool calls.

local FINISH = {
  stop = "stop", length = "length", tool_calls = "tool_calls", function_call = "tool_calls",
  content_filter = "content_filter", insufficient_system_resource = "error",
}

local AUDIO_FORMATS = { ["audio/wav"] = "wav", ["audio/x-wav"] = "wav", ["audio/mpeg"] = "mp3", ["audio/mp3"] = "mp3" }

-- ---------------------------------------------------------------- request

local function user_part(b)
  local t = b.type
  if t == "text" then return { type = "text", text = b.text } end
  if t == "image" or t == "file" or t == "audio" then
    local mt, st, data = media_of(b)
    if not mt then return nil end
    if t == "image" and (st == "url" or st == "file_uri") then
      return { type = "image_url", image_url = { url = data } }
    end
    if st == "inline" then
      if t == "image" then
        return { type = "image_url", image_url = { url = "data:" .. mt .. ";base64," .. data } }
      end
      if t == "file" then
        return { type = "file", file = { filename = "document", file_data = "data:" .. mt .. ";base64," .. data } }
      end
      local fmt = AUDIO_FORMATS[mt]
      if fmt then return { type = "input_audio", input_audio = { data = data, format = fmt } } end
    end
  end
  log("warn", "a " .. tostring(t) .. " block cannot be sent to this provider; dropped")
  return nil
end

local function tool_message(r)
  local c = r.content
  local text
  -- one text block (the usual result): its text as is, without a join
  if type(c) == "table" and #c == 1 and c[1].type == "text" and type(c[1].text) == "string" then
    text = c[1].text
  else
    text = text_of(c, "\n")
  end
  return { role = "tool", tool_call_id = r.tool_use_id, content = text }
end

local function assistant_message(content, deep, details_back)
  local text, texts, nt, calls, nc, reasoning, nr = nil, nil, 0, nil, 0, nil, 0
  local details = nil
  for i = 1, #content do
    local b = content[i]
    local t = b.type
    if t == "text" then
      nt = nt + 1
      if nt == 1 then
        text = b.text
      else
        if nt == 2 then texts = { text } end
        texts[nt] = b.text
      end
    elseif t == "tool_use" then
      local u = b.tool_use
      if not calls then calls = jarray() end
      nc = nc + 1
      calls[nc] = { id = u.id, type = "function",
        ["function"] = { name = u.name, arguments = args_string(u.arguments) } }
    elseif t == "thinking" and deep and b.provider_data and not b.thinking.redacted then
      -- provider_data here means: produced by this very model (the host filtered it).
      if not reasoning then reasoning = {} end
      nr = nr + 1; reasoning[nr] = b.thinking.text or ""
    elseif t == "thinking" and details_back and type(b.provider_data) == "table" then
      -- OpenRouter: the reasoning_details array of this model's turn, passed back unchanged
      local d = type(b.provider_data.data) == "table" and b.provider_data.data.reasoning_details
      if is_array(d) then
        if not details then details = jarray() end
        for j = 1, #d do details[#details + 1] = d[j] end
      end
    end
  end
  local m = { role = "assistant", content = "" }
  if nt > 1 then
    m.content = concat(texts, "")
  elseif nt == 1 and type(text) == "string" then
    m.content = text
  elseif nt == 1 then
    m.content = concat({ text }, "")
  end
  if nc > 0 then m.tool_calls = calls end
  if nr > 0 then m.reasoning_content = concat(reasoning, "") end
  if details then m.reasoning_details = details end
  return m
end

local function push_message(out, role, content, deep, details_back)
  if role == "assistant" then
    out[#out + 1] = assistant_message(content, deep, details_back)
    return
  end
  if role ~= "user" and role ~= "system" and role ~= "developer" then role = nil end
  local n = #content
  if n == 1 then -- the usual user message: one text block, sent as a string
    local b = content[1]
    if b.type == "text" and type(b.text) == "string" then
      out[#out + 1] = { role = role or "user", content = b.text }
      return
    end
  end
  local parts, np, only_text = nil, 0, true
  for i = 1, n do
    local b = content[i]
    local t = b.type
    if t == "tool_result" then
      out[#out + 1] = tool_message(b.tool_result)
    elseif t ~= "thinking" and t ~= "tool_use" then
      local p = user_part(b)
      if p then
        if not parts then parts = jarray() end
        np = np + 1; parts[np] = p
        if p.type ~= "text" then only_text = false end
      end
    end
  end
  if np == 0 then return end
  if only_text then
    local texts = {}
    for i = 1, #parts do texts[i] = parts[i].text end
    out[#out + 1] = { role = role or "user", content = concat(texts, "\n\n") }
  else
    out[#out + 1] = { role = role or "user", content = parts }
  end
end

local function openai_tool(t, parameters)
  local fn = { name = t.name, parameters = parameters }
  if t.description then fn.description = t.description end
  if t.strict ~= nil then fn.strict = t.strict end
  return { type = "function", ["function"] = fn }
end

local REASONING_MODEL = { o1 = true, o3 = true, o4 = true }

-- Answers per model id, remembered (a runtime sees a handful of models; the two
-- guarded pattern calls cost more than the rest of a small request's conversion).
local completion_tokens_of, completion_tokens_n = {}, 0

local function uses_completion_tokens(model)
  model = model or ""
  local known = completion_tokens_of[model]
  if known ~= nil then return known end
  local m = match(model, "([^/]*)$") or ""
  local family = match(m, "^(o%d)") or ""
  local yes = REASONING_MODEL[family] or sub(m, 1, 5) == "gpt-5"
  if completion_tokens_n < 64 and type(model) == "string" then
    completion_tokens_n = completion_tokens_n + 1
    completion_tokens_of[model] = yes
  end
  return yes
end

local DEEPSEEK_EFFORT = { minimal = "low", low = "low", medium = "high", high = "high", xhigh = "max" }

local function effort_from_budget(b)
  if b <= 2048 then return "low" elseif b <= 8192 then return "medium" end
  return "high"
end

-- ---------------------------------------------------------------- response

local function usage_of(u)
  if type(u) ~= "table" then return nil end
  local p, c = u.prompt_tokens or 0, u.completion_tokens or 0
  local out = { prompt_tokens = p, completion_tokens = c, total_tokens = u.total_tokens or (p + c) }
  local cd, pd = u.completion_tokens_details, u.prompt_tokens_details
  if type(cd) == "table" and cd.reasoning_tokens then out.reasoning_tokens = cd.reasoning_tokens end
  if type(pd) == "table" and pd.cached_tokens then out.cached_tokens = pd.cached_tokens end
  if u.prompt_cache_hit_tokens then out.cached_tokens = u.prompt_cache_hit_tokens end
  return out
end

local function thinking_block(text, deep)
  local b = { type = "thinking", thinking = { text = text, redacted = false } }
  if deep then b.provider_data = pdata({ reasoning_content = true }) end
  return b
end

-- the provider's own id, or "" when it gives none (some gateways and local servers):
-- the host then names the call after the reply it is written in
local function call_id(id)
  if type(id) == "string" and id ~= "" then return id end
  return ""
end

local function body_error(e)
  if type(e) ~= "table" then return lux_error("server_error", tostring(e)) end
  return lux_error(error_kind(e.type, e.code, e.status), e.message, e.code or e.type)
end

-- ---------------------------------------------------------------- stream

local function close_block(events, state, key)
  local idx = state[key]
  if idx then
    events[#events + 1] = { event = "block_end", index = idx }
    state[key] = nil
  end
end

local function open_block(events, state, key, block_type)
  local idx = state[key]
  if idx then return idx end
  idx = state.next or 0
  state.next = idx + 1
  state[key] = idx
  events[#events + 1] = { event = "block_start", index = idx, block_type = block_type }
  return idx
end

-- OpenRouter's reasoning_details belong to the step's first thinking block (where the
-- JSON answer puts them: one block with the reasoning text and all the details), which
-- is opened by the first reasoning text or details piece and stays open until the end
-- of the stream (text and calls start beside it), when the merged details are complete.
local function open_details_block(events, state)
  if state.details_block then return state.details_block end
  local idx = open_block(events, state, "thinking", "thinking")
  state.details_block = idx
  return idx
end

-- Text or a call begins: the thinking block ends, except the one that takes the details.
local function close_thinking(events, state)
  if state.thinking ~= nil and state.thinking == state.details_block then
    state.thinking = nil -- no new reasoning text joins it; its block_end comes at the finish
    return
  end
  close_block(events, state, "thinking")
end

local function close_all(events, state)
  close_thinking(events, state)
  close_block(events, state, "text")
  close_block(events, state, "refusal")
  local calls = state.calls
  if calls then
    for _, c in pairs(calls) do
      if not c.closed then
        events[#events + 1] = { event = "block_end", index = c.block }
        c.closed = true
      end
    end
  end
end

local function finish_stream(events, state, fr)
  if state.finished then return end
  state.finished = true
  close_all(events, state)
  local idx = state.details_block
  if idx then
    if state.details and #state.details > 0 then
      events[#events + 1] = { event = "block_delta", index = idx,
        delta = { type = "provider_data", provider_data = pdata({ reasoning_details = state.details }) } }
    end
    events[#events + 1] = { event = "block_end", index = idx }
  end
  events[#events + 1] = { event = "finish", finish_reason = FINISH[fr] or fr }
  events[#events + 1] = { event = "done" }
end

local function stream_tool_call(events, state, tc, n)
  local calls = state.calls
  if not calls then calls = {}; state.calls = calls end
  local key = tostring(tc.index or n)
  local c = calls[key]
  local id = tc.id
  local fn = tc["function"] or {}
  if c and type(id) == "string" and id ~= "" and id ~= c.id then
    -- a server that reuses an index for another call: a new block
    if not c.closed then events[#events + 1] = { event = "block_end", index = c.block } end
    c.closed = true
    c = nil
  end
  if not c then
    close_thinking(events, state)
    close_block(events, state, "text")
    state.ncalls = (state.ncalls or 0) + 1
    local idx = state.next or 0
    state.next = idx + 1
    c = { block = idx, id = call_id(id), name = fn.name or "" }
    calls[key] = c
    events[#events + 1] = { event = "block_start", index = idx,
      block_type = { type = "tool_call", id = c.id, name = c.name } }
  elseif fn.name and fn.name ~= "" and c.name == "" then
    c.name = fn.name
    events[#events + 1] = { event = "block_start", index = c.block,
      block_type = { type = "tool_call", id = c.id, name = c.name } }
  end
  local a = fn.arguments
  if type(a) == "table" then a = args_string(a) end
  if type(a) == "string" and a ~= "" then
    events[#events + 1] = { event = "block_delta", index = c.block, delta = { type = "tool_arguments", arguments = a } }
  end
end

-- OpenRouter's reasoning_details, streamed in pieces: entries of one `index` (and type)
-- are one block whose string fields (text, summary, data) grow; other fields (signature,
-- id, format) are taken as they arrive, except that an empty string (the "" signature
-- of an entry's opening piece) never replaces a value. Returns whether a piece came.
local DETAIL_STRINGS = { text = true, summary = true, data = true }

local function merge_details(state, pieces)
  local merged, by = state.details, state.details_by
  if not merged then merged = jarray(); by = {}; state.details = merged; state.details_by = by end
  local got = false
  for i = 1, #pieces do
    local p = pieces[i]
    if type(p) == "table" then
      got = true
      local key = tostring(p.index or #merged) .. "\0" .. tostring(p.type)
      local e = by[key]
      if not e then
        e = {}
        by[key] = e
        merged[#merged + 1] = e
      end
      for k, v in pairs(p) do
        local old = e[k]
        if DETAIL_STRINGS[k] and type(v) == "string" and type(old) == "string" then
          e[k] = old .. v
        elseif v ~= "" or old == nil then
          e[k] = v
        end
      end
    end
  end
  return got
end

local FLAVORS = { openai = true, deepseek = true, openrouter = true }

-- Whether nothing in a chunk after its content adds an event (no refusal, tool calls,
-- finish reason or usage): the tests of transform_stream_chunk below, in one place.
local function plain_tail(ch, choice, d)
  if type(d.refusal) == "string" and d.refusal ~= "" then return false end
  if type(d.tool_calls) == "table" or choice.finish_reason then return false end
  return type(ch.usage or (type(ch.x_groq) == "table" and ch.x_groq.usage)) ~= "table"
end

-- A fresh table of the three transforms for one flavor (the caller may wrap them).
local function openai_family(flavor)
  if not FLAVORS[flavor] then
    error('luxkit.openai_family: flavor must be "openai", "deepseek" or "openrouter", got ' .. tostring(flavor), 2)
  end
  local DEEPSEEK = flavor == "deepseek"
  local OPENROUTER = flavor == "openrouter"
  local family = {}

  function family.transform_request(lux_json)
    local req = jdecode(lux_json)
    if type(req) ~= "table" then error("transform_request: the request is not JSON", 0) end
    local messages = jarray()
    local body = { model = req.model, messages = messages }
    local system = text_of(req.instructions, "\n\n")
    if system ~= "" then messages[1] = { role = "system", content = system } end
    local conv = req.conversation or {}
    for i = 1, #conv do
      local item = conv[i]
      local m = item.type == "message" and item.message
      if m then push_message(messages, m.role, m.content or {}, DEEPSEEK, OPENROUTER) end
    end

    local tools = function_tools(req.tools, openai_tool)
    if #tools > 0 then body.tools = tools end
    local tc = req.tool_choice
    if body.tools and tc ~= nil then
      if type(tc) == "table" then
        body.tool_choice = { type = "function", ["function"] = { name = tc.name } }
      else
        body.tool_choice = tc
      end
    end

    local o = req.options or {}
    body.temperature, body.top_p, body.seed = o.temperature, o.top_p, o.seed
    if o.stop and #o.stop > 0 then body.stop = o.stop end
    if o.max_output_tokens then
      if not DEEPSEEK and uses_completion_tokens(req.model) then
        body.max_completion_tokens = o.max_output_tokens
      else
        body.max_tokens = o.max_output_tokens
      end
    end
    if o.candidate_count and o.candidate_count > 1 then body.n = o.candidate_count end
    local so = o.structured_output
    if so == "json_object" then
      body.response_format = { type = "json_object" }
    elseif type(so) == "table" and so.type == "json_schema" then
      local js = { name = so.name or "response", schema = so.schema }
      if so.strict ~= nil then js.strict = so.strict end
      body.response_format = { type = "json_schema", json_schema = js }
    end
    if o.stream then
      body.stream = true
      body.stream_options = { include_usage = true }
    end

    local r = req.reasoning
    if type(r) == "table" then
      local effort = r.effort
      if effort == nil and r.budget_tokens then effort = effort_from_budget(r.budget_tokens) end
      if DEEPSEEK then
        body.thinking = { type = r.enabled and "enabled" or "disabled" }
        if r.enabled and effort then body.reasoning_effort = DEEPSEEK_EFFORT[effort] or effort end
      elseif OPENROUTER then -- the unified reasoning parameter
        body.reasoning = r.enabled and { effort = effort or "medium" } or { enabled = false }
      elseif r.enabled and effort then
        body.reasoning_effort = effort
      end
    end

    local key = prompt_cache_key(req)
    if key and OPENROUTER then
      body.session_id = key -- OpenRouter's sticky routing key: the conversation stays on one cache
    elseif key and not DEEPSEEK then
      body.prompt_cache_key = key -- DeepSeek caches by prefix alone
    end

    local extras = o.extras
    if type(extras) == "table" then
      for k, v in pairs(extras) do
        if k ~= "model" and k ~= "messages" and k ~= "stream" and k ~= "previous_response_id" then body[k] = v end
      end
    end
    return jencode(body)
  end

  function family.transform_response(raw)
    local body, failed = decode_response(raw, body_error)
    if not body then return failed end
    local choice = body.choices and body.choices[1]
    if type(choice) ~= "table" then
      return error_response(lux_error("server_error", "the provider answered without choices"))
    end
    local msg = choice.message or {}
    local content = jarray()
    local reasoning = msg.reasoning_content or msg.reasoning
    local details = OPENROUTER and is_array(msg.reasoning_details) and #msg.reasoning_details > 0
      and msg.reasoning_details
    if (type(reasoning) == "string" and reasoning ~= "") or details then
      local b = thinking_block(type(reasoning) == "string" and reasoning or "", DEEPSEEK)
      if details then b.provider_data = pdata({ reasoning_details = details }) end
      content[#content + 1] = b
    end
    local c = msg.content
    if type(c) == "string" and c ~= "" then
      content[#content + 1] = { type = "text", text = c }
    elseif type(c) == "table" then -- content parts (Mistral reasoning models)
      for i = 1, #c do
        local p = c[i]
        if p.type == "text" and p.text ~= "" then
          content[#content + 1] = { type = "text", text = p.text }
        elseif p.type == "thinking" then
          local th = type(p.thinking) == "table" and text_of(p.thinking, "") or tostring(p.thinking or "")
          if th ~= "" then content[#content + 1] = thinking_block(th, DEEPSEEK) end
        end
      end
    end
    if type(msg.refusal) == "string" and msg.refusal ~= "" then
      content[#content + 1] = { type = "refusal", refusal = msg.refusal }
    end
    local calls = msg.tool_calls
    if type(calls) == "table" then
      for i = 1, #calls do
        local tc = calls[i]
        local fn = tc["function"] or tc
        if fn.name then
          content[#content + 1] = { type = "tool_use", tool_use = {
            id = call_id(tc.id), name = fn.name, arguments = args_string(fn.arguments) } }
        end
      end
    end
    local fr = choice.finish_reason
    local finish = fr and (FINISH[fr] or fr) or "stop"
    return lux_response(body.id, body.model, content, finish, usage_of(body.usage))
  end

  function family.transform_stream_chunk(data, state)
    local events = {}
    if data == "[DONE]" then
      if not state.finished then finish_stream(events, state, "stop") end
      return emit(events)
    end
    local ch, failed = decode_chunk(data, body_error, "chunk")
    if not ch then return failed end
    if not state.started then
      state.started = true
      state.id = ch.id
      events[#events + 1] = { event = "conversation_start", meta = { id = ch.id, model = ch.model } }
    end
    local choice = ch.choices and ch.choices[1]
    if type(choice) == "table" then
      local d = choice.delta or {}
      if OPENROUTER and is_array(d.reasoning_details) and not state.finished
          and merge_details(state, d.reasoning_details) then
        open_details_block(events, state)
      end
      local r = d.reasoning_content or d.reasoning
      if type(r) == "string" and r ~= "" then
        local fresh = state.thinking == nil
        local idx
        if OPENROUTER and not state.details_block then
          idx = open_details_block(events, state)
        else
          idx = open_block(events, state, "thinking", "thinking")
        end
        if fresh and DEEPSEEK then
          events[#events + 1] = { event = "block_delta", index = idx,
            delta = { type = "provider_data", provider_data = pdata({ reasoning_content = true }) } }
        end
        events[#events + 1] = { event = "block_delta", index = idx, delta = { type = "thinking", text = r } }
      end
      local c = d.content
      if type(c) == "string" and c ~= "" then
        close_thinking(events, state)
        local idx = open_block(events, state, "text", "text")
        if #events == 0 and plain_tail(ch, choice, d) then
          return delta_json("text", idx, c) -- the bulk of a stream: no event tables
        end
        events[#events + 1] = { event = "block_delta", index = idx, delta = { type = "text", text = c } }
      end
      if type(d.refusal) == "string" and d.refusal ~= "" then
        local idx = open_block(events, state, "refusal", "refusal")
        events[#events + 1] = { event = "block_delta", index = idx, delta = { type = "refusal", text = d.refusal } }
      end
      local calls = d.tool_calls
      if type(calls) == "table" then
        for i = 1, #calls do stream_tool_call(events, state, calls[i], i - 1) end
      end
      if choice.finish_reason then finish_stream(events, state, choice.finish_reason) end
    end
    local u = ch.usage or (type(ch.x_groq) == "table" and ch.x_groq.usage)
    if type(u) == "table" then events[#events + 1] = { event = "usage", usage = usage_of(u) } end
    return emit(events)
  end

  return family
end

-- ===================================================================== exports
-- Only functions: the sandbox freezes this table and publishes it as `luxkit`.

return {
  error_kind = error_kind, lux_error = lux_error, lux_response = lux_response,
  error_response = error_response, pdata = pdata, is_array = is_array,
  args_string = args_string, args_object = args_object, safe_id = safe_id,
  text_of = text_of, media_of = media_of, text_delta_json = text_delta_json,
  emit = emit, stream_error = stream_error, decode_response = decode_response,
  decode_chunk = decode_chunk, function_tools = function_tools, openai_family = openai_family,
  prompt_cache_on = prompt_cache_on, prompt_cache_key = prompt_cache_key,
  url_annotation = url_annotation, url_annotations = url_annotations,
}
