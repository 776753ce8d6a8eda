#!/usr/bin/env python3
"""Where the time went from a scale request to Ready, per step (run.sh's
`steps`): argv = t0 (ms since the epoch), a JSON-lines file with one node
each ({"node", "describe": knit describe node -o json, "kubelet": the
stand-in's log, "cni": the CNI config's mtime in seconds}), and
`knit get events -o json`. Prints one row per step: the median over the
nodes of its time from t0, in ms, and the largest in brackets."""

import json
import re
import statistics
import sys
from datetime import datetime

t0 = int(sys.argv[1])
nodes = [json.loads(line) for line in open(sys.argv[2]) if line.strip()]
events = json.load(open(sys.argv[3]))
events = events.get("items", events) if isinstance(events, dict) else events

# The stand-in's log lines that mark a step (tracing's fmt: an RFC 3339
# UTC time first).
KUBELET = [
    ("kubelet: started", lambda m: "Kubernetes v" in m),
    ("kubelet: CSR sent", lambda m: "certificate signing request sent" in m),
    ("kubelet: certificate issued", lambda m: "client certificate issued" in m),
    ("kubelet: kubeconfig written", lambda m: "wrote kubelet kubeconfig" in m),
    ("kubelet: Node registered", lambda m: "node registered" in m or "node already registered" in m),
    ("kubelet: Ready posted", lambda m: "node Ready condition changed" in m and 'True' in m),
]
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z")


def ms_of(stamp):
    # datetime takes at most 6 digits of fraction.
    day, frac = stamp.split(".")
    t = datetime.fromisoformat(day + "." + frac[:6] + "+00:00")
    return int(t.timestamp() * 1000)


rows = {}
order = []


def put(step, at):
    if at is None:
        return
    if step not in rows:
        rows[step] = []
        order.append(step)
    rows[step].append(at - t0)


for n in nodes:
    d = n["describe"]
    name = d.get("name", n["node"])
    put("node record created (its bootstrap)", d.get("createdMs"))
    created = [
        e["atMs"]
        for e in events
        if e.get("reason") == "Created" and e.get("objectName") in (name, d.get("instance"))
    ]
    put("instance created", min(created) if created else None)
    # The control plane's own record of Ready (its reconcile pass reads it).
    noticed = [
        e["atMs"]
        for e in events
        if e.get("reason") == "NodeReady" and e.get("objectName") == name
    ]
    put("control plane: NodeReady event", min(noticed) if noticed else None)
    timeline = d.get("timeline") or []
    # Done for knit (`knit scale --wait`, the pool's count): every agent
    # phase reported and Ready as the control plane has it.
    if noticed and timeline:
        put("knit: initialized and Ready", max(min(noticed), max(t["atMs"] for t in timeline)))
    starts = [t["atMs"] - (t.get("durationMs") or 0) for t in timeline]
    put("agent: first phase started", min(starts) if starts else None)
    for t in timeline:
        if t.get("outcome") not in ("started", "Started"):
            put(f"agent: {t['phase']} done", t["atMs"])
    marks = {}
    for line in n.get("kubelet", "").splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        for step, test in KUBELET:
            if step not in marks and test(line):
                marks[step] = ms_of(m.group(1))
    stub = {
        "control-plane-ca.pem": "stub: started (CA written)",
        "knit-agent": "stub: agent in place",
        "node-config.yaml": "stub: node configuration fetched",
    }
    for entry in (n.get("files") or "").split(";"):
        path, _, at = entry.strip().rpartition(" ")
        step = stub.get(path.rsplit("/", 1)[-1])
        if step and at:
            marks[step] = int(float(at) * 1000)
    cni = n.get("cni") or ""
    if cni:
        marks["CNI config written (install-cni model)"] = int(float(cni) * 1000)
    for step, at in sorted(marks.items(), key=lambda kv: kv[1]):
        put(step, at)

for step in sorted(order, key=lambda s: statistics.median(rows[s])):
    v = rows[step]
    print(f"{step:<42} {int(statistics.median(v)):>7} ({max(v)})")
