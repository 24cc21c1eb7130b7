"""Client channels between the services: one place for targets, balancing and retries."""

from __future__ import annotations

import json

import grpc

from services.shared.addresses import channel_target
from services.shared.server import channel_options
from services.shared.settings import Settings

# UNAVAILABLE is retried a few times with backoff: a replica restarting must not fail a turn.
_RETRY = {
    "maxAttempts": 4,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
# Calls that may rightly take long: a compression waits for a summary, files stream megabytes.
LONG_CALLS = frozenset({
    "/palimpsest.v1.Compressor/Compress",
    "/palimpsest.v1.SessionStore/PutFile",
    "/palimpsest.v1.SessionStore/GetFile",
})
_SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{"name": [{"service": "palimpsest.v1.SessionStore"}, {"service": "palimpsest.v1.Compressor"}],
                      "retryPolicy": _RETRY}],
}


class DefaultDeadline(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor,
                      grpc.aio.StreamUnaryClientInterceptor):
    """A deadline on every call whose caller sets none: one hung store or Compressor must never
    hold a turn (and its session) forever. (Not the service config's `timeout`: gRPC 1.85 ended
    calls after ~0.15 s of a configured 2 s, measured through a frozen connection.)"""

    def __init__(self, seconds: float, long_seconds: float):
        self.seconds = seconds
        self.long_seconds = long_seconds

    def _with_deadline(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        if details.timeout is not None:
            return details
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        timeout = self.long_seconds if method in LONG_CALLS else self.seconds
        return grpc.aio.ClientCallDetails(details.method, timeout, details.metadata, details.credentials,
                                          details.wait_for_ready)

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._with_deadline(client_call_details), request)

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._with_deadline(client_call_details), request)

    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._with_deadline(client_call_details), request_iterator)


def open_channel(addresses: str, settings: Settings) -> grpc.aio.Channel:
    options = [*channel_options(settings), ("grpc.service_config", json.dumps(_SERVICE_CONFIG)),
               ("grpc.enable_retries", 1)]
    return grpc.aio.insecure_channel(channel_target(addresses), options=options, interceptors=[
        DefaultDeadline(settings.rpc_timeout_s, settings.compress_timeout_s)])
