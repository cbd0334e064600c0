-- gelbridge built-in adapter: Ollama native chat API (/api/chat, NDJSON streaming).
--
-- Request:  instructions -> leading system message; user text + inline images
--           (images: [base64]); assistant content, thinking and tool_calls with
--           arguments as OBJECTS; tool results -> role tool with tool_name (found from
--           the matching tool_use); tools; tool_choice none -> no tools, a specific
--           tool -> only that tool offered (Ollama has no tool_choice); think
--           (reasoning on/off, or extras.think for levels); format (json / schema);
--           options {temperature, top_p, top_k, num_predict, stop, seed}.
-- Response: thinking, content, tool_calls (ids "call_<created_at>_<n>" when Ollama
--           sends none; arguments object -> JSON string); done_reason mapped (stop
--           with calls -> tool_calls); usage from prompt_eval_count / eval_count.
-- Stream:   one JSON object per line; tool calls arrive whole; done: true ends it;
--           {"error": ...} lines become error events.
-- Written for gelbridge (not derived from other adapters).

local adapter = {
  name = "ollama",
  version = "1.0.0",
  format = "lux-ir-v1",
  endpoint = "/api/chat",
  stream_format = "ndjson",
  auth = "none",
  headers = {},
}

-- ===== shared block (identical in every built-in adapter; a test checks it) =====
local json = json
local jdecode, jencode, jarray, jobject = json.decode, json.encode, json.array, json.object
local concat = table.concat

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
  return (string.gsub(tostring(s or ""), "[^%w_-]", "_"))
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
local function text_delta_json(e)
  local d, idx = e.delta, e.index
  if type(d) ~= "table" or type(idx) ~= "number" or idx < 0 or idx >= 2147483648 or idx % 1 ~= 0 then return nil end
  local t, text = d.type, d.text
  local tail = TEXT_DELTA[t]
  if not tail or type(text) ~= "string" then return nil end
  if next(e, next(e, next(e, next(e)))) ~= nil or next(d, next(d, next(d))) ~= nil then return nil end
  return '{"delta":{"text":' .. jencode(text) .. ',"type":"' .. t .. tail .. string.format("%d", idx) .. "}"
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
-- ===== end of shared block =====

local FINISH = { stop = "stop", length = "length", load = "stop", unload = "stop" }

-- ---------------------------------------------------------------- request

local function push(out, role, content, names)
  local texts, nt, images, thinking, nth = {}, 0, jarray(), {}, 0
  local calls = jarray()
  for i = 1, #content do
    local b = content[i]
    local t = b.type
    if t == "text" then
      nt = nt + 1; texts[nt] = b.text
    elseif t == "tool_result" then
      local r = b.tool_result
      local m = { role = "tool", content = text_of(r.content, "\n") }
      local name = names[r.tool_use_id]
      if name then m.tool_name = name end
      out[#out + 1] = m
    elseif t == "tool_use" then
      local u = b.tool_use
      names[u.id] = u.name
      calls[#calls + 1] = { ["function"] = { name = u.name, arguments = args_object(u.arguments) } }
    elseif t == "thinking" then
      if not b.thinking.redacted and (b.thinking.text or "") ~= "" then
        nth = nth + 1; thinking[nth] = b.thinking.text
      end
    elseif t == "image" then
      local _, st, data = media_of(b)
      if st == "inline" then
        images[#images + 1] = data
      else
        log("warn", "Ollama takes only inline images; an image url was dropped")
      end
    elseif t ~= "refusal" then
      log("warn", "a " .. tostring(t) .. " block cannot be sent to Ollama; dropped")
    end
  end
  if nt == 0 and #images == 0 and #calls == 0 and nth == 0 then return end
  if role ~= "assistant" and role ~= "system" then role = "user" end
  local m = { role = role, content = concat(texts, role == "assistant" and "" or "\n\n") }
  if #images > 0 then m.images = images end
  if #calls > 0 then m.tool_calls = calls end
  if nth > 0 and role == "assistant" then m.thinking = concat(thinking, "") end
  out[#out + 1] = m
end

function adapter.transform_request(lux_json)
  local req = jdecode(lux_json)
  if type(req) ~= "table" then error("transform_request: the request is not JSON") end
  local messages = jarray()
  local sys = text_of(req.instructions, "\n\n")
  if sys ~= "" then messages[1] = { role = "system", content = sys } end
  local names = {}
  local conv = req.conversation or {}
  for i = 1, #conv do
    local item = conv[i]
    if item.type == "message" and item.message then
      push(messages, item.message.role, item.message.content or {}, names)
    end
  end
  local o = req.options or {}
  local body = { model = req.model, messages = messages, stream = o.stream == true }

  local tools, tc = req.tools, req.tool_choice
  if type(tools) == "table" and #tools > 0 and tc ~= "none" then
    local only = type(tc) == "table" and tc.name or nil
    local out = jarray()
    for i = 1, #tools do
      local t = tools[i]
      if (t.kind or "function") == "function" and (only == nil or t.name == only) then
        local fn = { name = t.name, parameters = t.parameters or { type = "object", properties = jobject() } }
        if t.description then fn.description = t.description end
        out[#out + 1] = { type = "function", ["function"] = fn }
      end
    end
    if #out > 0 then body.tools = out end
  end

  local opts = {}
  opts.temperature, opts.top_p, opts.top_k, opts.seed = o.temperature, o.top_p, o.top_k, o.seed
  opts.num_predict = o.max_output_tokens
  if o.stop and #o.stop > 0 then opts.stop = o.stop end
  local so = o.structured_output
  if so == "json_object" then
    body.format = "json"
  elseif type(so) == "table" and so.type == "json_schema" then
    body.format = so.schema
  end
  local r = req.reasoning
  if type(r) == "table" then body.think = r.enabled == true end
  local extras = o.extras
  if type(extras) == "table" then
    for k, v in pairs(extras) do
      if k == "think" or k == "keep_alive" or k == "format" then
        body[k] = v
      elseif k ~= "previous_response_id" then
        opts[k] = v -- model options (num_ctx, repeat_penalty, ...)
      end
    end
  end
  if next(opts) ~= nil then body.options = opts end
  return jencode(body)
end

-- ---------------------------------------------------------------- response

local function usage_of(b)
  if b.prompt_eval_count == nil and b.eval_count == nil then return nil end
  local p, c = b.prompt_eval_count or 0, b.eval_count or 0
  return { prompt_tokens = p, completion_tokens = c, total_tokens = p + c }
end

local function call_id(tc, stamp, n)
  if type(tc.id) == "string" and tc.id ~= "" then return tc.id end
  return "call_" .. string.gsub(tostring(stamp or ""), "%D", "") .. "_" .. n
end

local function finish_of(reason, had_calls)
  local f = FINISH[reason or "stop"] or reason
  if f == "stop" and had_calls then return "tool_calls" end
  return f
end

local function body_error(e)
  return lux_error(error_kind(type(e) == "table" and (e.type or e.code) or nil), type(e) == "table" and e.message or e)
end

function adapter.transform_response(raw)
  local body = jdecode(raw)
  if type(body) ~= "table" then
    return error_response(lux_error("server_error", "the provider answered with a body that is not JSON"))
  end
  if body.error ~= nil then return error_response(body_error(body.error)) end
  local msg = body.message or {}
  local content = jarray()
  if type(msg.thinking) == "string" and msg.thinking ~= "" then
    content[#content + 1] = { type = "thinking", thinking = { text = msg.thinking, redacted = false } }
  end
  if type(msg.content) == "string" and msg.content ~= "" then
    content[#content + 1] = { type = "text", text = msg.content }
  end
  local calls = msg.tool_calls or {}
  for i = 1, #calls do
    local fn = calls[i]["function"] or {}
    content[#content + 1] = { type = "tool_use", tool_use = {
      id = call_id(calls[i], body.created_at, i - 1), name = fn.name or "", arguments = args_string(fn.arguments) } }
  end
  local id = "ollama_" .. safe_id(body.created_at)
  return lux_response(id, body.model, content, finish_of(body.done_reason, #calls > 0), usage_of(body))
end

-- ---------------------------------------------------------------- stream

local function text_into(events, state, kind, text)
  if state.open_kind ~= kind then
    if state.open then events[#events + 1] = { event = "block_end", index = state.open } end
    local idx = state.next or 0
    state.next = idx + 1
    state.open, state.open_kind = idx, kind
    events[#events + 1] = { event = "block_start", index = idx, block_type = kind }
  end
  events[#events + 1] = { event = "block_delta", index = state.open, delta = { type = kind, text = text } }
end

function adapter.transform_stream_chunk(data, state)
  local events = {}
  local ch = jdecode(data)
  if type(ch) ~= "table" then
    return stream_error(events, "server_error", "the provider sent a stream line that is not JSON")
  end
  if ch.error ~= nil then
    events[1] = { event = "error", error = body_error(ch.error) }
    return emit(events)
  end
  if not state.started then
    state.started = true
    state.stamp = ch.created_at
    events[1] = { event = "conversation_start", meta = { id = "ollama_" .. safe_id(ch.created_at), model = ch.model } }
  end
  local msg = ch.message
  if type(msg) == "table" then
    if type(msg.thinking) == "string" and msg.thinking ~= "" then text_into(events, state, "thinking", msg.thinking) end
    if type(msg.content) == "string" and msg.content ~= "" then text_into(events, state, "text", msg.content) end
    local calls = msg.tool_calls
    if type(calls) == "table" and #calls > 0 then
      if state.open then
        events[#events + 1] = { event = "block_end", index = state.open }
        state.open, state.open_kind = nil, nil
      end
      for i = 1, #calls do
        local fn = calls[i]["function"] or {}
        local n = state.calls or 0
        state.calls = n + 1
        local idx = state.next or 0
        state.next = idx + 1
        events[#events + 1] = { event = "block_start", index = idx, block_type = { type = "tool_call",
          id = call_id(calls[i], state.stamp, n), name = fn.name or "" } }
        events[#events + 1] = { event = "block_delta", index = idx,
          delta = { type = "tool_arguments", arguments = args_string(fn.arguments) } }
        events[#events + 1] = { event = "block_end", index = idx }
      end
    end
  end
  if ch.done then
    if state.open then
      events[#events + 1] = { event = "block_end", index = state.open }
      state.open, state.open_kind = nil, nil
    end
    local u = usage_of(ch)
    if u then events[#events + 1] = { event = "usage", usage = u } end
    events[#events + 1] = { event = "finish", finish_reason = finish_of(ch.done_reason, (state.calls or 0) > 0) }
    events[#events + 1] = { event = "done" }
  end
  return emit(events)
end

return adapter
