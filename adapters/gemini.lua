-- gelbridge built-in adapter: Gemini API generateContent / streamGenerateContent (alt=sse).
--
-- Request:  instructions -> systemInstruction; user -> role user, assistant -> role
--           model, tool results -> functionResponse parts {name (found from the
--           matching tool_use in the history), id, response {output|error}} merged into
--           one user turn; images/files -> inlineData or fileData; thinking blocks of
--           this model -> thought parts; thoughtSignature put back on the exact part it
--           came with (text, thought or functionCall); tools -> functionDeclarations
--           (parametersJsonSchema); tool_choice -> toolConfig.functionCallingConfig
--           (AUTO/ANY/NONE, allowedFunctionNames); generationConfig (temperature, topP,
--           topK, maxOutputTokens, stopSequences, seed, candidateCount, JSON output,
--           thinkingConfig: thinkingLevel for gemini-3 models, thinkingBudget before).
-- Response: parts in order -> thinking / text / tool_use; calls without an id get
--           "" (the host names them after the reply key); finishReason mapped (STOP with calls ->
--           tool_calls); usage with completion = candidates + thoughts.
-- Stream:   incremental chunks (text appended, never replaced); a signed part closes
--           its block so the signature stays on that part.
-- Written for gelbridge (not derived from other adapters).

local adapter = {
  name = "gemini",
  version = "1.0.0",
  format = "lux-ir-v1",
  endpoint = "/models/{model}:generateContent",
  stream_endpoint = "/models/{model}:streamGenerateContent?alt=sse",
  stream_format = "sse",
  auth = "x-goog-api-key",
  headers = {},
  -- Grounding with Google Search ({"googleSearch": {}}): Google runs it; the pages in
  -- groundingMetadata become sourceParts
  native_tools = { "web_search" },
}

-- Shared helpers are host code: luxkit (gelbridge/_adapters/lua/luxkit.lua, see
-- docs/adapters.md). Cached in locals: a call then costs no table lookup.
local jdecode, jencode, jarray, jobject = json.decode, json.encode, json.array, json.object
local error_kind, lux_error, lux_response, pdata =
  luxkit.error_kind, luxkit.lux_error, luxkit.lux_response, luxkit.pdata
local args_string, args_object, text_of =
  luxkit.args_string, luxkit.args_object, luxkit.text_of
local media_of, emit, decode_response, decode_chunk =
  luxkit.media_of, luxkit.emit, luxkit.decode_response, luxkit.decode_chunk
local function_tools =
  luxkit.function_tools

local FINISH = {
  STOP = "stop", MAX_TOKENS = "length", SAFETY = "safety", RECITATION = "recitation",
  BLOCKLIST = "safety", PROHIBITED_CONTENT = "safety", SPII = "safety", IMAGE_SAFETY = "safety",
  MALFORMED_FUNCTION_CALL = "malformed_tool_call", UNEXPECTED_TOOL_CALL = "malformed_tool_call",
  TOO_MANY_TOOL_CALLS = "malformed_tool_call", LANGUAGE = "stop", OTHER = "error",
  FINISH_REASON_UNSPECIFIED = "stop",
}
local EFFORT_BUDGET = { minimal = 512, low = 2048, medium = 8192, high = 24576, xhigh = 32768 }
local EFFORT_LEVEL = { minimal = "low", low = "low", medium = "medium", high = "high", xhigh = "high" }
-- Gemini 3 rejects replayed function calls without a signature; this value is the
-- documented way to mark calls that did not come from this model.
local SKIP_SIGNATURE = "skip_thought_signature_validator"

local function is_gemini3(model)
  return string.find(model or "", "gemini-3", 1, true) ~= nil
end

-- ---------------------------------------------------------------- request

local function media_part(b)
  local mt, st, data = media_of(b)
  if not mt then return nil end
  if st == "inline" then return { inlineData = { mimeType = mt, data = data } } end
  return { fileData = { mimeType = mt, fileUri = data } }
end

local function signature_of(b)
  local pd = b.provider_data
  return pd and type(pd.data) == "table" and pd.data.thoughtSignature or nil
end

local function model_parts(content, gemini3)
  local parts = jarray()
  local unsigned_call = false
  for i = 1, #content do
    local b = content[i]
    local t = b.type
    local sig = signature_of(b)
    local p
    if t == "thinking" then
      -- only this model's own thoughts (the host left provider_data on them)
      if b.provider_data and not b.thinking.redacted then p = { text = b.thinking.text or "", thought = true } end
    elseif t == "text" then
      if b.text ~= "" or sig then p = { text = b.text } end
    elseif t == "tool_use" then
      local u = b.tool_use
      local fc = { name = u.name, args = args_object(u.arguments) }
      if u.id and u.id ~= "" then fc.id = u.id end
      p = { functionCall = fc }
      if not sig and gemini3 and not unsigned_call then
        sig = SKIP_SIGNATURE
        unsigned_call = true
      end
    end
    if p then
      if sig then p.thoughtSignature = sig end
      parts[#parts + 1] = p
    end
  end
  return parts
end

local function response_part(r, names)
  local text = text_of(r.content, "\n")
  local resp = r.is_error and { error = text } or { output = text }
  local fr = { name = names[r.tool_use_id] or r.tool_use_id, response = resp }
  if r.tool_use_id and r.tool_use_id ~= "" then fr.id = r.tool_use_id end
  return { functionResponse = fr }
end

local function build_contents(conv, gemini3)
  local contents, last = jarray(), nil
  local names = {} -- tool_use id -> function name
  local function add(role, parts, results_first)
    if #parts == 0 then return end
    if last and last.role == role then
      for i = 1, #parts do last.parts[#last.parts + 1] = parts[i] end
    else
      last = { role = role, parts = parts }
      contents[#contents + 1] = last
    end
  end
  for i = 1, #conv do
    local item = conv[i]
    local m = item.type == "message" and item.message
    if m then
      local content = m.content or {}
      if m.role == "assistant" then
        for j = 1, #content do
          if content[j].type == "tool_use" then names[content[j].tool_use.id] = content[j].tool_use.name end
        end
        add("model", model_parts(content, gemini3))
      else
        local parts = jarray()
        for j = 1, #content do
          local b = content[j]
          local t = b.type
          if t == "tool_result" then
            parts[#parts + 1] = response_part(b.tool_result, names)
          elseif t == "text" then
            if b.text ~= "" then parts[#parts + 1] = { text = b.text } end
          elseif t == "image" or t == "file" or t == "audio" or t == "video" then
            local p = media_part(b)
            if p then parts[#parts + 1] = p end
          end
        end
        add("user", parts)
      end
    end
  end
  return contents
end

local function declaration(t, parameters)
  local d = { name = t.name, parametersJsonSchema = parameters }
  if t.description then d.description = t.description end
  return d
end

function adapter.transform_request(lux_json)
  local req = jdecode(lux_json)
  if type(req) ~= "table" then error("transform_request: the request is not JSON") end
  local gemini3 = is_gemini3(req.model)
  local body = { contents = build_contents(req.conversation or {}, gemini3) }
  local sys = text_of(req.instructions, "\n\n")
  if sys ~= "" then body.systemInstruction = { parts = { { text = sys } } } end

  local functions, search = jarray(), nil
  for i = 1, #(req.tools or {}) do
    local t = req.tools[i]
    if t.kind == "web_search" then
      search = { googleSearch = jobject() }
      local p = t.parameters or {}
      if (type(p.allowed_domains) == "table" and #p.allowed_domains > 0)
        or (type(p.blocked_domains) == "table" and #p.blocked_domains > 0) then
        log("warn", "Grounding with Google Search has no domain filters; searching without them")
      end
    else
      functions[#functions + 1] = t
    end
  end
  local decls = function_tools(functions, declaration)
  if search and #decls > 0 and not gemini3 then
    -- Gemini 2.x refuses Google Search next to function declarations: the functions stay
    log("warn", "Gemini 2 cannot combine Google Search with function tools; not searching in this request")
    search = nil
  end
  if search then body.tools = { search } end
  if #decls > 0 then
    body.tools = { { functionDeclarations = decls } }
    if search then body.tools[2] = search end
    local tc = req.tool_choice
    local cfg
    if type(tc) == "table" then
      cfg = { mode = "ANY", allowedFunctionNames = { tc.name } }
    elseif tc == "required" then
      cfg = { mode = "ANY" }
    elseif tc == "none" then
      cfg = { mode = "NONE" }
    elseif tc == "auto" then
      cfg = { mode = "AUTO" }
    end
    if cfg then body.toolConfig = { functionCallingConfig = cfg } end
  end

  local o = req.options or {}
  local gc = {}
  gc.temperature, gc.topP, gc.topK, gc.seed = o.temperature, o.top_p, o.top_k, o.seed
  gc.maxOutputTokens, gc.candidateCount = o.max_output_tokens, o.candidate_count
  if o.stop and #o.stop > 0 then gc.stopSequences = o.stop end
  local so = o.structured_output
  if so == "json_object" then
    gc.responseMimeType = "application/json"
  elseif type(so) == "table" and so.type == "json_schema" then
    gc.responseMimeType = "application/json"
    gc.responseJsonSchema = so.schema
  end
  local r = req.reasoning
  if type(r) == "table" then
    local tcfg = {}
    if r.enabled then
      tcfg.includeThoughts = true
      if gemini3 then
        tcfg.thinkingLevel = EFFORT_LEVEL[r.effort or ""] or
          (r.budget_tokens and (r.budget_tokens <= 2048 and "low" or "high")) or nil
      else
        tcfg.thinkingBudget = r.budget_tokens or EFFORT_BUDGET[r.effort or ""] or nil
      end
    elseif gemini3 then
      tcfg.thinkingLevel = "low" -- Gemini 3 cannot switch thinking off
    else
      tcfg.thinkingBudget = 0
    end
    gc.thinkingConfig = tcfg
  end
  local extras = o.extras
  if type(extras) == "table" then
    for k, v in pairs(extras) do
      if k == "safetySettings" or k == "cachedContent" or k == "labels" then
        body[k] = v
      elseif k ~= "previous_response_id" then
        gc[k] = v -- everything else is a generationConfig field
      end
    end
  end
  if next(gc) ~= nil then body.generationConfig = gc end
  return jencode(body)
end

-- ---------------------------------------------------------------- response

local function usage_of(u)
  if type(u) ~= "table" then return nil end
  local p = u.promptTokenCount or 0
  local th = u.thoughtsTokenCount
  local c = (u.candidatesTokenCount or 0) + (th or 0)
  local out = { prompt_tokens = p, completion_tokens = c, total_tokens = u.totalTokenCount or (p + c) }
  if th then out.reasoning_tokens = th end
  if u.cachedContentTokenCount then out.cached_tokens = u.cachedContentTokenCount end
  return out
end

local function body_error(e)
  if type(e) ~= "table" then return lux_error("server_error", tostring(e)) end
  return lux_error(error_kind(e.status, e.code), e.message, e.status or e.code)
end

-- Gemini's own id, or "" when it gives none: the host then names the call after the
-- reply it is written in (never after a response id, which may be missing or repeat)
local function call_id(fc)
  if type(fc.id) == "string" and fc.id ~= "" then return fc.id end
  return ""
end

local function finish_of(fr, had_calls)
  if not fr then return nil end
  local f = FINISH[fr] or fr
  if f == "stop" and had_calls then return "tool_calls" end
  return f
end

-- The pages of a candidate's groundingMetadata (those its groundingSupports cite, or
-- all when it lists none) as Lux url annotations; nil when there are none.
local function grounding_annotations(gm)
  if type(gm) ~= "table" or type(gm.groundingChunks) ~= "table" then return nil end
  local chunks, cited = gm.groundingChunks, nil
  if type(gm.groundingSupports) == "table" and #gm.groundingSupports > 0 then
    cited = {}
    for i = 1, #gm.groundingSupports do
      local sup = gm.groundingSupports[i]
      local idx = type(sup) == "table" and sup.groundingChunkIndices
      if type(idx) == "table" then
        for j = 1, #idx do
          if type(idx[j]) == "number" then cited[idx[j] + 1] = true end
        end
      end
    end
  end
  return luxkit.url_annotations(chunks, function(chunk, i)
    local web = chunk.web
    if type(web) == "table" and (not cited or cited[i]) then return web.uri, web.title end
  end)
end

function adapter.transform_response(raw)
  local body, failed = decode_response(raw, body_error)
  if not body then return failed end
  local cand = body.candidates and body.candidates[1]
  local content = jarray()
  local usage = usage_of(body.usageMetadata)
  if type(cand) ~= "table" then
    local pf = body.promptFeedback
    local blocked = type(pf) == "table" and pf.blockReason
    return lux_response(body.responseId, body.modelVersion, content, blocked and "safety" or "error", usage,
      not blocked and lux_error("server_error", "the provider answered without candidates") or nil)
  end
  local parts = cand.content and cand.content.parts or {}
  local calls = 0
  for i = 1, #parts do
    local p = parts[i]
    local blk
    if p.functionCall then
      local fc = p.functionCall
      blk = { type = "tool_use", tool_use = { id = call_id(fc), name = fc.name,
        arguments = args_string(fc.args) } }
      calls = calls + 1
    elseif type(p.text) == "string" then
      if p.thought then
        blk = { type = "thinking", thinking = { text = p.text, redacted = false } }
      else
        blk = { type = "text", text = p.text }
      end
    end
    if blk then
      if p.thoughtSignature then blk.provider_data = pdata({ thoughtSignature = p.thoughtSignature }) end
      content[#content + 1] = blk
    end
  end
  local anns = grounding_annotations(cand.groundingMetadata)
  if anns then -- on the last text block: the answer the pages support
    for i = #content, 1, -1 do
      if content[i].type == "text" then content[i].annotations = anns; break end
    end
  end
  return lux_response(body.responseId, body.modelVersion, content,
    finish_of(cand.finishReason, calls > 0) or "stop", usage)
end

-- ---------------------------------------------------------------- stream

local function close_open(events, state)
  local idx = state.open
  if idx then
    events[#events + 1] = { event = "block_end", index = idx }
    state.open, state.open_kind = nil, nil
  end
end

local function new_block(events, state, block_type)
  local idx = state.next or 0
  state.next = idx + 1
  events[#events + 1] = { event = "block_start", index = idx, block_type = block_type }
  return idx
end

local function signature_delta(events, idx, sig)
  events[#events + 1] = { event = "block_delta", index = idx,
    delta = { type = "provider_data", provider_data = pdata({ thoughtSignature = sig }) } }
end

function adapter.transform_stream_chunk(data, state)
  local ch, failed = decode_chunk(data, body_error, "chunk")
  if not ch then return failed end
  local events = {}
  if not state.started then
    state.started = true
    state.id = ch.responseId
    events[1] = { event = "conversation_start", meta = { id = ch.responseId, model = ch.modelVersion } }
  end
  local cand = ch.candidates and ch.candidates[1]
  if type(cand) == "table" then
    local parts = cand.content and cand.content.parts or {}
    for i = 1, #parts do
      local p = parts[i]
      local sig = p.thoughtSignature
      if p.functionCall then
        close_open(events, state)
        local fc = p.functionCall
        state.calls = (state.calls or 0) + 1
        local idx = new_block(events, state, { type = "tool_call", id = call_id(fc), name = fc.name })
        events[#events + 1] = { event = "block_delta", index = idx,
          delta = { type = "tool_arguments", arguments = args_string(fc.args) } }
        if sig then signature_delta(events, idx, sig) end
        events[#events + 1] = { event = "block_end", index = idx }
      elseif type(p.text) == "string" then
        local kind = p.thought and "thinking" or "text"
        if state.open_kind ~= kind then
          close_open(events, state)
          state.open = new_block(events, state, kind)
          state.open_kind = kind
          if kind == "text" then state.last_text = state.open end
        end
        local idx = state.open
        if p.text ~= "" then
          events[#events + 1] = { event = "block_delta", index = idx, delta = { type = kind, text = p.text } }
        end
        if sig then
          signature_delta(events, idx, sig)
          close_open(events, state) -- the signature belongs to this part: later text is a new part
        end
      end
    end
    local anns = state.last_text and grounding_annotations(cand.groundingMetadata)
    if anns then events[#events + 1] = { event = "annotations", index = state.last_text, annotations = anns } end
    local fr = finish_of(cand.finishReason, (state.calls or 0) > 0)
    if fr then
      close_open(events, state)
      events[#events + 1] = { event = "finish", finish_reason = fr }
      state.finished = true
    end
  elseif ch.promptFeedback and ch.promptFeedback.blockReason then
    events[#events + 1] = { event = "finish", finish_reason = "safety" }
    state.finished = true
  end
  local u = usage_of(ch.usageMetadata)
  if u then
    -- Gemini repeats usageMetadata on every chunk. Counters are cumulative (the host
    -- keeps the largest), so only a change is sent; the last chunk always has it.
    local last = state.usage
    if state.finished or not last or last.prompt_tokens ~= u.prompt_tokens
      or last.completion_tokens ~= u.completion_tokens or last.total_tokens ~= u.total_tokens
      or last.reasoning_tokens ~= u.reasoning_tokens or last.cached_tokens ~= u.cached_tokens then
      state.usage = u
      events[#events + 1] = { event = "usage", usage = u }
    end
  end
  if state.finished and not state.done then
    state.done = true
    events[#events + 1] = { event = "done" }
  end
  return emit(events)
end

return adapter
