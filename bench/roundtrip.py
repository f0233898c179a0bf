"""Where a one-at-a-time PUB's round trip goes on the real classic nsqd, per client.

    python bench/roundtrip.py [--real DIR] [--quick] [--messages N] [--clients ...]
                              [--rates 0,8000,4000,2000] [--no-strace]

Starts the real classic nsqd 1.3.0 (``smartnsq.testing.realcluster.RealCluster``, from ``--real
DIR`` or ``$SMARTNSQ_REAL_NSQ``) and, for each client, publishes N 100-byte messages one at a time
(each acknowledged before the next) to a fresh topic, and takes:

* msg/s and the client's CPU per message (as ``bench/publish.py --server real``);
* **the nsqd's own CPU per message**: ``/proc/PID/stat`` (utime + stime) of the nsqd process
  before and after the client's run, over the messages it stored;
* with strace (``apt-get install strace``; ``--no-strace`` skips it): **the client's syscalls
  per message** by name (``strace -f -c`` of the client with N and 3N messages, the
  difference over 2N, so start-up and imports drop out; the Go tools that run for a time:
  total over their count), **the nsqd's syscalls per message** (``strace -f -c -p PID``
  attached over the client's run, over its messages: strace slows nsqd, so these are counts,
  not times), and from a 20-message trace of the client (``strace -f -e trace=write,...
  -s 400``): **writes per PUB, bytes per write, TCP_NODELAY and the IDENTIFY body** the
  client sends;
* the gap experiment: ``to_nsq --rate R`` (go-nsq throttled to R msg/s) for each of
  ``--rates`` and at smartnsq's measured rate, nsqd CPU per message against the time between
  two PUBs, which separates what the server does per PUB from what it does because the next
  PUB comes later.

Clients: ``smartnsq`` (asyncio), ``smartnsq-uvloop`` (python -O), ``asyncio-floor`` (the
thinnest asyncio client of ``bench/publish.py``), ``pynsq``, ``to_nsq`` (go-nsq),
``bench_writer`` (raw Go: MPUB of one message, GOMAXPROCS=1).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

from _common import BENCH_DIR, command_line, environment, table, worker_env
from _real import GoTools, ServerCpu, real_dir, real_server, run_process

BODY = 100
CLIENTS = ("smartnsq", "smartnsq-uvloop", "asyncio-floor", "pynsq", "to_nsq", "bench_writer")
WRITE_CALLS = ("write", "writev", "sendto", "sendmsg", "send")


def client_argv(client: str, addr: str, topic: str, n: int, go: GoTools, tmp: str
                ) -> tuple[list[str], str | None, dict[str, str]]:
    """The command that publishes n messages one at a time, its stdin file and extra env."""
    if client == "to_nsq" or client.startswith("to_nsq@"):
        path = os.path.join(tmp, f"lines-{n}")
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write((b"x" * BODY + b"\n") * n)
        argv = [str(go.classic / "to_nsq"), f"--nsqd-tcp-address={addr}", f"--topic={topic}"]
        if "@" in client:
            argv.append(f"--rate={client.split('@')[1]}")
        return argv, path, {}
    if client == "bench_writer":
        # a fixed time, not a count: about n messages at the rate seen on a quiet machine
        return ([str(go.classic / "bench_writer"), f"--nsqd-tcp-address={addr}",
                 f"--topic={topic}", f"--size={BODY}", "--batch-size=1",
                 f"--runfor={max(n / 20000, 0.2):.2f}s"], None, {"GOMAXPROCS": "1"})
    worker, loop = ("smartnsq", "uvloop") if client == "smartnsq-uvloop" else (client, "asyncio")
    flags = ["-O"] if loop == "uvloop" else []
    return ([sys.executable, *flags, str(BENCH_DIR / "publish.py"), "--worker", worker, "seq",
             addr, "", topic, str(n), str(BODY), "1024", loop], None, worker_env())


def parse_result(client: str, run: Any, n: int) -> dict[str, Any]:
    import json

    if client == "bench_writer":
        from _real import parse_bench

        window, ops = parse_bench(run.err + run.out)
        count = round(ops * window)
        return {"count": count, "rate": ops, "cpu_us": run.cpu / max(count, 1) * 1e6}
    if client.startswith("to_nsq"):
        return {"count": n, "rate": n / run.wall, "cpu_us": run.cpu / n * 1e6,
                "note": "whole process (start-up included)"}
    line = [ln for ln in run.out.splitlines() if ln.startswith("{")]
    if not line:
        raise RuntimeError(f"{client}: {run.err.strip()[-200:]}")
    data = json.loads(line[-1])
    return {"count": n, "rate": data["rate"], "cpu_us": data["cpu_us"]}


def strace_counts(path: str) -> Counter[str]:
    """``strace -c`` summary: syscall -> calls."""
    calls: Counter[str] = Counter()
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                try:
                    calls[parts[-1]] += int(parts[3])
                except ValueError:
                    continue
    return calls


def run_once(client: str, cluster: Any, go: GoTools, n: int, tmp: str, topic: str,
             prefix: list[str] | None = None, attach: str | None = None) -> dict[str, Any]:
    """n one-at-a-time PUBs on a fresh topic; the nsqd CPU; optionally strace -p the nsqd."""
    cluster.fresh_topic(topic, channel=None)
    argv, stdin, env = client_argv(client, cluster.tcp, topic, n, go, tmp)
    tracer = None
    if attach:
        tracer = subprocess.Popen(["strace", "-f", "-c", "-o", attach, "-p",
                                   str(cluster.nsqd_pids[0])], stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # attached to every thread
    cpu = ServerCpu(cluster.nsqd_pids)
    run = run_process([*(prefix or []), *argv], stdin=stdin, env=env, timeout=600)
    server_s = cpu.used()
    if tracer is not None:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
    stored = cluster.message_count(topic) or 0
    cluster.drop_topic(topic)
    if run.rc:
        return {"error": f"exit {run.rc}: {(run.err or run.out).strip()[-200:]}"}
    result = parse_result(client, run, n)
    result["stored"] = stored
    result["server_us"] = server_s / max(stored, 1) * 1e6
    return result


def wire(client: str, cluster: Any, go: GoTools, tmp: str) -> dict[str, Any]:
    """A 20-message trace of the client's socket calls: writes per PUB, IDENTIFY, NODELAY."""
    topic = "bench_rt_wire"
    cluster.fresh_topic(topic, channel=None)
    argv, stdin, env = client_argv(client, cluster.tcp, topic, 20, go, tmp)
    out = os.path.join(tmp, f"wire-{client}")
    run_process(["strace", "-f", "-o", out, "-s", "400", "-e",
                 "trace=write,writev,sendto,sendmsg,setsockopt,connect", *argv],
                stdin=stdin, env=env, timeout=120)
    cluster.drop_topic(topic)
    with open(out, errors="replace") as f:
        text = f.read()
    port = cluster.tcp.rsplit(":", 1)[1]
    conn = re.search(rf"connect\((\d+), .*?sin_port=htons\({port}\)", text)
    fd = conn.group(1) if conn else None
    writes = [ln for ln in text.splitlines()
              if fd and re.search(rf"\b({'|'.join(WRITE_CALLS)})\({fd},", ln)]
    sizes = [int(m.group(1)) for ln in writes if (m := re.search(r"= (\d+)$", ln))]
    pubs = sum(1 for ln in writes if "PUB bench_rt_wire" in ln)
    identify = ""
    for ln in writes:
        if "{" in ln and "client_id" in ln:
            identify = ln[ln.index("{"):ln.rindex("}") + 1].replace('\\"', '"')
            break
    nodelay = bool(fd and re.search(rf"setsockopt\({fd}, SOL_TCP, TCP_NODELAY, \[1\]", text))
    first_pub = next((i for i, ln in enumerate(writes) if "PUB bench_rt_wire" in ln), len(writes))
    after = sizes[first_pub:]
    return {"writes_per_pub": len(after) / max(pubs, 1), "pub_sizes": Counter(after),
            "identify": identify, "nodelay": nodelay,
            "setup_writes": sizes[:first_pub]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", default=None, metavar="DIR")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--messages", type=int, default=None,
                        help="one-at-a-time PUBs per run (default 20000, quick 5000)")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--rates", default="0,8000,4000,2000",
                        help="to_nsq --rate values of the gap experiment (0: unthrottled)")
    parser.add_argument("--no-strace", action="store_true")
    parser.add_argument("--no-match", action="store_true",
                        help="skip the matched-pace run (to_nsq --rate at smartnsq's rate)")
    args = parser.parse_args()
    folder = real_dir(args.real)
    go = GoTools(folder)
    n = args.messages or (5000 if args.quick else 20000)
    clients = [c for c in args.clients.split(",") if c]
    use_strace = not args.no_strace and shutil.which("strace") is not None
    rows, sys_rows, srv_rows, wire_rows, idents = [], [], [], [], []
    gap_rows = []
    measured: dict[str, dict[str, Any]] = {}
    with real_server("classic", folder, nsqd_args=("--mem-queue-size=10000000",)) as cluster, \
            tempfile.TemporaryDirectory(prefix="smartnsq-rt-") as tmp:
        print(f"one-at-a-time PUB round trips on {cluster.describe()}; {n:,} messages of "
              f"{BODY} bytes per run\n", flush=True)
        for client in clients:
            r = run_once(client, cluster, go, n, tmp, "bench_rt")
            if "error" in r:
                rows.append([client, r["error"][:80], "-", "-", "-"])
                continue
            measured[client] = r
            gap = 1e6 / r["rate"]
            rows.append([client, f"{r['rate']:,.0f}", f"{gap:.0f}", f"{r['cpu_us']:.1f}",
                         f"{r['server_us']:.1f}"])
            print(f"  {client}: {r['rate']:,.0f} msg/s, client {r['cpu_us']:.1f} us, nsqd "
                  f"{r['server_us']:.1f} us per msg", flush=True)
            if not use_strace:
                continue
            # client syscalls per message: N and 3N under strace -c, by difference
            counts = []
            for k in (1, 3):
                out = os.path.join(tmp, f"c-{client}-{k}")
                rk = run_once(client, cluster, go, n * k // 4, tmp, "bench_rt",
                              prefix=["strace", "-f", "-c", "-o", out])
                counts.append((rk.get("count", n * k // 4), strace_counts(out)))
            if client == "bench_writer":  # a fixed time: totals over its count
                msgs, per = counts[1][0], counts[1][1]
            else:
                msgs = counts[1][0] - counts[0][0]
                per = counts[1][1] - counts[0][1]
            total = sum(per.values()) / max(msgs, 1)
            top = ", ".join(f"{name} {calls / msgs:.2f}" for name, calls in per.most_common(6))
            sys_rows.append([client, f"{total:.2f}", top])
            # nsqd syscalls per message, strace attached to it over the client's run
            out = os.path.join(tmp, f"s-{client}")
            rs = run_once(client, cluster, go, n // 4, tmp, "bench_rt", attach=out)
            scounts = strace_counts(out)
            smsgs = rs.get("stored") or n // 4
            stotal = sum(scounts.values()) / smsgs
            stop = ", ".join(f"{name} {calls / smsgs:.2f}"
                             for name, calls in scounts.most_common(6))
            srv_rows.append([client, f"{stotal:.2f}", stop])
            w = wire(client, cluster, go, tmp)
            sizes = ", ".join(f"{size} B x{count}" for size, count in
                              sorted(w["pub_sizes"].items()))
            wire_rows.append([client, f"{w['writes_per_pub']:.2f}", sizes,
                              "yes" if w["nodelay"] else "no",
                              " + ".join(map(str, w["setup_writes"]))])
            idents.append((client, w["identify"]))
        rates = [int(x) for x in args.rates.split(",") if x]
        pace = measured.get("smartnsq", {}).get("rate")
        if pace and not args.no_match:  # go-nsq at smartnsq's pace: the nsqd's cost compared
            rates.append(round(pace))
        for rate in rates:
            name = "to_nsq" if rate == 0 else f"to_nsq@{rate}"
            r = run_once(name, cluster, go, n if rate == 0 else min(n, rate * 3), tmp,
                         "bench_rt_gap")
            if "error" in r:
                gap_rows.append([name, r["error"][:80], "-", "-"])
                continue
            label = (f"{name} (smartnsq's pace)" if pace and not args.no_match
                     and rate == round(pace) else name)
            gap_rows.append([label, f"{r['rate']:,.0f}", f"{1e6 / r['rate']:.0f}",
                             f"{r['server_us']:.1f}"])
        if pace and "smartnsq" in measured:
            me = measured["smartnsq"]
            gap_rows.append(["smartnsq (above)", f"{me['rate']:,.0f}",
                             f"{1e6 / me['rate']:.0f}", f"{me['server_us']:.1f}"])
        where = cluster.describe()
    print("\nper client, one PUB at a time (rate and client CPU as bench/publish.py takes them; "
          "to_nsq: the whole process)\n")
    print(table(["client", "msg/s", "us between PUBs", "client CPU us/msg",
                 "nsqd CPU us/msg"], rows))
    if sys_rows:
        print("\nclient syscalls per PUB (strace -f -c, runs of N/4 and 3N/4, the difference; "
              "bench_writer: total over its count)\n")
        print(table(["client", "syscalls/PUB", "most frequent (per PUB)"], sys_rows))
        print("\nnsqd syscalls per PUB (strace -f -c -p NSQD over the client's run)\n")
        print(table(["client", "syscalls/PUB", "most frequent (per PUB)"], srv_rows))
        print("\nthe client's socket writes (strace -e trace=write,writev,sendto,sendmsg of a "
              "20-message run)\n")
        print(table(["client", "writes per PUB", "bytes per write (after the first PUB)",
                     "TCP_NODELAY", "writes before the first PUB"], wire_rows))
        print("\nIDENTIFY bodies:")
        for client, body in idents:
            print(f"  {client}: {body or '(none: the client sends no IDENTIFY)'}")
    print("\nthe gap experiment: go-nsq (to_nsq) throttled with --rate, nsqd CPU per PUB\n")
    print(table(["client", "msg/s", "us between PUBs", "nsqd CPU us/msg"], gap_rows))
    print(f"\ncommand: {command_line()}")
    print(environment(f"server: {where}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
