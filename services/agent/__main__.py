"""`python -m services.agent`: the Agent on PALIMPSEST_AGENT_ADDR (default :50053)."""

from services.agent.app import start_agent
from services.shared.server import run_service

if __name__ == "__main__":
    run_service(start_agent, lambda settings: settings.agent_addr, "Agent")
