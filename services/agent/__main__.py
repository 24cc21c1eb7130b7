"""`python -m services.agent`: the Agent on PALIMPSEST_AGENT_ADDR (default :50053)."""

import asyncio

from services.agent.app import start_agent
from services.shared.server import configure_logging, serve_forever
from services.shared.settings import Settings


async def main() -> None:
    settings = Settings.from_env()
    host, port = settings.agent_addr.rsplit(":", 1)
    running = await start_agent(settings, port=int(port), host=host)
    await serve_forever(running, name="Agent", grace=settings.grace_seconds)


if __name__ == "__main__":
    configure_logging()
    asyncio.run(main())
