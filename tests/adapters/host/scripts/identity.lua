-- Test adapter: decodes and re-encodes everything it is given.
local adapter = { name = "identity", version = "1.0.0", endpoint = "/v1/{model}/chat", headers = { ["x-test"] = "yes" } }

function adapter.transform_request(raw)
  return json.encode(json.decode(raw))
end

function adapter.transform_response(raw)
  return json.encode(json.decode(raw))
end

function adapter.transform_stream_chunk(raw)
  local t = json.decode(raw)
  if not t then return "" end
  local c = t.choices and t.choices[1]
  if not c then return "" end
  local d = c.delta or {}
  return json.encode({ content = d.content or "", done = c.finish_reason ~= nil })
end

return adapter
