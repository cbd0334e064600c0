-- gelbridge built-in adapter: OpenRouter (OpenAI Chat Completions with OpenRouter's
-- reasoning, Lux IR native).
--
-- The `openai` transforms (luxkit.openai_family("openrouter")) plus what OpenRouter adds:
-- an assistant message's `reasoning_details` array (reasoning.summary, .encrypted and
-- .text entries with their signatures; streamed in pieces, merged by index) is kept as
-- provider_data and passed back unchanged on the next request to the same model (the
-- host keeps provider_data only for that provider and model), which is what lets a
-- reasoning model behind OpenRouter continue its reasoning across tool calls; the
-- unified `reasoning` parameter ({effort} or {enabled = false}) instead of
-- reasoning_effort; the conversation's cache key as `session_id` (OpenRouter's sticky
-- routing key, which keeps a conversation on one upstream's prompt cache) instead of
-- prompt_cache_key.
-- Written for gelbridge (not derived from other adapters).

local adapter = {
  name = "openrouter",
  version = "1.0.0",
  format = "lux-ir-v1",
  endpoint = "/chat/completions",
  stream_format = "sse",
  auth = "bearer",
  tool_call_id = { pattern = "^[a-zA-Z0-9_-]+$", max_length = 64 },
  headers = {},
}

local family = luxkit.openai_family("openrouter")
adapter.transform_request = family.transform_request
adapter.transform_response = family.transform_response
adapter.transform_stream_chunk = family.transform_stream_chunk

return adapter
