"""Wiring of the Compressor: a channel to the store, the Ollama client, the servicer."""

from __future__ import annotations

from palimpsest.compressor.servicer import CompressorServicer
from palimpsest.shared.channels import open_channel
from palimpsest.shared.ollama import OllamaClient
from palimpsest.shared.server import RunningServer, method_paths, start_server
from palimpsest.shared.settings import Settings
from palimpsest.v1 import compressor_pb2, compressor_pb2_grpc
from palimpsest.v1.session_store_pb2_grpc import SessionStoreStub

SERVICE_NAME = compressor_pb2.DESCRIPTOR.services_by_name["Compressor"].full_name
# The requests that carry the messages to price (a whole context); every other request takes
# PALIMPSEST_MAX_SMALL_REQUEST_BYTES.
LARGE_REQUESTS = method_paths(SERVICE_NAME, "EstimateTokens", "CheckContextSize")


async def start_compressor(settings: Settings, *, port: int, host: str = "127.0.0.1") -> RunningServer:
    channel = open_channel(settings.store_addr, settings, service="SessionStore")
    ollama = OllamaClient(settings.ollama_host)
    servicer = CompressorServicer(SessionStoreStub(channel), ollama, settings)

    async def on_stop() -> None:
        await ollama.aclose()
        await channel.close()

    running = await start_server(
        lambda server: compressor_pb2_grpc.add_CompressorServicer_to_server(servicer, server),
        [SERVICE_NAME],
        settings=settings,
        port=port,
        host=host,
        on_stop=on_stop,
        large_requests=LARGE_REQUESTS,
    )
    running.servicer = servicer  # tests reach its tokenizers through it
    return running
