-- Test adapter: fetches the URL given as the request and returns what http_* returned.
local adapter = { name = "http_probe", version = "0.1" }

function adapter.transform_request(raw)
  local req = json.decode(raw)
  local body, status
  if req.method == "POST" then
    body, status = http_post(req.url, req.body)
  else
    body, status = http_get(req.url)
  end
  return json.encode({ body = body, status = status })
end

function adapter.transform_response(raw) return raw end

return adapter
