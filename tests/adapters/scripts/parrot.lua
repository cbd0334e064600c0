-- "parrot": a made-up provider, adapted strictly to ADAPTER.md (no gelbridge extras).
-- Wire format (invented for the tests, served by tests/adapters/parrot_server.py):
--   request  {bird, perch (system text), squawks=[{who=human|parrot|keeper, say, tricks?, tag?}],
--             loud (stream), toys (tools), eager (temperature), beakful (max_tokens)}
--   response {said, mused?, why, beak={seeds_in, seeds_out}, tricks=[{tag, trick, with (JSON text)}]}
--   stream   SSE data: {"peck": text} | {"muse": text} | {"trick_start": {slot, tag, trick}}
--            | {"trick_bit": {slot, bit}} | {"whole_trick": {tag, trick, with (object)}}
--            | {"beak": {...}} | {"why": reason} | {"nap": true}
local adapter = {
  name = "parrot",
  version = "0.1.0",
  endpoint = "/squawk",
  headers = { ["x-parrot-dialect"] = "polly" },
}

local WHO = { user = "human", assistant = "parrot", tool = "keeper" }

function adapter.transform_request(raw)
  local req = json.decode(raw)
  local perch, squawks = {}, json.array()
  for _, m in ipairs(req.messages) do
    if m.role == "system" then
      perch[#perch + 1] = m.content
    else
      local say = m.content
      if type(say) == "table" then -- multimodal blocks: keep text, count pictures
        local texts = {}
        for _, b in ipairs(say) do
          if b.type == "text" then texts[#texts + 1] = b.text
          elseif b.type == "image_url" then texts[#texts + 1] = "[picture " .. string.sub(b.image_url.url, 1, 22) .. "]" end
        end
        say = table.concat(texts, " ")
      end
      local s = { who = WHO[m.role] or m.role, say = say or "" }
      if m.tool_calls then
        s.tricks = json.array()
        for _, tc in ipairs(m.tool_calls) do
          s.tricks[#s.tricks + 1] = { tag = tc.id, trick = tc["function"].name, with = tc["function"].arguments }
        end
      end
      if m.tool_call_id then s.tag = m.tool_call_id end
      squawks[#squawks + 1] = s
    end
  end
  local out = { bird = req.model, perch = table.concat(perch, "\n"), squawks = squawks, loud = req.stream == true,
                eager = req.temperature, beakful = req.max_tokens, sleepy = req.disable_thinking }
  if req.tools then
    out.toys = json.array()
    for _, t in ipairs(req.tools) do out.toys[#out.toys + 1] = { toy = t["function"].name, shape = t["function"].parameters } end
  end
  return json.encode(out)
end

local function usage(b)
  if not b then return nil end
  return { prompt = b.seeds_in, completion = b.seeds_out, total = b.seeds_in + b.seeds_out }
end

function adapter.transform_response(raw)
  local r = json.decode(raw)
  local calls = json.array()
  for _, t in ipairs(r.tricks or {}) do
    calls[#calls + 1] = { id = t.tag, type = "function", name = t.trick, arguments = json.decode(t.with) }
  end
  return json.encode({ content = r.said or "", reasoning_content = r.mused, finish_reason = r.why,
                       token_usage = usage(r.beak), tool_calls = calls })
end

function adapter.transform_stream_chunk(raw)
  local f = json.decode(raw)
  if not f then return "" end
  if f.peck then return json.encode({ content = f.peck, done = false }) end
  if f.muse then return json.encode({ content = "", reasoning_content = f.muse, done = false }) end
  if f.trick_start then
    local t = f.trick_start
    return json.encode({ content = "", done = false, tool_calls = { { id = t.tag, type = "function", name = t.trick,
      raw_arguments = "", stream_index = t.slot } } })
  end
  if f.trick_bit then
    return json.encode({ content = "", done = false, tool_calls = { { raw_arguments = f.trick_bit.bit,
      stream_index = f.trick_bit.slot } } })
  end
  if f.whole_trick then
    local t = f.whole_trick
    return json.encode({ content = "", done = false, tool_call = { id = t.tag, type = "function", name = t.trick,
      arguments = t.with } })
  end
  if f.beak then return json.encode({ content = "", done = false, usage = usage(f.beak) }) end
  if f.why then return json.encode({ content = "", done = true, finish_reason = f.why }) end
  return "" -- naps and anything else: skip
end

return adapter
