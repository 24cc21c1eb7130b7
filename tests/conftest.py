"""Shared fixtures: a real PostgreSQL, real gRPC servers on port 0, generated stubs."""

from __future__ import annotations

import fcntl
import hashlib
import os
import uuid
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from palimpsest.shared.auth import make_token
from palimpsest.shared.settings import Settings
from palimpsest.v1 import session_store_pb2_grpc

JWT_SECRET = "test-secret-for-palimpsest-tests-only"


CHECKOUT = Path(__file__).resolve().parents[1]


def checkout_test_dir(checkout: Path) -> Path:
    """The test database folder of one checkout: beside the data folder (as root, under /var/lib,
    where the database's own user can reach it), named after the checkout and a hash of its path, so
    two checkouts (worktrees, clones) never share a database or wait on each other's lock."""
    from palimpsest.shared.settings import default_data_dir

    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in checkout.name)[:40]
    digest = hashlib.sha256(str(checkout).encode()).hexdigest()[:8]
    return default_data_dir().with_name(f"palimpsest-test-{name}-{digest}")


def _test_pg_dir() -> Path:
    """PALIMPSEST_TEST_DATA_DIR, else a folder of this checkout's own."""
    return Path(os.environ.get("PALIMPSEST_TEST_DATA_DIR") or checkout_test_dir(CHECKOUT))


def pytest_configure(config) -> None:
    """The run's controller (not an xdist worker) notes whether the test database was already up."""
    if not hasattr(config, "workerinput") and not os.environ.get("TEST_DATABASE_URL"):
        from palimpsest.shared.embedded_pg import EmbeddedPostgres

        config.test_pg_was_running = bool(EmbeddedPostgres(_test_pg_dir()).running_port())


# Fixtures that start a server, a database or the Ollama simulator, and modules whose tests start
# processes of their own (commands, the services, pal, make): a test with none of them (directly
# or through another fixture) is a pure test, and `make test-fast` runs those alone.
SERVICE_FIXTURES = frozenset(
    {
        "database_url",
        "store_server",
        "store_server_auth",
        "store",
        "store_auth",
        "ollama_sim",
        "compressor_server",
        "compressor",
        "agent_server",
        "agent",
        "semantic_store",
        "sim",
    }
)

PROCESS_MODULES = frozenset(
    {
        "test_embedded_pg",
        "test_faults",
        "test_grpcurl",
        "test_mcp_servers",
        "test_newcomer",
        "test_node_client",
        "test_pal",
        "test_pal_agent",
        "test_pal_client_tools",
        "test_runtime_deps",
        "test_sandbox",
        "test_tracing",
    }
)


# Fixtures of pure tests that take seconds of CPU each (llama.cpp's vocab files, fetched with pip,
# and every vocabulary in them built and run over its reference vectors; Qwen 2's 151k-token
# vocabulary under each byte-level pre-tokenizer): marked `slow`, in `make test`, not `make test-fast`.
SLOW_FIXTURES = frozenset({"oracle_dir", "vocab_dir", "qwen2_vocabulary"})


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        module = getattr(item, "module", None)
        fixtures = getattr(item, "fixturenames", ())
        if SERVICE_FIXTURES.intersection(fixtures) or (
            module is not None and module.__name__.rsplit(".", 1)[-1] in PROCESS_MODULES
        ):
            item.add_marker(pytest.mark.services)
        elif SLOW_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.slow)


def pytest_unconfigure(config) -> None:
    """A run leaves no database behind that it started (workers share one; the controller stops it)."""
    if getattr(config, "test_pg_was_running", True):
        return
    from palimpsest.shared.embedded_pg import EmbeddedPostgres

    EmbeddedPostgres(_test_pg_dir(), started_here=True).stop()


def _embedded_url() -> str:
    from palimpsest.shared.embedded_pg import EmbeddedPostgres

    data_dir = _test_pg_dir()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    # xdist workers share one server: the first initializes it, the others wait on the lock.
    with open(data_dir.parent / f".{data_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return EmbeddedPostgres(data_dir).start()


@pytest.fixture(scope="session")
def database_url() -> str:
    """TEST_DATABASE_URL when set (CI runs the suite against the machine's server too), else embedded."""
    return os.environ.get("TEST_DATABASE_URL") or _embedded_url()


def _test_data_dir() -> Path:
    """Shared by the test runs of this machine, like the embedded database: tokenizers built from
    the simulator's vocabulary are cached there once (by digest), not rebuilt by every module."""
    from palimpsest.shared.settings import default_data_dir

    return Path(os.environ.get("PALIMPSEST_TEST_CACHE_DIR", str(default_data_dir().with_name("palimpsest-test-cache"))))


@pytest.fixture(scope="session")
def base_settings(tmp_path_factory) -> Settings:
    root = tmp_path_factory.mktemp("files")
    # No embedding model: the shared stores search memory lexically, whatever answers on
    # 127.0.0.1:11434; tests of the semantic tier start stores of their own on the simulator.
    return replace(
        Settings(),
        files_root=root,
        data_dir=_test_data_dir(),
        jwt_secret=JWT_SECRET,
        session_titles=False,
        file_sweep_interval_s=3600,
        embed_model="",
    )


async def _start_store(settings: Settings, dsn: str):
    from palimpsest.store.app import start_store

    return await start_store(settings, port=0, dsn=dsn)


@pytest.fixture(scope="session")
async def store_server(base_settings, database_url):
    running = await _start_store(base_settings, database_url)
    yield running
    await running.stop(0)


@pytest.fixture(scope="session")
async def store_server_auth(base_settings, database_url):
    running = await _start_store(replace(base_settings, auth_enabled=True), database_url)
    yield running
    await running.stop(0)


@pytest.fixture(scope="session")
async def store(store_server):
    async with grpc.aio.insecure_channel(store_server.address) as channel:
        yield session_store_pb2_grpc.SessionStoreStub(channel)


@pytest.fixture(scope="session")
async def store_auth(store_server_auth):
    async with grpc.aio.insecure_channel(store_server_auth.address) as channel:
        yield session_store_pb2_grpc.SessionStoreStub(channel)


def bearer(sub: str, role: str = "user") -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {make_token(sub, JWT_SECRET, role)}"),)


@pytest.fixture
def user() -> str:
    """A user of its own, so parallel tests never see each other's sessions."""
    return f"user-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def profile() -> str:
    return f"profile-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def ollama_sim():
    """A real HTTP server speaking Ollama's protocol, one per test module."""
    from ollama_sim import OllamaSimulator

    with OllamaSimulator() as sim:
        yield sim


@pytest.fixture
def fresh_sim(ollama_sim):
    """The simulator's deterministic echo for the test, whatever an earlier one scripted or set to
    respond (modules take it with `pytestmark = pytest.mark.usefixtures("fresh_sim")`)."""
    ollama_sim.clear()
    ollama_sim.set_responder(None)
    yield
    ollama_sim.set_responder(None)


@pytest.fixture(scope="module")
async def compressor_server(base_settings, store_server, ollama_sim):
    from palimpsest.compressor.app import start_compressor

    settings = replace(base_settings, ollama_host=ollama_sim.url, store_addr=store_server.address)
    running = await start_compressor(settings, port=0)
    yield running
    await running.stop(0)


@pytest.fixture(scope="module")
async def compressor(compressor_server):
    from palimpsest.v1 import compressor_pb2_grpc

    async with grpc.aio.insecure_channel(compressor_server.address) as channel:
        yield compressor_pb2_grpc.CompressorStub(channel)


# A model name of this run only: calibration observations live in the (persistent) store.
# (Through the environment: this module is imported both as `conftest` and as `tests.conftest`.)
# A new session's title is one more model call after its first answer: tests that count or read
# the model's calls would see it. Off for them (in process and in the services they start);
# tests/agent/test_session_titles.py turns it on.
os.environ.setdefault("PALIMPSEST_SESSION_TITLES", "0")
LIAR_MODEL = os.environ.setdefault("PALIMPSEST_TEST_LIAR_MODEL", f"liar-{uuid.uuid4().hex[:8]}")

TEST_PROFILES = {
    "default": "small",
    "profiles": [
        {"id": "small", "name": "Small window", "model": "qwen3.6", "context_window": 8192, "max_iterations": 8},
        {
            "id": "tiny",
            "name": "No thinking",
            "model": "tiny",
            "context_window": 8192,
            "max_iterations": 4,
            "think_enabled": False,
        },
        {
            "id": "looper",
            "name": "Short leash",
            "model": "qwen3.6",
            "context_window": 8192,
            "max_iterations": 6,
            "goal_anchoring_interval": 2,
            "anti_stall_threshold": 3,
            "think_enabled": False,
        },
        {"id": "missing", "name": "Unpulled model", "model": "no-such-model", "context_window": 8192},
        {
            "id": "liar",
            "name": "Miscalibrated",
            "model": LIAR_MODEL,
            "context_window": 32768,
            "think_enabled": False,
            "memory_recall_enabled": False,
        },
    ],
}


@pytest.fixture(scope="module")
def profiles_file(tmp_path_factory) -> str:
    import json

    path = tmp_path_factory.mktemp("profiles") / "profiles.json"
    path.write_text(json.dumps(TEST_PROFILES))
    return str(path)


def agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles_file, **overrides):
    return replace(
        base_settings,
        ollama_host=ollama_sim.url,
        store_addr=store_server.address,
        compressor_addr=compressor_server.address,
        profiles_path=profiles_file,
        **overrides,
    )


@asynccontextmanager
async def three_services(settings: Settings, database_url: str, ollama_sim, profiles_file: str):
    """A SessionStore, a Compressor and an Agent of a test module's own, started with ``settings``
    (metrics, TLS, tracing: what the shared servers do not have), stopped Agent first."""
    from palimpsest.agent.app import start_agent
    from palimpsest.compressor.app import start_compressor
    from palimpsest.store.app import start_store

    store = await start_store(settings, port=0, dsn=database_url)
    compressor = await start_compressor(replace(settings, ollama_host=ollama_sim.url, store_addr=store.address), port=0)
    agent = await start_agent(agent_settings(settings, store, compressor, ollama_sim, profiles_file), port=0)
    try:
        yield store, compressor, agent
    finally:
        for running in (agent, compressor, store):
            await running.stop(0)


@pytest.fixture(scope="module")
async def agent_server(base_settings, store_server, compressor_server, ollama_sim, profiles_file):
    from palimpsest.agent.app import start_agent

    running = await start_agent(
        agent_settings(base_settings, store_server, compressor_server, ollama_sim, profiles_file), port=0
    )
    yield running
    await running.stop(0)


@pytest.fixture(scope="module")
async def agent(agent_server):
    from palimpsest.v1 import agent_pb2_grpc

    async with grpc.aio.insecure_channel(agent_server.address) as channel:
        yield agent_pb2_grpc.AgentStub(channel)
