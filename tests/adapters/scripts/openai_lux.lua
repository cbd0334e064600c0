-- An OpenAI Chat Completions adapter in the opt-in lux-ir-v1 format (test fixture):
-- Lux IR request in, Lux IR response / stream events out, per-stream state in `state`.
local adapter = { name = "openai_lux", version = "1.0.0", format = "lux-ir-v1",
                  endpoint = "/v1/chat/completions",
                  tool_call_id = { pattern = "^[a-zA-Z0-9_-]+$", max_length = 40 } }

function adapter.transform_request(raw)
  local req = json.decode(raw)
  local messages = json.array()
  for _, c in ipairs(req.instructions or {}) do messages[#messages + 1] = { role = "system", content = c.text } end
  for _, item in ipairs(req.conversation) do
    local m = item.message
    if m.role == "tool" then
      for _, b in ipairs(m.content) do
        local r = b.tool_result
        messages[#messages + 1] = { role = "tool", tool_call_id = r.tool_use_id, content = r.content[1].text }
      end
    else
      local text, calls = {}, json.array()
      for _, b in ipairs(m.content) do
        if b.type == "text" then text[#text + 1] = b.text end
        if b.type == "tool_use" then
          calls[#calls + 1] = { id = b.tool_use.id, type = "function",
                                ["function"] = { name = b.tool_use.name, arguments = b.tool_use.arguments } }
        end
      end
      local out = { role = m.role, content = table.concat(text) }
      if #calls > 0 then out.tool_calls = calls end
      messages[#messages + 1] = out
    end
  end
  return json.encode({ model = req.model, messages = messages, stream = req.options.stream })
end

function adapter.transform_response(raw)
  local r = json.decode(raw)
  local msg = r.choices[1].message
  local content = json.array()
  if msg.content then content[#content + 1] = { type = "text", text = msg.content,
    provider_data = { data = { fingerprint = "fp-1" } } } end
  for _, tc in ipairs(msg.tool_calls or {}) do
    content[#content + 1] = { type = "tool_use", tool_use = { id = tc.id, name = tc["function"].name,
                                                               arguments = tc["function"].arguments } }
  end
  return json.encode({ schema_version = "v1", id = r.id, model = r.model,
    choices = { { index = 0, finish_reason = r.choices[1].finish_reason,
                  message = { role = "assistant", content = content } } },
    usage = { prompt_tokens = r.usage.prompt_tokens, completion_tokens = r.usage.completion_tokens } })
end

function adapter.transform_stream_chunk(raw, state)
  local r = json.decode(raw)
  if not r then return "" end
  local c = r.choices and r.choices[1]
  if not c then return "" end
  state.next = state.next or 0
  state.calls = state.calls or {}
  local events = json.array()
  if not state.started then
    state.started = true
    events[#events + 1] = { event = "conversation_start", meta = { id = r.id, model = r.model } }
  end
  local d = c.delta or {}
  if d.content and d.content ~= "" then
    if not state.text then
      state.text = state.next; state.next = state.next + 1
      events[#events + 1] = { event = "block_start", index = state.text, block_type = "text" }
    end
    events[#events + 1] = { event = "block_delta", index = state.text, delta = { type = "text", text = d.content } }
  end
  for _, tc in ipairs(d.tool_calls or {}) do
    local idx = state.calls[tc.index]
    if idx == nil then
      idx = state.next; state.next = state.next + 1; state.calls[tc.index] = idx
      events[#events + 1] = { event = "block_start", index = idx,
        block_type = { type = "tool_call", id = tc.id or "", name = tc["function"].name or "" } }
    end
    local args = tc["function"].arguments
    if args and args ~= "" then
      events[#events + 1] = { event = "block_delta", index = idx, delta = { type = "tool_arguments", arguments = args } }
    end
  end
  if c.finish_reason then
    events[#events + 1] = { event = "finish", finish_reason = c.finish_reason }
    events[#events + 1] = { event = "done" }
  end
  if #events == 0 then return "" end
  return json.encode(events)
end

return adapter
