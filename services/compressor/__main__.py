"""`python -m services.compressor`: one Compressor replica on PALIMPSEST_COMPRESSOR_ADDR (default :50052).

Run several with different addresses and list them all, comma-separated, in the Agent's
PALIMPSEST_COMPRESSOR_ADDR: they share nothing but the SessionStore."""

import asyncio

from services.compressor.app import start_compressor
from services.shared.server import configure_logging, serve_forever
from services.shared.settings import Settings


async def main() -> None:
    settings = Settings.from_env()
    # A comma list names replicas for clients; a replica listens on the first address unless
    # PALIMPSEST_COMPRESSOR_LISTEN says otherwise.
    import os

    listen = os.environ.get("PALIMPSEST_COMPRESSOR_LISTEN") or settings.compressor_addr.split(",")[0].strip()
    host, port = listen.rsplit(":", 1)
    running = await start_compressor(settings, port=int(port), host=host)
    await serve_forever(running, name="Compressor", grace=settings.grace_seconds)


if __name__ == "__main__":
    configure_logging()
    asyncio.run(main())
