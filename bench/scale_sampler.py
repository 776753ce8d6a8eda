#!/usr/bin/env python3
"""Sampler, census and leftover check of bench/scale.sh (issue 31 item 2).

  scale_sampler.py sample WORK SERVER_PID KUBECONFIG BRIDGE INTERVAL
      every INTERVAL s until WORK/stop exists: one line of WORK/samples.csv
      (Ready nodes from the real kubectl, the control plane's CPU from
      /proc/PID/stat utime+stime deltas and its RSS, the host's counts);
      every instance record it ever saw is kept in WORK/seen.json and every
      node's first Registered/Ready time in WORK/nodes.json.
  scale_sampler.py census WORK
      per-machine host cost of the machines running now (processes, threads,
      PSS, fds, inotify instances, mounts in the machine, cgroups, loop
      devices, veths).
  scale_sampler.py left WORK BRIDGE [after-down]
      what of this run is still on the host: processes, loop devices, mounts,
      veths, network namespaces, guard tables, cgroups; exit 1 if anything.
  scale_sampler.py report WORK OUT N T0_MS T_READY_WAIT_END_MS T_IN_MS
      the CSV with times from the scale request, and the summary.
  scale_sampler.py requests WORK
      what the embedded API was asked in the quiet phase, per second, from
      its request counters scraped at both ends (WORK/metrics-start.txt,
      WORK/metrics-end.txt: the time in ms, then the metrics).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def stat_fields(pid):
    s = read(f"/proc/{pid}/stat")
    if not s:
        return None
    return s[s.rindex(")") + 2 :].split()  # fields from 3 (state) on


def cpu_ticks(pid):
    f = stat_fields(pid)
    return int(f[11]) + int(f[12]) if f else None  # utime (14) + stime (15)


def rss_kib(pid):
    for line in read(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def mem_used_mib():
    m = {}
    for line in read("/proc/meminfo").splitlines():
        k, v = line.split(":", 1)
        m[k] = int(v.split()[0])
    return (m["MemTotal"] - m["MemAvailable"]) / 1024


def loops_under(work):
    out = []
    for dev in os.listdir("/sys/block"):
        if dev.startswith("loop"):
            backing = read(f"/sys/block/{dev}/loop/backing_file").strip()
            if backing.startswith(work + "/"):
                out.append((dev, backing))
    return out


def records(work):
    d = os.path.join(work, "local", "instances")
    out = {}
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for i in names:
        try:
            with open(os.path.join(d, i, "instance.json")) as f:
                out[i] = json.load(f)
        except (OSError, ValueError):
            pass
    return out


def ready_nodes(kubeconfig):
    """{name: (registered, ready)} from the real kubectl, or None."""
    try:
        p = subprocess.run(
            ["kubectl", "--kubeconfig", kubeconfig, "--request-timeout=20s", "get", "nodes", "-o", "json"],
            capture_output=True, timeout=30, check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    if p.returncode != 0 or len(p.stdout) > 256 << 20:
        return None
    out = {}
    for n in json.loads(p.stdout)["items"]:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
        out[n["metadata"]["name"]] = ready
    return out


def sample(work, server, kubeconfig, bridge, interval):
    interval = float(interval)
    seen, nodes = {}, {}
    last_t, last_cpu = time.time(), cpu_ticks(server)
    with open(os.path.join(work, "samples.csv"), "w") as out:
        out.write("epoch_ms,phase,instances,nodes,ready,bridge_ports,loops,server_cpu_pct,server_rss_mib,"
                  "host_mem_used_mib,host_load1,kubectl_ms\n")
        while not os.path.exists(os.path.join(work, "stop")):
            start = time.time()
            recs = records(work)
            for i, r in recs.items():
                seen[i] = {"veth": r.get("veth"), "netns": r.get("netns"), "cgroups": r.get("cgroups", []),
                           "init": r.get("init"), "shim": r.get("shim")}
            phase = read(os.path.join(work, "phase")).strip()
            # "quiet": the control plane at N with no observer asking it
            # anything (a list of N Nodes every second is not free).
            k0 = time.time()
            state = None if phase == "quiet" else ready_nodes(kubeconfig)
            k_ms = int((time.time() - k0) * 1000)
            now = time.time()
            if state is not None:
                for name, ready in state.items():
                    n = nodes.setdefault(name, {"registered": int(now * 1000), "ready": None})
                    if ready and n["ready"] is None:
                        n["ready"] = int(now * 1000)
            cpu = cpu_ticks(server)
            pct = ""
            if cpu is not None and last_cpu is not None and now > last_t:
                pct = f"{100 * (cpu - last_cpu) / TICK / (now - last_t):.2f}"
            last_t, last_cpu = now, cpu
            try:
                ports = len(os.listdir(f"/sys/class/net/{bridge}/brif"))
            except OSError:
                ports = 0
            out.write(",".join(str(x) for x in [
                int(now * 1000), phase, len(recs),
                "" if state is None else len(state),
                "" if state is None else sum(state.values()),
                ports, len(loops_under(work)), pct, f"{rss_kib(server) / 1024:.1f}",
                f"{mem_used_mib():.0f}", read("/proc/loadavg").split()[0], k_ms]) + "\n")
            out.flush()
            for name, data in (("seen.json", seen), ("nodes.json", nodes)):
                tmp = os.path.join(work, name + ".tmp")
                with open(tmp, "w") as f:
                    json.dump(data, f)
                os.replace(tmp, os.path.join(work, name))
            time.sleep(max(0.0, interval - (time.time() - start)))


def netns_inodes(recs):
    inos = {}
    for i, r in recs.items():
        try:
            inos[os.stat(f"/run/netns/{r['netns']}").st_ino] = i
        except OSError:
            pass
    return inos


def census(work):
    recs = records(work)
    n = len(recs)
    if n == 0:
        print("census: no machine running")
        return
    inos = netns_inodes(recs)
    shims = {r["shim"]["pid"] for r in recs.values() if r.get("shim")}
    procs = threads = pss = fds = inotify = 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            ns = os.readlink(f"/proc/{p}/ns/net")
        except OSError:
            continue
        ino = int(ns[5:-1])
        if ino not in inos and int(p) not in shims:
            continue
        procs += 1
        for line in read(f"/proc/{p}/status").splitlines():
            if line.startswith("Threads:"):
                threads += int(line.split()[1])
        for line in read(f"/proc/{p}/smaps_rollup").splitlines():
            if line.startswith("Pss:"):
                pss += int(line.split()[1])
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                fds += 1
                try:
                    if os.readlink(f"/proc/{p}/fd/{fd}") == "anon_inode:inotify":
                        inotify += 1
                except OSError:
                    pass
        except OSError:
            pass
    mounts = sum(len(read(f"/proc/{r['init']['pid']}/mountinfo").splitlines())
                 for r in recs.values() if r.get("init"))
    cgroups = sum(len(r.get("cgroups", [])) for r in recs.values())
    loops = len(loops_under(work))
    print(f"census of {n} machines (sums / per machine):")
    print(f"  processes {procs} / {procs / n:.1f} (PID 1, shim, user data, agent's services)")
    print(f"  threads (PIDs) {threads} / {threads / n:.1f}")
    print(f"  PSS {pss / 1024:.0f} MiB / {pss / n / 1024:.1f} MiB")
    print(f"  open fds {fds} / {fds / n:.1f}; inotify instances {inotify} / {inotify / n:.1f}")
    print(f"  mounts inside the machines {mounts} / {mounts / n:.1f} (none in the host's namespace)")
    print(f"  cgroups {cgroups} / {cgroups / n:.1f}; loop devices {loops} / {loops / n:.1f}; veths {len(inos)} / 1")


def left(work, bridge, after_down=False):
    seen = json.loads(read(os.path.join(work, "seen.json"), "{}"))
    found = []
    for i, r in seen.items():
        if r.get("netns") and os.path.exists(f"/run/netns/{r['netns']}"):
            found.append(f"network namespace {r['netns']} ({i})")
        if r.get("veth") and os.path.exists(f"/sys/class/net/{r['veth']}"):
            found.append(f"veth {r['veth']} ({i})")
        for c in r.get("cgroups") or []:
            if os.path.isdir(c):
                found.append(f"cgroup {c} ({i})")
        for what in ("init", "shim"):
            pr = r.get(what)
            if pr:
                f = stat_fields(pr["pid"])
                if f and int(f[19]) == pr["startTime"] and f[0] != "Z":
                    found.append(f"process {pr['pid']} ({what} of {i})")
    # The bridge's guard table: one port set; after down, no table at all.
    guard = subprocess.run(["nft", "-j", "list", "set", "bridge", f"knit_guard_{bridge}", "ports"],
                           capture_output=True, text=True, timeout=30)
    if guard.returncode == 0:
        if after_down:
            found.append(f"nft table bridge knit_guard_{bridge}")
        ports = set()
        for o in json.loads(guard.stdout or "{}").get("nftables", []):
            for e in (o.get("set") or {}).get("elem", []):
                el = e.get("elem", e) if isinstance(e, dict) else e
                ports.add(el.get("val") if isinstance(el, dict) else el)
        for r in seen.values():
            if r.get("veth") in ports:
                found.append(f"guard of {r['veth']} in nft table bridge knit_guard_{bridge}")
    store = os.path.join(work, "local", "store.img")
    for dev, backing in loops_under(work):
        if after_down or backing != store:
            found.append(f"loop device /dev/{dev} ({backing})")
    store_mnt = os.path.join(work, "local", "store")
    for line in read("/proc/self/mountinfo").splitlines():
        mnt = line.split()[4]
        if mnt.startswith(work + "/") and (after_down or mnt != store_mnt):
            found.append(f"mount {mnt}")
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid():
            cmd = read(f"/proc/{p}/cmdline").replace("\0", " ")
            if os.path.join(work, "local", "instances") in cmd or (after_down and work in cmd):
                found.append(f"process {p}: {cmd.strip()}")
    if after_down and os.path.exists(f"/sys/class/net/{bridge}"):
        found.append(f"bridge {bridge}")
    what = "after down" if after_down else "after scale-in"
    print(f"left on the host {what} ({len(seen)} machines seen): {len(found)}" + "".join(f"\n  {f}" for f in found))
    sys.exit(1 if found else 0)


def report(work, out_dir, n, t0, t_ready_end, t_in):
    n, t0, t_ready_end, t_in = int(n), int(t0), int(t_ready_end), int(t_in)
    rows = []
    with open(os.path.join(work, "samples.csv")) as f:
        header = f.readline().strip().split(",")
        for line in f:
            rows.append(dict(zip(header, line.strip().split(","))))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "samples.csv"), "w") as f:
        f.write("t_s," + ",".join(header) + "\n")
        for r in rows:
            f.write(f"{(int(r['epoch_ms']) - t0) / 1000:.3f}," + ",".join(r[h] for h in header) + "\n")
    nodes = json.loads(read(os.path.join(work, "nodes.json"), "{}"))
    with open(os.path.join(out_dir, "nodes.csv"), "w") as f:
        f.write("node,registered_s,ready_s\n")
        for name, v in sorted(nodes.items()):
            ready = "" if v["ready"] is None else f"{(v['ready'] - t0) / 1000:.3f}"
            f.write(f"{name},{(v['registered'] - t0) / 1000:.3f},{ready}\n")
    ready = sorted((v["ready"] - t0) / 1000 for v in nodes.values() if v["ready"] is not None and v["ready"] >= t0)

    def pct(xs, q):
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")

    def cpu(phases):
        xs = [float(r["server_cpu_pct"]) for r in rows if r["phase"] in phases and r["server_cpu_pct"]]
        return f"{statistics.mean(xs):.1f} %" if xs else "-"

    def rss(phases, f=max):
        xs = [float(r["server_rss_mib"]) for r in rows if r["phase"] in phases and r["server_rss_mib"]]
        return f"{f(xs):.0f} MiB" if xs else "-"

    all_ready = f"{ready[-1]:.1f} s" if len(ready) >= n else f"not reached ({len(ready)} of {n} Ready)"
    scale_in = [int(r["epoch_ms"]) for r in rows if r["phase"] == "in" and r["instances"] == "0" and r["bridge_ports"] == "0"]
    print("| N | all Ready | per node Ready P50 / P90 | scale-in to no machine | control plane CPU idle / scale-out / steady at N / quiet at N / scale-in / after | RSS idle / max / steady end / after |")
    print("|---|---|---|---|---|---|")
    steady = [r for r in rows if r["phase"] == "steady"]
    in_s = f"{(scale_in[0] - t_in) / 1000:.1f} s" if scale_in else "not reached"
    print(f"| {n} | {all_ready} | {pct(ready, 0.5):.1f} s / {pct(ready, 0.9):.1f} s | {in_s} | ", end="")
    print(f"{cpu({'idle'})} / {cpu({'out'})} / {cpu({'steady'})} / {cpu({'quiet'})} / {cpu({'in'})} / {cpu({'after'})} | "
          f"{rss({'idle'})} / {rss({'out', 'steady', 'in'})} / "
          f"{(steady[-1]['server_rss_mib'] + ' MiB') if steady else '-'} / {rss({'after'}, lambda x: x[-1])} |")
    asked = [int(r["kubectl_ms"]) for r in rows if r["phase"] != "quiet"]
    print(f"(CPU in % of one core, mean of the {len(rows)} samples' per-interval utime+stime of the knit server; "
          f"quiet: no kubectl asked; kubectl took {statistics.mean(asked) if asked else 0:.0f} ms per sample on average)")
    print(f"samples: {os.path.join(out_dir, 'samples.csv')}, nodes: {os.path.join(out_dir, 'nodes.csv')}")


REQUESTS = re.compile(r'^knit_cluster_requests_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.eE+]+)$')


def request_counts(path):
    """The time (ms) and each request counter of one metrics scrape, or None."""
    lines = read(path, "").splitlines()
    if len(lines) < 2:
        return None
    counts = {}
    for line in lines[1:]:
        m = REQUESTS.match(line.strip())
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
            key = f"{labels.get('verb', '?')} {labels.get('resource', '?')} {labels.get('code', '?')}"
            counts[key] = float(m["value"])
    return int(lines[0]), counts


def requests(work):
    """What the embedded API was asked in the quiet phase, per second."""
    start = request_counts(os.path.join(work, "metrics-start.txt"))
    end = request_counts(os.path.join(work, "metrics-end.txt"))
    if not start or not end or end[0] <= start[0]:
        print("API requests in the quiet phase: not read (the API's metrics did not answer)")
        return
    secs = (end[0] - start[0]) / 1000
    rates = sorted(((v - start[1].get(k, 0)) / secs, k) for k, v in end[1].items())
    asked = [f"{k}: {r:.2f}/s" for r, k in reversed(rates) if r > 0]
    print(f"API requests in the quiet phase ({secs:.1f} s, verb resource code): {'; '.join(asked) or 'none'}")


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "left":
        left(args[0], args[1], len(args) > 2)
    elif mode in ("sample", "census", "report", "requests"):
        globals()[mode](*args)
    else:
        sys.exit(f"unknown mode {mode!r}: sample, census, left, report or requests")
