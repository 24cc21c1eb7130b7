"""`python -m palimpsest.agent`: the Agent on PALIMPSEST_AGENT_ADDR (default :50053)."""

from palimpsest.agent.app import start_agent
from palimpsest.shared.server import run_service

if __name__ == "__main__":
    run_service(start_agent, lambda settings: settings.agent_addr, "Agent")
