"""The SessionStore servicer's RPCs, by what they serve; palimpsest.store.servicer joins them."""
