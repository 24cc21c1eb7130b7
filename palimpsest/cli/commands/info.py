"""`pal context`, `pal profiles`, `pal health`: what the model sees, what is configured, what is up."""

from __future__ import annotations

import argparse

import grpc
from grpc_health.v1 import health_pb2

from palimpsest.cli.app import App
from palimpsest.cli.commands import Subparsers
from palimpsest.cli.connection import AGENT, COMPRESSOR, ENDPOINTS
from palimpsest.cli.errors import ServiceError
from palimpsest.cli.views import context_view, health_table, mcp_servers_view, mcp_state, profiles_table
from palimpsest.shared.addresses import replicas
from palimpsest.v1 import agent_pb2
from palimpsest.v1 import session_store_pb2 as pb

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
# And one for the commands' sandbox: NOT_SERVING when a profile runs commands sandboxed and it cannot start.
SANDBOX_HEALTH_ENTRY = "sandbox"
# Rows of what the Agent depends on, beside the three services; an MCP server that is down costs the
# model its tools, not a turn, so its row never fails the check.
DEPENDENCIES = ("Ollama", "Sandbox", "MCP")


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
    session = (
        app.conn.store()
        .GetSession(pb.GetSessionRequest(session_id=args.session_id, view=pb.SESSION_VIEW_CONTEXT))
        .session
    )
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
        app.out.errors.print(
            f"the profiles file's last edit is not in use: {response.profiles_error} "
            "(the profiles above are the last good ones; fix the file and they follow it)",
            style="red",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    return 0


def _status(stub: object, service: str) -> str:
    reply = stub.Check(  # type: ignore[attr-defined]
        health_pb2.HealthCheckRequest(service=service),
        timeout=HEALTH_TIMEOUT_S,
    )
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


def _agent_facts(app: App) -> agent_pb2.ListProfilesResponse:
    """What the Agent says of its setup (ListProfiles: OLLAMA_HOST, why the sandbox cannot start);
    empty from an Agent that does not answer it."""
    try:
        return app.conn.agent().ListProfiles(agent_pb2.ListProfilesRequest(), timeout=HEALTH_TIMEOUT_S)
    except ServiceError:
        return agent_pb2.ListProfilesResponse()


def _dependency_rows(app: App, stub: object, agent_address: str) -> list[dict[str, str]]:
    """The Agent's own view of Ollama and of its sandbox (its `ollama` and `sandbox` health entries),
    for each it keeps; ListProfiles, once, for what they name."""
    rows = []
    facts: agent_pb2.ListProfilesResponse | None = None
    for entry, row in (
        (OLLAMA_HEALTH_ENTRY, _ollama_row),
        (SANDBOX_HEALTH_ENTRY, _sandbox_row),
        (MCP_HEALTH_ENTRY, _mcp_row),
    ):
        try:
            status = _status(stub, entry)
        except ServiceError:
            continue
        facts = facts or _agent_facts(app)
        rows.append(row(status, agent_address, facts))
    return rows


def _ollama_row(status: str, agent_address: str, facts: agent_pb2.ListProfilesResponse) -> dict[str, str]:
    host = facts.ollama_host
    where = f"OLLAMA_HOST={host}" if host else "its OLLAMA_HOST"
    detail = (
        ""
        if status == "SERVING"
        else (f"the Agent cannot reach Ollama at {where}: start it (ollama serve) and pull the profile's model")
    )
    return {
        "service": "Ollama",
        "address": host or f"via the Agent at {agent_address}",
        "status": status,
        "error": detail,
    }


def _mcp_row(status: str, agent_address: str, facts: agent_pb2.ListProfilesResponse) -> dict[str, str]:
    """The Agent's MCP servers (its `mcp` health entry), with those not ready named."""
    servers = {s.name: s for p in facts.profiles for s in p.mcp_servers}
    down = [f"{name}: {mcp_state(s)}" for name, s in servers.items() if s.state != agent_pb2.MCP_SERVER_STATE_READY]
    return {
        "service": "MCP",
        "address": f"via the Agent at {agent_address}",
        "status": status,
        "error": "; ".join(down) if status != "SERVING" else "",
    }


def _sandbox_row(status: str, agent_address: str, facts: agent_pb2.ListProfilesResponse) -> dict[str, str]:
    why = facts.sandbox_unavailable
    if status == "SERVING":
        detail = f"unavailable, but no profile runs commands sandboxed: {why}" if why else ""
    else:
        detail = f"commands of sandboxed profiles fail: {why}" if why else "commands of sandboxed profiles fail"
    return {"service": "Sandbox", "address": f"on the Agent at {agent_address}", "status": status, "error": detail}


def health(app: App, args: argparse.Namespace) -> int:
    rows = []
    for endpoint in ENDPOINTS:
        for address in replicas(app.conn.address(endpoint)):
            stub = app.conn.health(endpoint, address)
            status, detail = _check(stub, SERVICE_NAMES[endpoint.name])
            rows.append({"service": endpoint.name, "address": address, "status": status, "error": detail})
            if endpoint is AGENT and status != "UNREACHABLE":
                rows += _dependency_rows(app, stub, address)
    healthy = all(row["status"] == "SERVING" for row in rows if row["service"] != "MCP")
    services_serving = all(row["status"] == "SERVING" for row in rows if row["service"] not in DEPENDENCIES)
    if app.out.json:
        app.out.emit({"healthy": healthy, "services_serving": services_serving, "services": rows})
    else:
        app.out.console.print(health_table(rows))
        if services_serving and not healthy:
            # Exit 1 all the same: a turn would fail. But the system itself is up, and that is news too.
            missing = [
                row["service"]
                for row in rows
                if row["service"] in DEPENDENCIES and row["service"] != "MCP" and row["status"] != "SERVING"
            ]
            if missing == ["Sandbox"]:
                news = (
                    "The three services are fine (SERVING); only the sandbox cannot start, so commands of "
                    "sandboxed profiles fail until it is fixed (see its row). Everything else works."
                )
            else:
                news = (
                    "The three services are fine (SERVING); only Ollama is missing, so turns fail until it runs. "
                    "Sessions, search and shares work meanwhile."
                )
            app.out.console.print(news, style="yellow", markup=False, soft_wrap=True)
    return 0 if healthy else 1
