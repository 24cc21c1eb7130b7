"""`python -m services.session_store`: the SessionStore alone, on PALIMPSEST_STORE_ADDR (default :50051)."""

import asyncio

from services.shared.server import configure_logging, serve_forever
from services.shared.settings import Settings
from services.session_store.app import start_store


async def main() -> None:
    settings = Settings.from_env()
    host, port = settings.store_addr.rsplit(":", 1)
    running = await start_store(settings, port=int(port), host=host)
    await serve_forever(running, name="SessionStore", grace=settings.grace_seconds)


if __name__ == "__main__":
    configure_logging()
    asyncio.run(main())
