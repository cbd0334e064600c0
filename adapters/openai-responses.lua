-- gelbridge built-in adapter: OpenAI Responses API (POST /v1/responses, Lux IR native).
--
-- Why this one beside `openai` (Chat Completions): reasoning models keep their
-- reasoning across turns only here. Requests go out with `store = false` and
-- `include = ["reasoning.encrypted_content"]`; every reasoning item comes back with its
-- `encrypted_content`, is kept as a thinking block's provider_data, and is sent back
-- (the host keeps it for the same provider and model only) as a `reasoning` input
-- item, in its original place: before the function calls it led to, without an item
-- id (with `store = false` the provider keeps nothing an id could point to).
--
-- Request:  instructions -> `instructions`; user text / images (input_image, data: URLs
--           for inline) / PDFs (input_file); tool results -> function_call_output items;
--           assistant turns -> their items in order: reasoning (own, encrypted),
--           assistant text, function_call (call_id, name, arguments); function tools
--           (strict only when asked: the API's default is strict), tool_choice,
--           max_output_tokens, temperature, top_p, text.format for structured output,
--           reasoning {effort, summary = "auto"}, stream.
-- Response: reasoning -> thinking (summary text; encrypted_content in provider_data),
--           output_text -> text, refusal -> refusal, function_call -> tool_use;
--           status completed / incomplete (max_output_tokens -> length,
--           content_filter) / failed -> error; usage with reasoning and cached tokens.
-- Stream:   the typed events: output_item.added / .done, output_text.delta,
--           reasoning_summary_text.delta (parts joined by a blank line),
--           reasoning_text.delta, refusal.delta, function_call_arguments.delta,
--           completed / incomplete -> usage + finish, failed / error -> error.
-- Written for gelbridge (not derived from other adapters).

local adapter = {
  name = "openai-responses",
  version = "1.0.0",
  format = "lux-ir-v1",
  endpoint = "/responses",
  stream_format = "sse",
  auth = "bearer",
  tool_call_id = { pattern = "^[a-zA-Z0-9_-]+$", max_length = 64 },
  -- error codes that mean "the opaque reasoning state you sent is not valid here"
  -- (another organisation's key behind a gateway, a rotated key): the host sends the
  -- request again once without any provider_data, and says so in a diagnostic
  provider_state_errors = { "invalid_encrypted_content" },
  -- OpenAI's own web search ({"type": "web_search"}): run by OpenAI, cited pages come
  -- back as url_citation annotations (sourceParts in the reply)
  native_tools = { "web_search" },
  headers = {},
}

local jdecode, jencode, jarray, jobject = json.decode, json.encode, json.array, json.object
local error_kind, lux_error, lux_response, error_response =
  luxkit.error_kind, luxkit.lux_error, luxkit.lux_response, luxkit.error_response
local pdata, args_string, media_of, text_of =
  luxkit.pdata, luxkit.args_string, luxkit.media_of, luxkit.text_of
local emit, stream_error, decode_response, decode_chunk, function_tools =
  luxkit.emit, luxkit.stream_error, luxkit.decode_response, luxkit.decode_chunk, luxkit.function_tools
local type, tostring, pairs = type, tostring, pairs
local match, sub = string.match, string.sub
local concat = table.concat

local INCOMPLETE = { max_output_tokens = "length", content_filter = "content_filter" }

-- ---------------------------------------------------------------- request

local function user_part(b)
  local t = b.type
  if t == "text" then return { type = "input_text", text = b.text } end
  if t == "image" or t == "file" then
    local mt, st, data = media_of(b)
    if mt then
      if t == "image" and (st == "url" or st == "file_uri") then
        return { type = "input_image", image_url = data, detail = "auto" }
      end
      if st == "inline" then
        if t == "image" then
          return { type = "input_image", image_url = "data:" .. mt .. ";base64," .. data, detail = "auto" }
        end
        return { type = "input_file", filename = "document", file_data = "data:" .. mt .. ";base64," .. data }
      end
    end
  end
  log("warn", "a " .. tostring(t) .. " block cannot be sent to this provider; dropped")
  return nil
end

local function result_text(r)
  local c = r.content
  if type(c) == "table" and #c == 1 and c[1].type == "text" and type(c[1].text) == "string" then
    return c[1].text
  end
  return text_of(c, "\n")
end

local function push_user(out, role, content)
  local parts, np = nil, 0
  for i = 1, #content do
    local b = content[i]
    local t = b.type
    if t == "tool_result" then
      local r = b.tool_result
      out[#out + 1] = { type = "function_call_output", call_id = r.tool_use_id, output = result_text(r) }
    elseif t ~= "thinking" and t ~= "tool_use" then
      local p = user_part(b)
      if p then
        if not parts then parts = jarray() end
        np = np + 1; parts[np] = p
      end
    end
  end
  if np == 0 then return end
  if role ~= "system" and role ~= "developer" then role = "user" end
  if np == 1 and parts[1].type == "input_text" then
    out[#out + 1] = { role = role, content = parts[1].text }
  else
    out[#out + 1] = { role = role, content = parts }
  end
end

-- The items of one assistant turn, in the order the model produced them.
local function push_assistant(out, content)
  local texts, nt = nil, 0
  local function flush()
    if nt > 0 then
      out[#out + 1] = { role = "assistant", content = concat(texts, "") }
      texts, nt = nil, 0
    end
  end
  for i = 1, #content do
    local b = content[i]
    local t = b.type
    if t == "text" and type(b.text) == "string" then
      if not texts then texts = {} end
      nt = nt + 1; texts[nt] = b.text
    elseif t == "thinking" then
      -- provider_data here means: produced by this very model (the host filtered it)
      local pd = b.provider_data
      local enc = type(pd) == "table" and type(pd.data) == "table" and pd.data.encrypted_content
      if type(enc) == "string" and enc ~= "" then
        flush()
        local summary = jarray()
        local text = b.thinking and b.thinking.text
        if type(text) == "string" and text ~= "" then summary[1] = { type = "summary_text", text = text } end
        out[#out + 1] = { type = "reasoning", summary = summary, encrypted_content = enc }
      end
    elseif t == "tool_use" then
      flush()
      local u = b.tool_use
      out[#out + 1] = { type = "function_call", call_id = u.id, name = u.name, arguments = args_string(u.arguments) }
    end
  end
  flush()
end

-- The request's tools: function tools, and the provider's own web search (its
-- parameters carry the operator's options: allowed_domains becomes filters.allowed_domains;
-- OpenAI has no max_uses or blocked domains).
local function split_tools(tools)
  local functions, native = jarray(), jarray()
  if type(tools) ~= "table" then return functions, native end
  for i = 1, #tools do
    local t = tools[i]
    if t.kind == "web_search" then
      local d = { type = "web_search" }
      local p = t.parameters or {}
      if type(p.allowed_domains) == "table" and #p.allowed_domains > 0 then
        d.filters = { allowed_domains = p.allowed_domains }
      end
      if type(p.blocked_domains) == "table" and #p.blocked_domains > 0 then
        log("warn", "OpenAI web search has no blocked domains; searching without that filter")
      end
      native[#native + 1] = d
    else
      functions[#functions + 1] = t
    end
  end
  return functions, native
end

-- OpenAI's reasoning models reason by default: o1/o3/o4..., gpt-5 (not gpt-5-chat).
local function reasoning_model(model)
  local m = match(tostring(model or ""), "([^/]*)$") or ""
  if match(m, "^o%d") then return true end
  return sub(m, 1, 5) == "gpt-5" and not match(m, "^gpt%-5[%.%d]*%-chat")
end

local function responses_tool(t, parameters)
  local d = { type = "function", name = t.name, parameters = parameters, strict = t.strict == true }
  if t.description then d.description = t.description end
  return d
end

function adapter.transform_request(lux_json)
  local req = jdecode(lux_json)
  if type(req) ~= "table" then error("transform_request: the request is not JSON", 0) end
  local input = jarray()
  local body = { model = req.model, input = input, store = false }
  -- encrypted reasoning only where there is reasoning: other models refuse the include
  if (type(req.reasoning) == "table" and req.reasoning.enabled) or reasoning_model(req.model) then
    body.include = { "reasoning.encrypted_content" }
  end
  local system = text_of(req.instructions, "\n\n")
  if system ~= "" then body.instructions = system end
  local conv = req.conversation or {}
  for i = 1, #conv do
    local item = conv[i]
    local m = item.type == "message" and item.message
    if m then
      if m.role == "assistant" then push_assistant(input, m.content or {}) else push_user(input, m.role, m.content or {}) end
    end
  end

  local functions, native = split_tools(req.tools)
  local tools = function_tools(functions, responses_tool)
  for i = 1, #native do tools[#tools + 1] = native[i] end
  if #tools > 0 then
    body.tools = tools
    local tc = req.tool_choice
    if type(tc) == "table" then
      body.tool_choice = { type = "function", name = tc.name }
    elseif tc ~= nil then
      body.tool_choice = tc
    end
  end

  local o = req.options or {}
  body.temperature, body.top_p = o.temperature, o.top_p
  if o.max_output_tokens then body.max_output_tokens = o.max_output_tokens end
  if o.stop and #o.stop > 0 then log("warn", "the Responses API has no stop sequences; dropped") end
  local so = o.structured_output
  if so == "json_object" then
    body.text = { format = { type = "json_object" } }
  elseif type(so) == "table" and so.type == "json_schema" then
    local f = { type = "json_schema", name = so.name or "response", schema = so.schema }
    if so.strict ~= nil then f.strict = so.strict end
    body.text = { format = f }
  end
  if o.stream then body.stream = true end

  local r = req.reasoning
  if type(r) == "table" and r.enabled then
    local effort = r.effort
    if effort == nil and r.budget_tokens then
      effort = r.budget_tokens <= 2048 and "low" or (r.budget_tokens <= 8192 and "medium" or "high")
    end
    body.reasoning = { effort = effort or "medium", summary = "auto" }
  end

  local key = luxkit.prompt_cache_key(req)
  if key then body.prompt_cache_key = key end

  local extras = o.extras
  if type(extras) == "table" then
    for k, v in pairs(extras) do
      if k ~= "model" and k ~= "input" and k ~= "stream" and k ~= "previous_response_id" and k ~= "store" then
        body[k] = v
      end
    end
  end
  return jencode(body)
end

-- ---------------------------------------------------------------- response

-- a count from the provider: a non-negative number, else nil (a hostile answer)
local function count(v)
  if type(v) == "number" and v >= 0 then return v end
  return nil
end

local function usage_of(u)
  if type(u) ~= "table" then return nil end
  local p, c = count(u.input_tokens) or 0, count(u.output_tokens) or 0
  local out = { prompt_tokens = p, completion_tokens = c, total_tokens = count(u.total_tokens) or (p + c) }
  local od, id = u.output_tokens_details, u.input_tokens_details
  if type(od) == "table" then out.reasoning_tokens = count(od.reasoning_tokens) end
  if type(id) == "table" then
    out.cached_tokens = count(id.cached_tokens)
    local w = count(id.cache_write_tokens)
    if w and w > 0 then out.cache_creation_tokens = w end
  end
  return out
end

local function body_error(e)
  if type(e) ~= "table" then return lux_error("server_error", tostring(e)) end
  return lux_error(error_kind(e.type, e.code, e.status), e.message, e.code or e.type)
end

-- url_citation annotations as Lux url annotations (nil when there are none)
local function url_citation(a)
  if a.type == "url_citation" then return a.url, a.title end
end

local function annotation_of(a)
  return type(a) == "table" and luxkit.url_annotation(url_citation(a)) or nil
end

local function annotations_of(list)
  return luxkit.url_annotations(list, url_citation)
end

local function summary_text(item)
  local parts, n = {}, 0
  local s = item.summary
  if type(s) == "table" then
    for i = 1, #s do
      local e = s[i]
      if type(e) == "table" and type(e.text) == "string" and e.text ~= "" then n = n + 1; parts[n] = e.text end
    end
  end
  local c = item.content -- reasoning_text of open-weight models
  if n == 0 and type(c) == "table" then
    for i = 1, #c do
      local e = c[i]
      if type(e) == "table" and type(e.text) == "string" and e.text ~= "" then n = n + 1; parts[n] = e.text end
    end
  end
  return concat(parts, "\n\n")
end

local function reasoning_data(item)
  if type(item.encrypted_content) == "string" and item.encrypted_content ~= "" then
    return pdata({ encrypted_content = item.encrypted_content })
  end
  return nil
end

local function finish_of(status, details, calls)
  if status == "incomplete" then
    local reason = type(details) == "table" and details.reason
    return INCOMPLETE[reason] or "length"
  end
  return calls and "tool_calls" or "stop"
end

function adapter.transform_response(raw)
  local body, failed = decode_response(raw, body_error)
  if not body then return failed end
  if body.status == "failed" then
    return error_response(body_error(type(body.error) == "table" and body.error or { message = "the response failed" }))
  end
  local content, calls = jarray(), false
  local output = type(body.output) == "table" and body.output or {}
  for i = 1, #output do
    local item = type(output[i]) == "table" and output[i] or {}
    local t = item.type
    if t == "reasoning" then
      local b = { type = "thinking", thinking = { text = summary_text(item), redacted = false } }
      b.provider_data = reasoning_data(item)
      if b.provider_data or b.thinking.text ~= "" then content[#content + 1] = b end
    elseif t == "message" then
      local parts = type(item.content) == "table" and item.content or {}
      for j = 1, #parts do
        local p = type(parts[j]) == "table" and parts[j] or {}
        if p.type == "output_text" and type(p.text) == "string" and p.text ~= "" then
          content[#content + 1] = { type = "text", text = p.text, annotations = annotations_of(p.annotations) }
        elseif p.type == "refusal" and type(p.refusal) == "string" then
          content[#content + 1] = { type = "refusal", refusal = p.refusal }
        end
      end
    elseif t == "function_call" then
      calls = true
      content[#content + 1] = { type = "tool_use", tool_use = {
        id = item.call_id or "", name = item.name or "", arguments = args_string(item.arguments) } }
    end
  end
  return lux_response(body.id, body.model, content, finish_of(body.status, body.incomplete_details, calls),
    usage_of(body.usage))
end

-- ---------------------------------------------------------------- stream

-- state.items[output_index] = { block = Lux block index, kind = "thinking"|"text"|"tool",
--   summary = last summary_index, args = true once arguments arrived }
local function item_block(events, state, index, kind, block_type)
  local items = state.items
  if not items then items = {}; state.items = items end
  local key = tostring(index)
  local it = items[key]
  if it and it.kind == kind then return it end
  if it and not it.closed then
    events[#events + 1] = { event = "block_end", index = it.block }
  end
  local idx = state.next or 0
  state.next = idx + 1
  it = { block = idx, kind = kind }
  items[key] = it
  events[#events + 1] = { event = "block_start", index = idx, block_type = block_type }
  return it
end

local function close_item(events, state, index)
  local it = state.items and state.items[tostring(index)]
  if it and not it.closed then
    it.closed = true
    events[#events + 1] = { event = "block_end", index = it.block }
  end
end

local function close_all(events, state)
  local items = state.items
  if not items then return end
  for _, it in pairs(items) do
    if not it.closed then
      it.closed = true
      events[#events + 1] = { event = "block_end", index = it.block }
    end
  end
end

local function finish(events, state, reason, usage)
  if state.finished then return end
  state.finished = true
  close_all(events, state)
  if usage then events[#events + 1] = { event = "usage", usage = usage } end
  events[#events + 1] = { event = "finish", finish_reason = reason }
  events[#events + 1] = { event = "done" }
end

local function thinking_delta(events, state, ev, separate)
  local it = item_block(events, state, ev.output_index or 0, "thinking", "thinking")
  local d = ev.delta
  if type(d) ~= "string" or d == "" then return end
  if separate and it.summary ~= nil and it.summary ~= ev.summary_index then
    events[#events + 1] = { event = "block_delta", index = it.block, delta = { type = "thinking", text = "\n\n" } }
  end
  if separate then it.summary = ev.summary_index end
  events[#events + 1] = { event = "block_delta", index = it.block, delta = { type = "thinking", text = d } }
end

function adapter.transform_stream_chunk(data, state)
  local ev, failed = decode_chunk(data, body_error, "event")
  if not ev then return failed end
  local events = {}
  local t = ev.type
  if t == "response.output_text.delta" then
    if type(ev.delta) == "string" and ev.delta ~= "" then
      local it = item_block(events, state, ev.output_index or 0, "text", "text")
      events[#events + 1] = { event = "block_delta", index = it.block, delta = { type = "text", text = ev.delta } }
    end
  elseif t == "response.reasoning_summary_text.delta" then
    thinking_delta(events, state, ev, true)
  elseif t == "response.reasoning_text.delta" then
    thinking_delta(events, state, ev, false)
  elseif t == "response.function_call_arguments.delta" then
    local it = state.items and state.items[tostring(ev.output_index or 0)]
    if it and it.kind == "tool" and type(ev.delta) == "string" and ev.delta ~= "" then
      it.args = true
      events[#events + 1] = { event = "block_delta", index = it.block,
        delta = { type = "tool_arguments", arguments = ev.delta } }
    end
  elseif t == "response.output_text.annotation.added" then
    local a = annotation_of(ev.annotation)
    if a then
      local it = item_block(events, state, ev.output_index or 0, "text", "text")
      events[#events + 1] = { event = "annotations", index = it.block, annotations = { a } }
    end
  elseif t == "response.refusal.delta" then
    if type(ev.delta) == "string" and ev.delta ~= "" then
      local it = item_block(events, state, ev.output_index or 0, "refusal", "refusal")
      events[#events + 1] = { event = "block_delta", index = it.block, delta = { type = "refusal", text = ev.delta } }
    end
  elseif t == "response.output_item.added" then
    local item = type(ev.item) == "table" and ev.item or {}
    if item.type == "function_call" then
      state.calls = true
      item_block(events, state, ev.output_index or 0, "tool",
        { type = "tool_call", id = item.call_id or "", name = item.name or "" })
    elseif item.type == "reasoning" then
      item_block(events, state, ev.output_index or 0, "thinking", "thinking")
    end
  elseif t == "response.output_item.done" then
    local item = type(ev.item) == "table" and ev.item or {}
    local index = ev.output_index or 0
    if item.type == "reasoning" then
      local pd = reasoning_data(item)
      if pd then
        local it = item_block(events, state, index, "thinking", "thinking")
        events[#events + 1] = { event = "block_delta", index = it.block,
          delta = { type = "provider_data", provider_data = pd } }
      end
    elseif item.type == "function_call" then
      local it = state.items and state.items[tostring(index)]
      if it and it.kind == "tool" and not it.args and type(item.arguments) == "string" and item.arguments ~= "" then
        events[#events + 1] = { event = "block_delta", index = it.block,
          delta = { type = "tool_arguments", arguments = item.arguments } }
      end
    end
    close_item(events, state, index)
  elseif t == "response.created" then
    local r = type(ev.response) == "table" and ev.response or {}
    if not state.started then
      state.started = true
      events[#events + 1] = { event = "conversation_start", meta = { id = r.id or "", model = r.model or "" } }
    end
  elseif t == "response.completed" or t == "response.incomplete" then
    local r = type(ev.response) == "table" and ev.response or {}
    local status = r.status or (t == "response.incomplete" and "incomplete" or "completed")
    finish(events, state, finish_of(status, r.incomplete_details, state.calls), usage_of(r.usage))
  elseif t == "response.failed" then
    local r = type(ev.response) == "table" and ev.response or {}
    local e = type(r.error) == "table" and r.error or { message = "the response failed" }
    close_all(events, state)
    return stream_error(events, error_kind(e.type, e.code), e.message, e.code)
  elseif t == "error" then
    close_all(events, state)
    return stream_error(events, error_kind(ev.type ~= "error" and ev.type or nil, ev.code), ev.message, ev.code)
  end
  return emit(events)
end

return adapter
