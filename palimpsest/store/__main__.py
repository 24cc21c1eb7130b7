"""`python -m palimpsest.store`: the SessionStore alone, on PALIMPSEST_STORE_ADDR (default :50051)."""

from palimpsest.shared.server import run_service
from palimpsest.store.app import start_store

if __name__ == "__main__":
    run_service(start_store, lambda settings: settings.store_addr, "SessionStore")
