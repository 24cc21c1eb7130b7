"""`pal context`, `pal profiles`, `pal health`: what the model sees, what is configured, what is up."""

from __future__ import annotations

import argparse

import grpc
from grpc_health.v1 import health_pb2

from clients.pal.app import App
from clients.pal.commands import Subparsers
from clients.pal.connection import AGENT, COMPRESSOR, ENDPOINTS
from clients.pal.errors import ServiceError
from clients.pal.views import context_view, health_table, mcp_servers_view, mcp_state, profiles_table
from palimpsest.v1 import agent_pb2, session_store_pb2 as pb
from services.shared.addresses import replicas

# A health check that takes longer than this is as good as down for someone asking "is it up?".
HEALTH_TIMEOUT_S = 3.0
SERVICE_NAMES = {
    "SessionStore": "palimpsest.v1.SessionStore",
    COMPRESSOR.name: "palimpsest.v1.Compressor",
    AGENT.name: "palimpsest.v1.Agent",
}
# The Agent keeps a health entry of this name for Ollama: it serves turns' errors even without it.
OLLAMA_HEALTH_ENTRY = "ollama"
# And one for its MCP servers, once a profile names one: a server that is down costs its tools only.
MCP_HEALTH_ENTRY = "mcp"


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("context", help="what the model sees of a session, after compression", parents=[common])
    p.add_argument("session_id")
    p.add_argument("--brief", action="store_true", help="a short preview of each message")
    p.set_defaults(handler=context)

    p = sub.add_parser("profiles", help="the Agent's configured profiles", parents=[common])
    p.set_defaults(handler=profiles)

    p = sub.add_parser("health", help="whether each service answers SERVING", parents=[common])
    p.set_defaults(handler=health)


def context(app: App, args: argparse.Namespace) -> int:
    session = app.conn.store().GetSession(pb.GetSessionRequest(session_id=args.session_id,
                                                               view=pb.SESSION_VIEW_CONTEXT)).session
    if app.out.json:
        app.out.emit(session)
    else:
        app.out.console.print(context_view(session, brief=args.brief))
    return 0


def profiles(app: App, args: argparse.Namespace) -> int:
    response = app.conn.agent().ListProfiles(agent_pb2.ListProfilesRequest())
    if app.out.json:
        app.out.emit(response)
    else:
        app.out.console.print(profiles_table(response))
        servers = mcp_servers_view(response)
        if servers is not None:
            app.out.console.print(servers)
    if response.profiles_error:
        # On stderr in both modes: the listing is right (what the next turn uses), the file is not.
        app.out.errors.print(f"the profiles file's last edit is not in use: {response.profiles_error} "
                             "(the profiles above are the last good ones; fix the file and they follow it)",
                             style="red", markup=False, highlight=False, soft_wrap=True)
    return 0


def _status(stub: object, service: str) -> str:
    reply = stub.Check(health_pb2.HealthCheckRequest(service=service),  # type: ignore[attr-defined]
                       timeout=HEALTH_TIMEOUT_S)
    statuses = health_pb2.HealthCheckResponse.ServingStatus
    # A status a newer server added has no name here: its number, rather than a crash.
    return statuses.Name(reply.status) if reply.status in statuses.values() else str(reply.status)


def _check(stub: object, service: str) -> tuple[str, str]:
    """(status, detail) of one health entry; the server-wide entry when the service has none of its own."""
    for name in (service, ""):
        try:
            return _status(stub, name), ""
        except ServiceError as err:
            if err.code == grpc.StatusCode.NOT_FOUND and name:
                continue
            if err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return "UNREACHABLE", str(err)
            return err.code.name, str(err)
    return "UNKNOWN", "no health status registered"


def _listed_profiles(app: App) -> agent_pb2.ListProfilesResponse | None:
    try:
        return app.conn.agent().ListProfiles(agent_pb2.ListProfilesRequest(), timeout=HEALTH_TIMEOUT_S)
    except ServiceError:
        return None


def _ollama_host(app: App) -> str:
    """The Agent's OLLAMA_HOST (ListProfiles says it); "" from an Agent that does not."""
    listed = _listed_profiles(app)
    return listed.ollama_host if listed is not None else ""


def _mcp_row(app: App, stub: object, agent_address: str) -> dict[str, str] | None:
    """The Agent's MCP servers (its `mcp` health entry), with those not ready named; None when it keeps
    no such entry (no profile names a server)."""
    try:
        status = _status(stub, MCP_HEALTH_ENTRY)
    except ServiceError:
        return None
    listed = _listed_profiles(app)
    servers = {s.name: s for p in (listed.profiles if listed is not None else ()) for s in p.mcp_servers}
    down = [f"{name}: {mcp_state(s)}" for name, s in servers.items() if s.state != agent_pb2.MCP_SERVER_STATE_READY]
    return {"service": "MCP", "address": f"via the Agent at {agent_address}", "status": status,
            "error": "; ".join(down) if status != "SERVING" else ""}


def _ollama_row(app: App, stub: object, agent_address: str) -> dict[str, str] | None:
    """The Agent's own view of Ollama (its `ollama` health entry); None when it keeps none."""
    try:
        status = _status(stub, OLLAMA_HEALTH_ENTRY)
    except ServiceError:
        return None
    host = _ollama_host(app)
    where = f"OLLAMA_HOST={host}" if host else "its OLLAMA_HOST"
    detail = "" if status == "SERVING" else (
        f"the Agent cannot reach Ollama at {where}: start it (ollama serve) and pull the profile's model")
    return {"service": "Ollama", "address": host or f"via the Agent at {agent_address}", "status": status,
            "error": detail}


def health(app: App, args: argparse.Namespace) -> int:
    rows = []
    for endpoint in ENDPOINTS:
        for address in replicas(app.conn.address(endpoint)):
            stub = app.conn.health(endpoint, address)
            status, detail = _check(stub, SERVICE_NAMES[endpoint.name])
            rows.append({"service": endpoint.name, "address": address, "status": status, "error": detail})
            if endpoint is AGENT and status != "UNREACHABLE":
                ollama = _ollama_row(app, stub, address)
                if ollama is not None:
                    rows.append(ollama)
                mcp = _mcp_row(app, stub, address)
                if mcp is not None:
                    rows.append(mcp)
    # An MCP server that is down costs the model its tools, not a turn: it does not fail the check.
    healthy = all(row["status"] == "SERVING" for row in rows if row["service"] != "MCP")
    services_serving = all(row["status"] == "SERVING" for row in rows if row["service"] not in ("Ollama", "MCP"))
    if app.out.json:
        app.out.emit({"healthy": healthy, "services_serving": services_serving, "services": rows})
    else:
        app.out.console.print(health_table(rows))
        if services_serving and not healthy:
            # Exit 1 all the same: a turn would fail. But the system itself is up, and that is news too.
            app.out.console.print("The three services are fine (SERVING); only Ollama is missing, so turns fail "
                                  "until it runs. Sessions, search and shares work meanwhile.", style="yellow",
                                  markup=False, soft_wrap=True)
    return 0 if healthy else 1
