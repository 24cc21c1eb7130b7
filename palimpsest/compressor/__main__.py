"""`python -m palimpsest.compressor`: one Compressor replica.

Clients list every replica, comma-separated, in PALIMPSEST_COMPRESSOR_ADDR; a replica listens on
PALIMPSEST_COMPRESSOR_LISTEN, or else on the first address of that list. Replicas share nothing
but the SessionStore."""

from palimpsest.compressor.app import start_compressor
from palimpsest.shared.server import run_service
from palimpsest.shared.settings import Settings


def listen_address(settings: Settings) -> str:
    return settings.compressor_listen


if __name__ == "__main__":
    run_service(start_compressor, listen_address, "Compressor")
