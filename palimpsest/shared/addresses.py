"""Service addresses as the services and `pal` read them: one place that turns an address setting
into a gRPC target. Plain Python, so the CLI can import it without the services' dependencies."""

from __future__ import annotations


def replicas(addresses: str) -> list[str]:
    """An address setting (`PALIMPSEST_COMPRESSOR_ADDR`, …) may list several replicas, comma-separated."""
    return [part.strip() for part in addresses.split(",") if part.strip()]


def channel_target(addresses: str) -> str:
    """`host:port` stays as is; a comma list of replicas becomes one target that gRPC balances over
    (the `ipv4:` scheme takes literal addresses only, so localhost is spelled out)."""
    parts = replicas(addresses)
    if not parts:
        raise ValueError(f"no address in {addresses!r}")
    if len(parts) == 1:
        return parts[0]
    return "ipv4:" + ",".join(p.replace("localhost", "127.0.0.1") for p in parts)
