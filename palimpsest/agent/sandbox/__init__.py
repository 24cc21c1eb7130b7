"""Commands in a real OS sandbox: bubblewrap with every namespace new, the workspace read-write at
/workspace, the system read-only, nothing else of the host, and hard limits (policy.py). The
``run_command`` tool calls ``run_command`` here; the Agent reports ``probe()`` at start and in health."""

from palimpsest.agent.sandbox.availability import SandboxStatus, probe
from palimpsest.agent.sandbox.owner import SandboxError
from palimpsest.agent.sandbox.policy import OPERATOR_MODES, SandboxPolicy, effective_policy, policy_from_config
from palimpsest.agent.sandbox.result import CapturedOutput, CommandResult, StopReason
from palimpsest.agent.sandbox.runner import SandboxUnavailable, run_command

# The tool that runs commands (its name is fixed by the issue that asked for it).
COMMAND_TOOL = "run_command"

__all__ = [
    "COMMAND_TOOL",
    "OPERATOR_MODES",
    "CapturedOutput",
    "CommandResult",
    "SandboxError",
    "SandboxPolicy",
    "SandboxStatus",
    "SandboxUnavailable",
    "StopReason",
    "effective_policy",
    "policy_from_config",
    "probe",
    "run_command",
]
