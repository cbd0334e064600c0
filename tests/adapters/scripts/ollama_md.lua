-- An Ollama /api/chat adapter written strictly to ADAPTER.md (test fixture): it
-- declares no stream format (ADAPTER.md knows only SSE), yet Ollama streams NDJSON; the
-- host hands each line to transform_stream_chunk as it hands an SSE data payload.
local adapter = { name = "ollama_md", version = "1.0.0", endpoint = "/api/chat" }

function adapter.transform_request(raw)
  local req = json.decode(raw)
  local out = { model = req.model, messages = json.array(), stream = req.stream or false }
  for _, m in ipairs(req.messages) do
    out.messages[#out.messages + 1] = { role = m.role, content = m.content or "" }
  end
  return json.encode(out)
end

function adapter.transform_response(raw)
  local r = json.decode(raw)
  return json.encode({ content = (r.message or {}).content or "", finish_reason = r.done_reason or "stop",
                       usage = { prompt = r.prompt_eval_count or 0, completion = r.eval_count or 0,
                                 total = (r.prompt_eval_count or 0) + (r.eval_count or 0) } })
end

function adapter.transform_stream_chunk(raw)
  local ok, r = pcall(json.decode, raw)
  if not ok or not r then return "" end
  local out = { content = (r.message or {}).content or "", done = r.done == true }
  if r.done then
    out.finish_reason = r.done_reason or "stop"
    out.usage = { prompt = r.prompt_eval_count or 0, completion = r.eval_count or 0,
                  total = (r.prompt_eval_count or 0) + (r.eval_count or 0) }
  end
  return json.encode(out)
end

return adapter
