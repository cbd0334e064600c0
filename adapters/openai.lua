-- gelbridge built-in adapter: OpenAI Chat Completions (Lux IR native).
--
-- Also serves OpenAI-compatible hosts (OpenRouter, Mistral, Groq, GitHub Models) by
-- configuration (base_url). The transforms are luxkit.openai_family("openai") (host
-- code, gelbridge/_adapters/lua/luxkit.lua), shared with deepseek.lua; this file holds
-- what is OpenAI's own: the metadata.
-- Written for gelbridge (not derived from other adapters).

local adapter = {
  name = "openai",
  version = "1.0.0",
  format = "lux-ir-v1",
  endpoint = "/chat/completions",
  stream_format = "sse",
  auth = "bearer",
  -- OpenAI refuses tool call ids longer than 40 characters.
  tool_call_id = { pattern = "^[a-zA-Z0-9_-]+$", max_length = 40 },
  headers = {},
}

local family = luxkit.openai_family("openai")
adapter.transform_request = family.transform_request
adapter.transform_response = family.transform_response
adapter.transform_stream_chunk = family.transform_stream_chunk

return adapter
