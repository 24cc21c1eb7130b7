"""`python -m services.session_store`: the SessionStore alone, on PALIMPSEST_STORE_ADDR (default :50051)."""

from services.session_store.app import start_store
from services.shared.server import run_service

if __name__ == "__main__":
    run_service(start_store, lambda settings: settings.store_addr, "SessionStore")
