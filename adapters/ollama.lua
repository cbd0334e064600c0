-- gelbridge built-in adapter: Ollama native chat API (/api/chat, NDJSON streaming).
--
-- Request:  instructions -> leading system message; user text + inline images
--           (images: [base64]); assistant content, thinking and tool_calls with
--           arguments as OBJECTS; tool results -> role tool with tool_name (found from
--           the matching tool_use); tools; tool_choice none -> no tools, a specific
--           tool -> only that tool offered (Ollama has no tool_choice); think
--           (reasoning on/off, or extras.think for levels); format (json / schema);
--           options {temperature, top_p, top_k, num_predict, stop, seed}.
-- Response: thinking, content, tool_calls (id "" when Ollama sends none: the
--           host names the call after the reply key; arguments object -> JSON string); done_reason mapped (stop
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

-- Shared helpers are host code: luxkit (gelbridge/_adapters/lua/luxkit.lua, see
-- docs/adapters.md). Cached in locals: a call then costs no table lookup.
local jdecode, jencode, jarray = json.decode, json.encode, json.array
local concat = table.concat
local error_kind, lux_error, lux_response, args_string =
  luxkit.error_kind, luxkit.lux_error, luxkit.lux_response, luxkit.args_string
local args_object, safe_id, text_of, media_of =
  luxkit.args_object, luxkit.safe_id, luxkit.text_of, luxkit.media_of
local emit, decode_response, decode_chunk, function_tools =
  luxkit.emit, luxkit.decode_response, luxkit.decode_chunk, luxkit.function_tools

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

  local tc = req.tool_choice
  if tc ~= "none" then
    local only = type(tc) == "table" and tc.name or nil
    local tools = function_tools(req.tools, function(t, parameters)
      if only ~= nil and t.name ~= only then return nil end -- Ollama has no tool_choice
      local fn = { name = t.name, parameters = parameters }
      if t.description then fn.description = t.description end
      return { type = "function", ["function"] = fn }
    end)
    if #tools > 0 then body.tools = tools end
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

-- Ollama's own id, or "" when it gives none (most models): the host then names the
-- call after the reply it is written in
local function call_id(tc)
  if type(tc.id) == "string" and tc.id ~= "" then return tc.id end
  return ""
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
  local body, failed = decode_response(raw, body_error)
  if not body then return failed end
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
      id = call_id(calls[i]), name = fn.name or "", arguments = args_string(fn.arguments) } }
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
  local ch, failed = decode_chunk(data, body_error, "line")
  if not ch then return failed end
  local events = {}
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
          id = call_id(calls[i]), name = fn.name or "" } }
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
