-- gelbridge built-in adapter: Anthropic Messages API (Lux IR native).
--
-- Request:  instructions -> system (text blocks); user/tool messages -> user turns with
--           tool_result blocks first (consecutive tool messages merged into ONE user
--           message; a tool_use left without a result gets an is_error result so the
--           request stays valid); assistant thinking (signed) / redacted_thinking /
--           text / tool_use (input object); images (base64 or url), PDFs (document);
--           tools, tool_choice (auto/any/tool/none, disable_parallel_tool_use via
--           extras.parallel_tool_calls = false), thinking {enabled, budget_tokens} with
--           max_tokens above the budget (default 4096 + budget), stop_sequences.
-- Response: thinking (signature kept in thinking.signature and provider_data),
--           redacted_thinking (provider_data.data.redacted_data), text, tool_use;
--           stop_reason mapped; usage with prompt = input + cache read + cache write.
-- Caching: cache_control breakpoints on tools, system, the previous request's end and
--           this request's end (off with [providers.x] prompt_cache = false).
-- Stream:   the content-block lifecycle 1:1 (signature deltas, redacted blocks),
--           message_delta -> usage + finish, message_stop -> done, error -> error.
-- Written for gelbridge (not derived from other adapters).

local adapter = {
  name = "anthropic",
  version = "1.0.0",
  format = "lux-ir-v1",
  endpoint = "/v1/messages",
  stream_format = "sse",
  auth = "x-api-key",
  tool_call_id = { pattern = "^[a-zA-Z0-9_-]+$", max_length = 64 },
  headers = { ["anthropic-version"] = "2023-06-01" },
  -- the web search server tool (web_search_20250305): Anthropic runs it; its result
  -- blocks are not kept, the text's citations become sourceParts
  native_tools = { "web_search" },
}

-- Shared helpers are host code: luxkit (gelbridge/_adapters/lua/luxkit.lua, see
-- docs/adapters.md). Cached in locals: a call then costs no table lookup.
local jdecode, jencode, jarray = json.decode, json.encode, json.array
local error_kind, lux_error, lux_response, error_response =
  luxkit.error_kind, luxkit.lux_error, luxkit.lux_response, luxkit.error_response
local pdata, args_string, args_object, media_of =
  luxkit.pdata, luxkit.args_string, luxkit.args_object, luxkit.media_of
local emit, stream_error, decode_response, function_tools =
  luxkit.emit, luxkit.stream_error, luxkit.decode_response, luxkit.function_tools

local DEFAULT_MAX_TOKENS = 4096
local MIN_BUDGET = 1024
local EFFORT_BUDGET = { minimal = 1024, low = 2048, medium = 8192, high = 16384, xhigh = 32000 }

local STOP = {
  end_turn = "stop", stop_sequence = "stop", pause_turn = "stop", max_tokens = "length",
  model_context_window_exceeded = "length", tool_use = "tool_calls", refusal = "content_filter",
}

-- ---------------------------------------------------------------- request

local function media_block(b)
  local mt, st, data = media_of(b)
  if not mt then return nil end
  local kind = b.type == "image" and "image" or (b.type == "file" and "document") or nil
  if kind == "document" and st == "inline" and mt ~= "application/pdf" then kind = nil end
  if not kind then
    log("warn", "a " .. tostring(b.type) .. " block (" .. tostring(mt) .. ") cannot be sent to Anthropic; dropped")
    return nil
  end
  if st == "inline" then
    return { type = kind, source = { type = "base64", media_type = mt, data = data } }
  end
  if st == "url" then return { type = kind, source = { type = "url", url = data } } end
  log("warn", "file_uri media cannot be sent to Anthropic; dropped")
  return nil
end

local function result_block(r)
  local parts = jarray()
  local c = r.content or {}
  for i = 1, #c do
    local b = c[i]
    if b.type == "text" then
      if b.text ~= "" then parts[#parts + 1] = { type = "text", text = b.text } end
    elseif b.type == "image" then
      local m = media_block(b)
      if m then parts[#parts + 1] = m end
    end
  end
  local out = { type = "tool_result", tool_use_id = r.tool_use_id }
  if #parts > 0 then out.content = parts end
  if r.is_error then out.is_error = true end
  return out
end

local function assistant_blocks(content)
  local out = jarray()
  for i = 1, #content do
    local b = content[i]
    local t = b.type
    if t == "thinking" then
      local th = b.thinking or {}
      local data = b.provider_data and b.provider_data.data or {}
      if th.redacted then
        local d = data.redacted_data or data.data
        if d then out[#out + 1] = { type = "redacted_thinking", data = d } end
      else
        local sig = data.signature or th.signature
        -- unsigned thinking (another model's, or text only) is not accepted back
        if sig and sig ~= "" then out[#out + 1] = { type = "thinking", thinking = th.text or "", signature = sig } end
      end
    elseif t == "text" then
      if b.text ~= "" then out[#out + 1] = { type = "text", text = b.text } end
    elseif t == "tool_use" then
      local u = b.tool_use
      out[#out + 1] = { type = "tool_use", id = u.id, name = u.name, input = args_object(u.arguments) }
    end
  end
  return out
end

-- Append a user-side block; tool results go before any other block of the turn.
local function add_user(turn, block, is_result)
  if is_result then
    table.insert(turn.content, turn.results + 1, block)
    turn.results = turn.results + 1
  else
    turn.content[#turn.content + 1] = block
  end
end

local function build_messages(conv)
  local msgs, turn = jarray(), nil
  local pending = nil -- tool_use ids of the last assistant turn still waiting for a result
  local function close_pending()
    if not pending then return end
    for i = 1, #pending.order do
      local id = pending.order[i]
      if not pending.done[id] then
        if not turn or turn.role ~= "user" then
          turn = { role = "user", content = jarray(), results = 0 }
          msgs[#msgs + 1] = turn
        end
        add_user(turn, { type = "tool_result", tool_use_id = id, is_error = true,
          content = { { type = "text", text = "No result was recorded for this tool call." } } }, true)
      end
    end
    pending = nil
  end
  for i = 1, #conv do
    local item = conv[i]
    local m = item.type == "message" and item.message
    if m then
      local content = m.content or {}
      if m.role == "assistant" then
        close_pending()
        local blocks = assistant_blocks(content)
        if #blocks > 0 then
          if turn and turn.role == "assistant" then
            for j = 1, #blocks do turn.content[#turn.content + 1] = blocks[j] end
          else
            turn = { role = "assistant", content = blocks, results = 0 }
            msgs[#msgs + 1] = turn
          end
          for j = 1, #blocks do
            if blocks[j].type == "tool_use" then
              pending = pending or { order = {}, done = {} }
              pending.order[#pending.order + 1] = blocks[j].id
            end
          end
        end
      else -- user, tool, system, developer: all user-side content
        if not turn or turn.role ~= "user" then
          turn = { role = "user", content = jarray(), results = 0 }
          msgs[#msgs + 1] = turn
        end
        for j = 1, #content do
          local b = content[j]
          if b.type == "tool_result" then
            local r = b.tool_result
            if pending then pending.done[r.tool_use_id] = true end
            add_user(turn, result_block(r), true)
          elseif b.type == "text" then
            if b.text ~= "" then add_user(turn, { type = "text", text = b.text }, false) end
          elseif b.type ~= "thinking" and b.type ~= "tool_use" then
            local mb = media_block(b)
            if mb then add_user(turn, mb, false) end
          end
        end
        if m.role ~= "tool" then close_pending() end
      end
    end
  end
  close_pending()
  local out = jarray()
  for i = 1, #msgs do
    if #msgs[i].content > 0 then out[#out + 1] = { role = msgs[i].role, content = msgs[i].content } end
  end
  return out
end

-- Prompt caching (Anthropic caches only up to explicit breakpoints, at most 4): the
-- last tool, the last system block, the end of the previous request's prompt (the
-- message before the last assistant turn: what the previous turn or tool step wrote to
-- the cache, read back now exactly) and the end of this request (written now, read by
-- the next turn). Thinking blocks cannot carry a breakpoint: the last other block does.
local EPHEMERAL = { type = "ephemeral" }

local function mark_last(blocks)
  if type(blocks) ~= "table" then return end
  for i = #blocks, 1, -1 do
    local t = blocks[i].type
    if t ~= "thinking" and t ~= "redacted_thinking" then
      blocks[i].cache_control = EPHEMERAL
      return
    end
  end
end

local function cache_breakpoints(body)
  if body.tools then mark_last(body.tools) end
  if body.system then mark_last(body.system) end
  local msgs = body.messages
  local n = #msgs
  if n == 0 then return end
  mark_last(msgs[n].content)
  for i = n - 1, 2, -1 do
    if msgs[i].role == "assistant" then
      mark_last(msgs[i - 1].content)
      return
    end
  end
end

-- The web search server tool; its parameters carry the operator's options.
local function web_search_tool(t)
  local p = t.parameters or {}
  local d = { type = "web_search_20250305", name = "web_search" }
  if type(p.max_uses) == "number" then d.max_uses = p.max_uses end
  if type(p.allowed_domains) == "table" and #p.allowed_domains > 0 then d.allowed_domains = p.allowed_domains end
  if type(p.blocked_domains) == "table" and #p.blocked_domains > 0 then d.blocked_domains = p.blocked_domains end
  return d
end

-- A text block's web search citations as Lux url annotations (nil when none).
local function citation(c) return c.url, c.title end

local function citation_annotation(c)
  return type(c) == "table" and luxkit.url_annotation(citation(c)) or nil
end

local function citation_annotations(list)
  return luxkit.url_annotations(list, citation)
end

local function tool_definition(t, parameters)
  local d = { name = t.name, input_schema = parameters }
  if t.description then d.description = t.description end
  if t.strict ~= nil then d.strict = t.strict end
  return d
end

function adapter.transform_request(lux_json)
  local req = jdecode(lux_json)
  if type(req) ~= "table" then error("transform_request: the request is not JSON") end
  local body = { model = req.model, messages = build_messages(req.conversation or {}) }
  local ins = req.instructions
  if type(ins) == "table" then
    local sys = jarray()
    for i = 1, #ins do
      if ins[i].type == "text" and ins[i].text ~= "" then sys[#sys + 1] = { type = "text", text = ins[i].text } end
    end
    if #sys > 0 then body.system = sys end
  end

  local o = req.options or {}
  local extras = type(o.extras) == "table" and o.extras or {}
  local tc = req.tool_choice
  local functions, searches = jarray(), jarray()
  for i = 1, #(req.tools or {}) do
    local t = req.tools[i]
    if t.kind == "web_search" then searches[#searches + 1] = web_search_tool(t) else functions[#functions + 1] = t end
  end
  local tools = function_tools(functions, tool_definition)
  for i = 1, #searches do tools[#tools + 1] = searches[i] end
  if #tools > 0 then
    body.tools = tools
    local choice
    if type(tc) == "table" then
      choice = { type = "tool", name = tc.name }
    elseif tc == "required" then
      choice = { type = "any" }
    elseif tc == "none" then
      choice = { type = "none" }
    elseif tc == "auto" or extras.parallel_tool_calls == false then
      choice = { type = "auto" }
    end
    if choice and extras.parallel_tool_calls == false and choice.type ~= "none" then
      choice.disable_parallel_tool_use = true
    end
    body.tool_choice = choice
  end

  local max_tokens = o.max_output_tokens or DEFAULT_MAX_TOKENS
  local r = req.reasoning
  local thinking = false
  if type(r) == "table" and r.enabled then
    local budget = r.budget_tokens or EFFORT_BUDGET[r.effort or "medium"] or EFFORT_BUDGET.medium
    if budget < MIN_BUDGET then budget = MIN_BUDGET end
    -- budget_tokens must stay below max_tokens: the output cap applies on top of thinking
    if max_tokens <= budget then max_tokens = budget + (o.max_output_tokens or DEFAULT_MAX_TOKENS) end
    body.thinking = { type = "enabled", budget_tokens = budget }
    thinking = true
  end
  body.max_tokens = max_tokens
  if not thinking then
    body.temperature, body.top_k = o.temperature, o.top_k
  end
  body.top_p = o.top_p
  if o.stop and #o.stop > 0 then body.stop_sequences = o.stop end
  if o.stream then body.stream = true end
  for k, v in pairs(extras) do
    if k ~= "parallel_tool_calls" and k ~= "model" and k ~= "messages" and k ~= "stream"
      and k ~= "previous_response_id" then body[k] = v end
  end
  if luxkit.prompt_cache_on(req) then cache_breakpoints(body) end
  return jencode(body)
end

-- ---------------------------------------------------------------- response

local function usage_of(u, out_tokens)
  if type(u) ~= "table" then return nil end
  local cr, cc = u.cache_read_input_tokens, u.cache_creation_input_tokens
  local p = (u.input_tokens or 0) + (cr or 0) + (cc or 0)
  local c = out_tokens or u.output_tokens or 0
  local out = { prompt_tokens = p, completion_tokens = c, total_tokens = p + c }
  if cr then out.cached_tokens = cr end
  if cc then out.cache_creation_tokens = cc end
  return out
end

local function body_error(e)
  if type(e) ~= "table" then return lux_error("server_error", tostring(e)) end
  return lux_error(error_kind(e.type), e.message, e.type)
end

function adapter.transform_response(raw)
  local body, failed = decode_response(raw, body_error)
  if not body then return failed end
  if body.type == "error" then return error_response(body_error(body.error)) end
  local content = jarray()
  local blocks = body.content or {}
  for i = 1, #blocks do
    local b = blocks[i]
    local t = b.type
    if t == "text" then
      content[#content + 1] = { type = "text", text = b.text or "", annotations = citation_annotations(b.citations) }
    elseif t == "thinking" then
      local th = { text = b.thinking or "", redacted = false }
      local blk = { type = "thinking", thinking = th }
      if b.signature and b.signature ~= "" then
        th.signature = b.signature
        blk.provider_data = pdata({ signature = b.signature })
      end
      content[#content + 1] = blk
    elseif t == "redacted_thinking" then
      content[#content + 1] = { type = "thinking", thinking = { text = "", redacted = true },
        provider_data = pdata({ redacted_data = b.data }) }
    elseif t == "tool_use" then
      content[#content + 1] = { type = "tool_use",
        tool_use = { id = b.id, name = b.name, arguments = args_string(b.input) } }
    end
  end
  local sr = body.stop_reason
  return lux_response(body.id, body.model, content, sr and (STOP[sr] or sr) or "stop", usage_of(body.usage))
end

-- ---------------------------------------------------------------- stream

local function delta(events, idx, d)
  events[#events + 1] = { event = "block_delta", index = idx, delta = d }
end

function adapter.transform_stream_chunk(data, state)
  local events = {}
  local ev = jdecode(data)
  if type(ev) ~= "table" then
    return stream_error(events, "server_error", "the provider sent a stream event that is not JSON")
  end
  local t = ev.type
  if t == "content_block_delta" then
    local idx = state["b" .. tostring(ev.index)]
    local d = ev.delta or {}
    if idx == nil then return "" end
    local dt = d.type
    if dt == "text_delta" then
      if d.text ~= "" then delta(events, idx, { type = "text", text = d.text }) end
    elseif dt == "thinking_delta" then
      if d.thinking ~= "" then delta(events, idx, { type = "thinking", text = d.thinking }) end
    elseif dt == "signature_delta" then
      delta(events, idx, { type = "signature", signature = d.signature })
    elseif dt == "input_json_delta" then
      if d.partial_json and d.partial_json ~= "" then
        delta(events, idx, { type = "tool_arguments", arguments = d.partial_json })
      end
    elseif dt == "citations_delta" then
      local a = citation_annotation(d.citation)
      if a then events[#events + 1] = { event = "annotations", index = idx, annotations = { a } } end
    end
    return emit(events)
  elseif t == "content_block_start" then
    local cb = ev.content_block or {}
    local ct = cb.type
    local idx = state.next or 0
    if ct == "text" then
      events[1] = { event = "block_start", index = idx, block_type = "text" }
      if cb.text and cb.text ~= "" then delta(events, idx, { type = "text", text = cb.text }) end
    elseif ct == "thinking" then
      events[1] = { event = "block_start", index = idx, block_type = "thinking" }
      if cb.thinking and cb.thinking ~= "" then delta(events, idx, { type = "thinking", text = cb.thinking }) end
      if cb.signature and cb.signature ~= "" then delta(events, idx, { type = "signature", signature = cb.signature }) end
    elseif ct == "redacted_thinking" then
      events[1] = { event = "block_start", index = idx, block_type = "thinking" }
      events[2] = { event = "block_delta", index = idx, delta = { type = "provider_data",
        provider_data = pdata({ redacted_data = cb.data }), redacted = true } }
    elseif ct == "tool_use" then
      events[1] = { event = "block_start", index = idx, block_type = { type = "tool_call", id = cb.id, name = cb.name } }
      if type(cb.input) == "table" and next(cb.input) ~= nil then
        delta(events, idx, { type = "tool_arguments", arguments = args_string(cb.input) })
      end
    else
      return "" -- server tool blocks and other kinds are not part of the answer
    end
    state.next = idx + 1
    state["b" .. tostring(ev.index)] = idx
    return emit(events)
  elseif t == "content_block_stop" then
    local key = "b" .. tostring(ev.index)
    local idx = state[key]
    if idx == nil then return "" end
    state[key] = nil
    events[1] = { event = "block_end", index = idx }
    return emit(events)
  elseif t == "message_start" then
    local m = ev.message or {}
    local u = usage_of(m.usage)
    local meta = { id = m.id, model = m.model }
    if u then meta.usage_input = u.prompt_tokens end
    events[1] = { event = "conversation_start", meta = meta }
    if u then events[2] = { event = "usage", usage = u } end
    return emit(events)
  elseif t == "message_delta" then
    local u = ev.usage
    if type(u) == "table" then
      local out = usage_of(u)
      events[#events + 1] = { event = "usage", usage = out }
    end
    local sr = ev.delta and ev.delta.stop_reason
    if sr then events[#events + 1] = { event = "finish", finish_reason = STOP[sr] or sr } end
    return emit(events)
  elseif t == "message_stop" then
    events[1] = { event = "done" }
    return emit(events)
  elseif t == "error" then
    events[1] = { event = "error", error = body_error(ev.error) }
    return emit(events)
  end
  return "" -- ping and unknown events
end

return adapter
