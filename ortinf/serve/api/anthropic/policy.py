"""What /v1/messages does with each request field (ortinf/serve/policy_rules.py: the kinds; ortinf/serve/field_policy.py applies them)."""

from __future__ import annotations

from ortinf.serve.policy_rules import Rule, ignored, implemented, refused

MESSAGES: dict[str, Rule] = {
    "model": implemented("the served model; optional when one model is served"),
    "messages": implemented("user and assistant turns: text, image (base64; url from --allowed-media-domains hosts), document "
                            "(text and plain-text sources; a PDF is a 400), tool_use and tool_result blocks; earlier turns' "
                            "thinking blocks are dropped, as Anthropic's API does; system turns where the template writes "
                            "them, else in the system prompt"),
    "max_tokens": implemented("required, as Anthropic's"),
    "system": implemented("a string or text blocks: the system message"),
    "stop_sequences": implemented("stop strings; stop_reason stop_sequence names the one matched"),
    "stream": implemented("Anthropic's events: message_start, content_block_start/delta/stop, message_delta, message_stop"),
    "temperature": implemented("0 to 1; 0 is greedy"),
    "top_p": implemented("nucleus sampling"),
    "top_k": implemented("top-k sampling"),
    "tools": implemented("client tools (name, description, input_schema); server tools (web_search_..., code_execution_...) "
                         "and tools with defer_loading are left out and named in X-Ignored-Fields (--hosted-tools refuse: "
                         "a 400)"),
    "cache_salt": implemented("vLLM's: prefix-cache blocks are shared only between requests with the same salt (or the "
                              "x-cache-salt header); cache_read_input_tokens then tells nothing across salts"),
    "tool_choice": implemented("auto (read by the tool-call parser), any and tool (enforced by a grammar), none; "
                               "disable_parallel_tool_use allows one call"),
    "thinking": implemented("enabled, adaptive, between_tools or disabled: the chat template's enable_thinking; thinking "
                            "blocks come from --reasoning-parser; budget_tokens and display are not enforced"),
    "output_config": implemented("format (json_schema: enforced by a grammar); effort: the chat template's reasoning_effort"),
    "metadata": ignored("user_id identifies an end user; no effect on the output"),
    "service_tier": ignored("one tier"),
    "speed": ignored("one speed"),
    "inference_geo": ignored("it runs here"),
    "diagnostics": ignored("no prompt-cache divergence reports"),
    "user_profile_id": ignored("no user profiles"),
    "workspace_id": ignored("no workspaces"),
    "context_management": ignored("the conversation is rendered as sent"),
    "cache_control": ignored("the prefix cache is automatic"),
    "container": refused("this server runs no code-execution container: drop it"),
    "mcp_servers": refused("this server connects to no MCP server: call the tools from the client"),
}
POLICY = {"/v1/messages": MESSAGES, "/v1/messages/count_tokens": MESSAGES}
