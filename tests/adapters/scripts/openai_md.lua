-- An OpenAI Chat Completions adapter written strictly to ADAPTER.md (test fixture).
-- Request: CompletionRequest is already OpenAI-shaped; drop the host-only fields.
local adapter = { name = "openai_md", version = "1.0.0", endpoint = "/v1/chat/completions" }

function adapter.transform_request(raw)
  local req = json.decode(raw)
  req.disable_thinking = nil
  for _, m in ipairs(req.messages) do m.reasoning_content = nil end
  if req.stream then req.stream_options = { include_usage = true } end
  return json.encode(req)
end

local function usage(u)
  if not u then return nil end
  local out = { prompt = u.prompt_tokens or 0, completion = u.completion_tokens or 0, total = u.total_tokens or 0 }
  if u.completion_tokens_details then out.reasoning_tokens = u.completion_tokens_details.reasoning_tokens end
  return out
end

function adapter.transform_response(raw)
  local r = json.decode(raw)
  local msg = r.choices[1].message
  local calls = json.array()
  for _, tc in ipairs(msg.tool_calls or {}) do
    local args = json.decode(tc["function"].arguments) or { raw = tc["function"].arguments }
    calls[#calls + 1] = { id = tc.id, type = "function", name = tc["function"].name, arguments = args }
  end
  return json.encode({
    content = msg.content or "",
    reasoning_content = msg.reasoning_content,
    finish_reason = r.choices[1].finish_reason,
    token_usage = usage(r.usage),
    tool_calls = calls,
  })
end

function adapter.transform_stream_chunk(raw)
  local ok, r = pcall(json.decode, raw)
  if not ok or not r then return "" end
  local c = r.choices and r.choices[1]
  if not c then
    if r.usage then return json.encode({ content = "", done = false, usage = usage(r.usage) }) end
    return ""
  end
  local d = c.delta or {}
  local out = { content = d.content or "", done = c.finish_reason ~= nil, finish_reason = c.finish_reason,
                reasoning_content = d.reasoning_content }
  if d.tool_calls then
    local pieces = json.array()
    for _, tc in ipairs(d.tool_calls) do
      local f = tc["function"] or {}
      pieces[#pieces + 1] = { id = tc.id, type = "function", name = f.name,
                              raw_arguments = f.arguments, stream_index = tc.index or 0 }
    end
    out.tool_calls = pieces
  end
  return json.encode(out)
end

return adapter
