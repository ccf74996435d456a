"""Gates for the MCP server tests (``toolfleet mcp --gate tests.support.mcp_gates:NAME``)."""

from __future__ import annotations

from toolfleet.dispatcher.govern.permissions import PermissionPolicy
from toolfleet.schemas.action import ToolInvocation


def no_forbidden_echo(invocation: ToolInvocation) -> bool:
    """Deny ``echo`` of the value "forbidden"; allow everything else."""
    return not (invocation.function == "echo" and invocation.arguments.get("value") == "forbidden")


# Denies every call of `returns_none` (a PermissionPolicy used as a session gate).
policy = PermissionPolicy(deny={"returns_none": ["*"]})
