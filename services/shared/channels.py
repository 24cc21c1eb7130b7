"""Client channels between the services: one place for targets, balancing and retries."""

from __future__ import annotations

import json

import grpc

from services.shared.server import channel_options
from services.shared.settings import Settings

# UNAVAILABLE is retried a few times with backoff: a replica restarting must not fail a turn.
_SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": "palimpsest.v1.SessionStore"}, {"service": "palimpsest.v1.Compressor"}],
            "retryPolicy": {
                "maxAttempts": 4,
                "initialBackoff": "0.1s",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ],
}


def target_for(addresses: str) -> str:
    """`host:port` stays as is; a comma list of replicas becomes one balanced target."""
    parts = [a.strip() for a in addresses.split(",") if a.strip()]
    if not parts:
        raise ValueError("empty address")
    if len(parts) == 1:
        return parts[0]
    hosts = [p.replace("localhost", "127.0.0.1") for p in parts]
    return "ipv4:" + ",".join(hosts)


def open_channel(addresses: str, settings: Settings) -> grpc.aio.Channel:
    options = [*channel_options(settings), ("grpc.service_config", json.dumps(_SERVICE_CONFIG)),
               ("grpc.enable_retries", 1)]
    return grpc.aio.insecure_channel(target_for(addresses), options=options)
