"""`make run`: the whole system on one machine — embedded PostgreSQL when no DATABASE_URL is set,
then each service as its own process, each waited for until its health service says SERVING.
Ctrl-C stops everything: services one at a time, Agent first (each drains), then the embedded database."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from palimpsest.shared import tls
from palimpsest.shared.server import DEBUG_ENV, debug_enabled, settings_tls
from palimpsest.shared.settings import Settings

# (name, module, address setting); a service whose module is not there yet is skipped.
SERVICES = [
    ("SessionStore", "palimpsest.store", "store_addr"),
    ("Compressor", "palimpsest.compressor", "compressor_addr"),
    ("Agent", "palimpsest.agent", "agent_addr"),
]
# What pal reads to find the services: a hint for another terminal must carry them when set here.
PAL_ADDRESS_VARS = ("PALIMPSEST_STORE_ADDR", "PALIMPSEST_COMPRESSOR_ADDR", "PALIMPSEST_AGENT_ADDR")


def wait_serving(
    name: str, addr: str, timeout: float, proc: subprocess.Popen, credentials: grpc.ChannelCredentials | None = None
) -> None:
    deadline = time.monotonic() + timeout
    with grpc.secure_channel(addr, credentials) if credentials else grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(
                    f"make run: {name} exited while starting (status {proc.returncode}); "
                    "its reason is on the line above"
                )
            try:
                # types-grpcio-health-checking declares HealthStub without the methods its __init__ sets.
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)  # type: ignore[attr-defined]
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise SystemExit(
        f"make run: {name} on {addr} did not report SERVING within {timeout:.0f}s; {DEBUG_ENV}=1 shows more of its log"
    )


def command_as_typed(name: str) -> str | None:
    """How to type one of the virtualenv's commands so that it runs: its bare name when the shell
    finds this very one on PATH, else its path (relative to here when it is below here)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        return name if shutil.which(name) else None
    found = shutil.which(name)
    if found and Path(found).resolve() == path.resolve():
        return name
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def try_hint(settings: Settings, environ: Mapping[str, str]) -> str:
    """Commands that work as printed: the configured addresses, and the client commands by a path
    the shell finds (a new terminal has neither the virtualenv nor this shell's settings)."""
    store = settings.store_addr.split(",")[0].strip()
    agent = settings.agent_addr.split(",")[0].strip()
    addresses = " ".join(
        f"{var}={shlex.quote(environ[var].strip())}" for var in PAL_ADDRESS_VARS if environ.get(var, "").strip()
    )
    prefix = addresses + " " if addresses else ""
    lines = []
    pal = command_as_typed("pal")
    if pal:
        lines += [f"  {prefix}{pal} health", f"  {prefix}{pal} chat"]
    grpcurl = command_as_typed("grpcurl")
    if grpcurl:
        lines += [
            f"  {grpcurl} -plaintext {store} list",
            f"  {grpcurl} -plaintext {agent} describe palimpsest.v1.Agent",
        ]
    here = "" if all(not line.strip().startswith(".venv") for line in lines) else f" (from {Path.cwd()})"
    return f"\nTry{here}:\n" + "\n".join(lines) + "\n\nCtrl-C stops everything."


def metrics_env(env: dict[str, str], port: int | None, index: int) -> tuple[dict[str, str], str]:
    """One machine, three services: PALIMPSEST_METRICS_PORT is the first service's metrics port and
    the next ones take the ports after it (0: each its own free port)."""
    if port is None:
        return env, ""
    own = port + index if port else 0
    return {**env, "PALIMPSEST_METRICS_PORT": str(own)}, f", metrics on :{own}" if own else ""


def main() -> int:
    settings = Settings.from_env()
    env = dict(os.environ)
    embedded = None
    if not settings.database_url:
        from palimpsest.shared.embedded_pg import EmbeddedPostgres

        embedded = EmbeddedPostgres(settings.data_dir)
        try:
            env["DATABASE_URL"] = embedded.start()
        except Exception as exc:  # noqa: BLE001 — one line, as for the services
            if debug_enabled():
                raise
            raise SystemExit(
                f"make run: the embedded PostgreSQL did not start in {settings.data_dir} "
                f"({type(exc).__name__}: {exc}); set PALIMPSEST_DATA_DIR to a folder of your own, "
                f"or DATABASE_URL to a PostgreSQL of yours ({DEBUG_ENV}=1 for the traceback)"
            ) from None
        print(f"embedded PostgreSQL: {env['DATABASE_URL']} (data in {settings.data_dir})")
    credentials = settings_tls(lambda: tls.channel_credentials(settings.tls_ca, settings.tls_cert, settings.tls_key))
    procs: list[subprocess.Popen] = []
    # SIGTERM is Ctrl-C from the start: one arriving while the services start must still stop those
    # already running (they run in sessions of their own, so no signal reaches them but ours).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        for index, (name, module, addr_field) in enumerate(SERVICES):
            if importlib.util.find_spec(f"{module}.__main__") is None:
                continue
            addr = getattr(settings, addr_field).split(",")[0].strip()  # a replica list: this one runs the first
            own_env, metrics = metrics_env(env, settings.metrics_port, index)
            proc = subprocess.Popen([sys.executable, "-m", module], env=own_env, start_new_session=True)
            procs.append(proc)
            wait_serving(name, addr, 60, proc, credentials)
            print(f"{name:<13} serving on {addr}{metrics}")
        print(try_hint(settings, env), flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        print("a service exited; stopping the others", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping…")
        return 0
    finally:
        # One at a time, the Agent first: its turns in flight still store their answers while it
        # drains, which they could not if the SessionStore were stopping beside it.
        for proc in reversed(procs):
            stop_gracefully(proc, settings.grace_seconds + 5)
        if embedded is not None:
            embedded.stop()


def stop_gracefully(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (the service drains its calls in flight), then SIGKILL if it outlives `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
