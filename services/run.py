"""`make run`: the whole system on one machine — embedded PostgreSQL when no DATABASE_URL is set,
then each service as its own process, each waited for until its health service says SERVING.
Ctrl-C stops everything: services one at a time, Agent first (each drains), then the embedded database."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.shared.settings import Settings

# (name, module, address setting); a service whose module is not there yet is skipped.
SERVICES = [
    ("SessionStore", "services.session_store", "store_addr"),
    ("Compressor", "services.compressor", "compressor_addr"),
    ("Agent", "services.agent", "agent_addr"),
]


def wait_serving(addr: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"service on {addr} exited with code {proc.returncode}; see its log above")
            try:
                # types-grpcio-health-checking declares HealthStub without the methods its __init__ sets.
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)  # type: ignore[attr-defined]
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise SystemExit(f"service on {addr} did not report SERVING within {timeout:.0f}s")


def main() -> int:
    settings = Settings.from_env()
    env = dict(os.environ)
    embedded = None
    if not settings.database_url:
        from services.shared.embedded_pg import EmbeddedPostgres

        embedded = EmbeddedPostgres(settings.data_dir)
        env["DATABASE_URL"] = embedded.start()
        print(f"embedded PostgreSQL: {env['DATABASE_URL']} (data in {settings.data_dir})")
    procs: list[subprocess.Popen] = []
    # SIGTERM is Ctrl-C from the start: one arriving while the services start must still stop those
    # already running (they run in sessions of their own, so no signal reaches them but ours).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        for name, module, addr_field in SERVICES:
            if importlib.util.find_spec(f"{module}.__main__") is None:
                continue
            addr = getattr(settings, addr_field).split(",")[0].strip()  # a replica list: this one runs the first
            proc = subprocess.Popen([sys.executable, "-m", module], env=env, start_new_session=True)
            procs.append(proc)
            wait_serving(addr, 60, proc)
            print(f"{name:<13} serving on {addr}")
        print("\nTry:\n  grpcurl -plaintext localhost:50051 list\n  pal health\n\nCtrl-C stops everything.")
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
