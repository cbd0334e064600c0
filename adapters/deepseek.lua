-- gelbridge built-in adapter: DeepSeek chat completions (Lux IR native).
--
-- OpenAI-compatible: the transforms are luxkit.openai_family("deepseek") (host code,
-- gelbridge/_adapters/lua/luxkit.lua), shared with openai.lua. The flavor changes:
--   * reasoning -> thinking {type = enabled|disabled} (+ reasoning_effort low/high/max);
--     max_output_tokens is always max_tokens;
--   * reasoning_content comes back as a thinking block tagged with provider_data, and
--     is sent back as reasoning_content on assistant turns of the same model (the host
--     keeps provider_data only for that model); DeepSeek requires it after tool calls.
-- Written for gelbridge (not derived from other adapters).

local adapter = {
  name = "deepseek",
  version = "1.0.0",
  format = "lux-ir-v1",
  endpoint = "/chat/completions",
  stream_format = "sse",
  auth = "bearer",
  tool_call_id = { pattern = "^[a-zA-Z0-9_-]+$", max_length = 64 },
  headers = {},
}

local family = luxkit.openai_family("deepseek")
adapter.transform_request = family.transform_request
adapter.transform_response = family.transform_response
adapter.transform_stream_chunk = family.transform_stream_chunk

return adapter
