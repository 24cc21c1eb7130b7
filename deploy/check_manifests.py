"""What the schemas cannot see in a rendered overlay: `python deploy/check_manifests.py dev|prod FILE`.

kubernetes-validate says each object is well-formed; this says they fit together and keep the
promises of docs/deploying.md — every peer address names a Service on its port, probes
are native gRPC on the container's port, the grace covers the drain, selectors select, and each
overlay has what it is for (dev: one replica and its own PostgreSQL; prod: 2+ replicas,
autoscalers, disruption budgets, the database from a Secret). Exit 1 with every problem listed.
"""

from __future__ import annotations

import re
import sys

import yaml

METRICS_PORT = 9464  # every pod's /metrics (PALIMPSEST_METRICS_PORT)
SERVICES = {  # Deployment name → (port, module)
    "palimpsest-session-store": (50051, "palimpsest.store"),
    "palimpsest-compressor": (50052, "palimpsest.compressor"),
    "palimpsest-agent": (50053, "palimpsest.agent"),
}
PEER_SERVICES = {"palimpsest-session-store", "palimpsest-compressor"}  # dialled by the services: headless
AUTOSCALED = {"palimpsest-compressor", "palimpsest-agent"}
CLOSING_MARGIN_S = 5  # after the grace: the Agent's last drain (1 s), channels and the pool closing


def env_of(container: dict, config_maps: dict[str, dict]) -> dict[str, object]:
    """The container's environment as the kubelet builds it: envFrom first, then env over it."""
    env: dict[str, object] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref:
            env.update(config_maps.get(ref["name"], {}))
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def sandbox_problems(overlay: str, name: str, pod: dict, container: dict) -> list[str]:
    """The Agent's pods in prod can run bubblewrap (components/sandbox): a user namespace of the pod's
    own, an unmasked /proc, the runtime's filters lifted for the Agent's container alone — and the
    container otherwise as locked down as the others. No other pod has the filters lifted."""
    security = container.get("securityContext", {})
    seccomp = security.get("seccompProfile", {}).get("type") or pod.get("securityContext", {}).get(
        "seccompProfile", {}
    ).get("type")
    problems = []
    if security.get("allowPrivilegeEscalation") is not False or security.get("capabilities", {}).get("drop") != ["ALL"]:
        problems.append(f"{name}: allowPrivilegeEscalation false and every capability dropped")
    if security.get("capabilities", {}).get("add"):
        problems.append(f"{name}: no capability may be added ({security['capabilities']['add']})")
    if name != "palimpsest-agent" or overlay != "prod":
        if seccomp != "RuntimeDefault":
            problems.append(
                f"{name}: seccomp {seccomp!r}: only prod's Agent lifts the runtime's filter (for bubblewrap)"
            )
        return problems
    if pod.get("hostUsers") is not False:
        problems.append(f"{name}: hostUsers must be false: bubblewrap's namespaces need the pod's own user namespace")
    if security.get("procMount") != "Unmasked":
        problems.append(f"{name}: procMount must be Unmasked: the kernel refuses a sandbox's /proc under a masked one")
    if seccomp not in ("Unconfined", "Localhost"):
        problems.append(
            f"{name}: seccomp {seccomp!r} refuses bubblewrap's unshare and mount (Unconfined or a "
            "Localhost profile that allows them)"
        )
    return problems


def check(overlay: str, docs: list[dict]) -> list[str]:
    problems: list[str] = []
    by_kind: dict[str, dict[str, dict]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    deployments = by_kind.get("Deployment", {})
    services = by_kind.get("Service", {})
    config_maps = {name: cm.get("data", {}) for name, cm in by_kind.get("ConfigMap", {}).items()}
    secrets = by_kind.get("Secret", {})
    workloads = {**deployments, **by_kind.get("StatefulSet", {})}

    for name, (port, module) in SERVICES.items():
        deployment = deployments.get(name)
        if deployment is None:
            problems.append(f"{name}: no Deployment")
            continue
        spec = deployment["spec"]
        pod = spec["template"]["spec"]
        container = pod["containers"][0]
        where = f"{name}"
        if container.get("args") != [module]:
            problems.append(f"{where}: args {container.get('args')} (the image runs `python -m <args>`; want {module})")
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if ports != {"grpc": port, "metrics": METRICS_PORT}:
            problems.append(f"{where}: container ports {ports}, want grpc {port} and metrics {METRICS_PORT}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            grpc_probe = container.get(probe, {}).get("grpc")
            if not grpc_probe or grpc_probe.get("port") != port or grpc_probe.get("service", "") != "":
                problems.append(f"{where}: {probe} must be a native gRPC probe of grpc.health.v1 ('') on {port}")
        requests = container.get("resources", {}).get("requests", {})
        if not {"cpu", "memory"} <= requests.keys():
            problems.append(f"{where}: resource requests {requests} need cpu and memory")
        security = pod.get("securityContext", {})
        if not security.get("runAsNonRoot") or not security.get("runAsUser"):
            problems.append(f"{where}: must run as a non-root user")
        if pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: no service account token needed")
        problems += sandbox_problems(overlay, name, pod, container)

        env = env_of(container, config_maps)
        if name == "palimpsest-agent" and env.get("PALIMPSEST_SANDBOX") != "required":
            problems.append(
                f"{where}: PALIMPSEST_SANDBOX={env.get('PALIMPSEST_SANDBOX')!r}, want 'required': "
                "a pod's commands never run outside bubblewrap (its environment holds secrets)"
            )
        if str(env.get("PALIMPSEST_METRICS_PORT")) != str(METRICS_PORT):
            problems.append(
                f"{where}: PALIMPSEST_METRICS_PORT={env.get('PALIMPSEST_METRICS_PORT')!r}, want "
                f"{METRICS_PORT} (the metrics container port)"
            )
        annotations = spec["template"]["metadata"].get("annotations", {})
        scrape = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": "/metrics",
        }
        if any(annotations.get(k) != v for k, v in scrape.items()):
            problems.append(f"{where}: pod annotations {annotations} must point Prometheus at :{METRICS_PORT}/metrics")
        # The listen address of this service: a host the pod's network reaches, never a dns:/// target.
        listen = {
            "palimpsest-session-store": "PALIMPSEST_STORE_ADDR",
            "palimpsest-compressor": "PALIMPSEST_COMPRESSOR_LISTEN",
            "palimpsest-agent": "PALIMPSEST_AGENT_ADDR",
        }[name]
        if env.get(listen) != f"0.0.0.0:{port}":
            problems.append(f"{where}: {listen}={env.get(listen)!r}, want 0.0.0.0:{port} (it listens there)")
        # Peers it dials: dns:///<Service>:<port>, the Service there, headless, on that port.
        dials = {
            "palimpsest-compressor": ["PALIMPSEST_STORE_ADDR"],
            "palimpsest-agent": ["PALIMPSEST_STORE_ADDR", "PALIMPSEST_COMPRESSOR_ADDR"],
        }.get(name, [])
        for var in dials:
            value = str(env.get(var))
            match = re.fullmatch(r"dns:///([a-z0-9-]+):(\d+)", value)
            if not match:
                problems.append(f"{where}: {var}={value!r} is not a dns:///<service>:<port> target")
                continue
            target, target_port = match[1], int(match[2])
            service = services.get(target)
            if service is None:
                problems.append(f"{where}: {var} names Service {target}, which the overlay does not have")
            elif target_port not in [p["port"] for p in service["spec"]["ports"]]:
                problems.append(f"{where}: {var} dials port {target_port}, Service {target} has none")
            elif SERVICES.get(target, (None,))[0] != target_port:
                problems.append(f"{where}: {var} dials {target}:{target_port}, which serves on {SERVICES[target][0]}")
        if name == "palimpsest-session-store":
            url = env.get("DATABASE_URL")
            if not (isinstance(url, dict) and "secretKeyRef" in url):
                problems.append(f"{where}: DATABASE_URL must come from a Secret")
            key = env.get("PALIMPSEST_SHARE_KEY")
            if not (isinstance(key, dict) and "secretKeyRef" in key):
                problems.append(f"{where}: PALIMPSEST_SHARE_KEY must come from a Secret (one key for every replica)")

        # SIGTERM: preStop pause, then the grace for calls in flight, then closing; all before SIGKILL.
        try:
            grace = float(env.get("PALIMPSEST_GRACE_SECONDS", 5.0))
        except (TypeError, ValueError):
            problems.append(
                f"{where}: PALIMPSEST_GRACE_SECONDS={env.get('PALIMPSEST_GRACE_SECONDS')!r} is not a number"
            )
            grace = 5.0
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        termination = pod.get("terminationGracePeriodSeconds", 30)
        if termination < pre_stop + grace + CLOSING_MARGIN_S:
            problems.append(
                f"{where}: terminationGracePeriodSeconds {termination} < preStop {pre_stop} + "
                f"PALIMPSEST_GRACE_SECONDS {grace:g} + {CLOSING_MARGIN_S}"
            )

        replicas = spec.get("replicas", 1)
        if overlay == "dev" and replicas != 1:
            problems.append(f"{where}: dev runs one replica, not {replicas}")
        if overlay == "prod" and replicas < 2:
            problems.append(f"{where}: prod runs 2+ replicas, not {replicas}")

    for name, service in services.items():
        selector = service["spec"].get("selector", {})
        if not any(selects(selector, w["spec"]["template"]["metadata"].get("labels", {})) for w in workloads.values()):
            problems.append(f"Service {name}: its selector {selector} selects no pod")
        if name in PEER_SERVICES and service["spec"].get("clusterIP") != "None":
            problems.append(f"Service {name}: must be headless (clusterIP: None) for client-side round_robin")

    # Every Secret key the pods need without `optional` exists, when the overlay makes the Secret.
    for name, workload in workloads.items():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            for item in container.get("env", []):
                ref = (item.get("valueFrom") or {}).get("secretKeyRef")
                if ref and not ref.get("optional") and ref["name"] in secrets:
                    if ref["key"] not in secrets[ref["name"]].get("data", {}):
                        problems.append(f"{name}: Secret {ref['name']} has no key {ref['key']}")

    hpas = {h["spec"]["scaleTargetRef"]["name"]: h for h in by_kind.get("HorizontalPodAutoscaler", {}).values()}
    pdbs = by_kind.get("PodDisruptionBudget", {}).values()
    postgres = [n for n, s in by_kind.get("StatefulSet", {}).items() if "postgres" in n]
    if overlay == "dev":
        if not postgres:
            problems.append("dev: no PostgreSQL StatefulSet")
        if hpas:
            problems.append(f"dev: no autoscalers wanted, found {sorted(hpas)}")
    if overlay == "prod":
        if postgres:
            problems.append(f"prod: PostgreSQL is external, found {postgres}")
        if "palimpsest-secrets" in secrets:
            problems.append("prod: Secret palimpsest-secrets must come from outside the repository")
        for name in AUTOSCALED:
            hpa = hpas.get(name)
            if hpa is None:
                problems.append(f"prod: no HorizontalPodAutoscaler for {name}")
            elif hpa["spec"].get("minReplicas", 1) < 2 or hpa["spec"]["maxReplicas"] < hpa["spec"]["minReplicas"]:
                problems.append(f"prod: {name}'s autoscaler must keep 2+ replicas")
        for name in hpas:
            if name not in deployments:
                problems.append(f"prod: an autoscaler targets {name}, which is not a Deployment here")
        for name in SERVICES:
            labels = deployments.get(name, {}).get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
            if not any(selects(p["spec"]["selector"].get("matchLabels", {}), labels) for p in pdbs):
                problems.append(f"prod: no PodDisruptionBudget selects {name}'s pods")
        config = next(
            (
                d.get("data", {})
                for d in docs
                if d.get("kind") == "ConfigMap" and d["metadata"]["name"].startswith("palimpsest-config")
            ),
            {},
        )
        for setting in ("PALIMPSEST_TURN_CLAIMS", "PALIMPSEST_REPLICA_EVENTS"):
            if config.get(setting) != "true":
                problems.append(f"prod: several Agents need {setting}=true in palimpsest-config")
        for pdb in pdbs:
            matched = [
                n
                for n, d in deployments.items()
                if selects(pdb["spec"]["selector"].get("matchLabels", {}), d["spec"]["template"]["metadata"]["labels"])
            ]
            if len(matched) != 1:
                problems.append(
                    f"prod: PodDisruptionBudget {pdb['metadata']['name']} selects {matched}, want one Deployment"
                )
    return problems


def main() -> int:
    overlay, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    problems = check(overlay, docs)
    for problem in problems:
        print(f"  {overlay}: {problem}", file=sys.stderr)
    kinds = sorted({d["kind"] for d in docs})
    if problems:
        print(f"{overlay}: {len(problems)} problems in {len(docs)} objects", file=sys.stderr)
        return 1
    print(f"{overlay}: {len(docs)} objects fit together ({', '.join(kinds)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
