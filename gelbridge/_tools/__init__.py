"""Tools for the model: registry, built-in tools, MCP servers, execution, approval.

Pure parts: ``approval`` (resolution of the user's answers), ``execute.parse_arguments``
and ``execute.cut_output``, ``registry.mcp_tool_name``, the checks in ``fetch_url``.
Shell: ``execute_calls``, the MCP connections, the HTTP fetch. See docs/tools.md.
"""

from gelbridge._tools.approval import (
    ApprovalAnswer,
    ApprovalOutcome,
    IgnoredAnswer,
    Resolution,
    WaitingCall,
    call_digest,
    denial_output,
    input_digest,
    resolve_approvals,
)
from gelbridge._tools.execute import ToolCall, ToolOutcome, cut_output, execute_calls, parse_arguments
from gelbridge._tools.journal import execute_journaled
from gelbridge._tools.loader import builtin_tools, load_tool_registry
from gelbridge._tools.registry import Tool, ToolOutput, ToolRegistry, mcp_tool_name, needs_approval

__all__ = [
    "ApprovalAnswer",
    "ApprovalOutcome",
    "IgnoredAnswer",
    "Resolution",
    "Tool",
    "ToolCall",
    "ToolOutcome",
    "ToolOutput",
    "ToolRegistry",
    "WaitingCall",
    "builtin_tools",
    "cut_output",
    "denial_output",
    "execute_calls",
    "execute_journaled",
    "call_digest",
    "input_digest",
    "load_tool_registry",
    "mcp_tool_name",
    "needs_approval",
    "parse_arguments",
    "resolve_approvals",
]
