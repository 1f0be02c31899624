#!/usr/bin/env python3
"""Measures whether honest members are served while strangers flood a cluster's ports.

Starts a master and a node (real `mooring` processes on loopback, with a cluster token and
member credentials), then, for DURATION seconds, keeps STRANGERS sockets reconnecting to the
master's port, the node's data port and the master's metrics port (each connects, sends nothing
or a few garbage bytes, and holds the socket until the server closes it), while one honest
client process puts and gets 4 KiB values and the metrics port is scraped. Prints, for the
honest calls and the scrapes, how many finished within 1 s.

    scripts/stranger-flood.py [--strangers 1000] [--duration 20] [--mooring target/release/mooring]

Run it on a quiet machine: it measures latency, and a loaded machine adds its own.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def start(binary: str, *args: str) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "MOORING_TOKEN_FILE"}
    proc = subprocess.Popen(
        [binary, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return proc, proc.stdout.readline().strip()


async def stranger(host: str, port: int, stop: float, garbage: bool) -> int:
    """Connects again and again until `stop`; returns how many connections it made."""
    made = 0
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            made += 1
            if garbage:
                writer.write(b"GET / HTTP/1.1\r\n")
            # Held until the server closes it (or a few seconds pass).
            try:
                await asyncio.wait_for(reader.read(1 << 16), timeout=3)
                await asyncio.wait_for(reader.read(), timeout=3)
            except (TimeoutError, ConnectionError):
                pass
            writer.close()
        except OSError:
            await asyncio.sleep(0.05)
    return made


def honest(binary: str, master: str, credential: str, stop: float) -> list[float]:
    """One honest member's puts and gets through the CLI's client, one process per call (each
    call is a whole client: connect, handshake, request). Returns each call's seconds."""
    times = []
    value = os.urandom(4096).hex()[:4096]
    i = 0
    while time.monotonic() < stop:
        key = f"honest-{i}"
        for args in (["put", key, "--value", value], ["get", key]):
            begun = time.monotonic()
            subprocess.run(
                [
                    binary,
                    *args,
                    "--master",
                    master,
                    "--token-file",
                    credential,
                    "--timeout",
                    "5s",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
            times.append(time.monotonic() - begun)
        i += 1
    return times


def scrapes(url: str, bearer: str, stop: float) -> list[float]:
    times = []
    while time.monotonic() < stop:
        begun = time.monotonic()
        request = urllib.request.Request(
            url, headers={"Authorization": f"Bearer {bearer}"}
        )
        try:
            urllib.request.urlopen(request, timeout=5).read()
            times.append(time.monotonic() - begun)
        except OSError:
            times.append(float("inf"))
        time.sleep(0.2)
    return times


def report(name: str, times: list[float]) -> None:
    within = sum(1 for t in times if t <= 1.0)
    share = 100 * within / max(1, len(times))
    print(f"{name}: {within} of {len(times)} within 1 s ({share:.1f}%)")


def cluster(binary: str) -> tuple[list[subprocess.Popen], str, Path]:
    """A master (with a metrics port) and a node on loopback, each with its own credential:
    the processes, the master's address and the honest client's credential."""
    work = Path(tempfile.mkdtemp(prefix="mooring-flood-"))
    token, node_cred, client_cred = (
        work / "token",
        work / "node.cred",
        work / "client.cred",
    )
    scrape_token = work / "scrape"
    subprocess.run(
        [binary, "token", "new", str(token)], check=True, stdout=subprocess.DEVNULL
    )
    for name, roles, path in (
        ("n1", "node", node_cred),
        ("app", "client", client_cred),
    ):
        subprocess.run(
            [binary, "token", "issue", "--token-file", str(token), "--name", name]
            + ["--role", roles, str(path)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    scrape_token.write_text("scrape-secret\n")
    scrape_token.chmod(0o600)
    master, line = start(
        binary,
        "master",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        str(token),
        "--metrics-listen",
        "127.0.0.1:0",
        "--metrics-token-file",
        str(scrape_token),
    )
    address = line.rsplit(" ", 1)[-1]
    node, _ = start(
        binary,
        "node",
        "--master",
        address,
        "--size",
        "256MiB",
        "--no-prefault",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        str(node_cred),
    )
    return [master, node], address, client_cred


async def flood(binary: str, strangers: int, duration: float) -> None:
    procs, address, credential = cluster(binary)
    try:
        metrics_port = find_metrics_port(procs[0].pid)
        ports = [
            int(address.rsplit(":", 1)[1]),
            metrics_port,
            *listening(procs[1].pid)[:1],
        ]
        stop = time.monotonic() + duration
        loop = asyncio.get_running_loop()
        knocking = [
            stranger("127.0.0.1", ports[i % len(ports)], stop, garbage=i % 2 == 0)
            for i in range(strangers)
        ]
        calls = loop.run_in_executor(
            None, honest, binary, address, str(credential), stop
        )
        scraped = loop.run_in_executor(
            None,
            scrapes,
            f"http://127.0.0.1:{metrics_port}/metrics",
            "scrape-secret",
            stop,
        )
        made = await asyncio.gather(*knocking)
        print(f"{strangers} strangers made {sum(made)} connections to ports {ports}")
        report("honest puts and gets", await calls)
        report("metrics scrapes", await scraped)
    finally:
        for proc in procs:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strangers", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--mooring", default=str(Path("target/release/mooring")))
    args = parser.parse_args()
    asyncio.run(flood(args.mooring, args.strangers, args.duration))


def listening(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        match = re.match(r"socket:\[(\d+)\]", target)
        if match:
            inodes.add(match.group(1))
    ports = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:
            ports.append(int(fields[1].split(":")[1], 16))
    return sorted(ports)


def find_metrics_port(master_pid: int) -> int:
    # The master listens on its RPC port and its metrics port; the metrics one answers HTTP.
    for port in listening(master_pid):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1)
        except urllib.error.HTTPError:
            return port
        except (OSError, http.client.HTTPException):
            continue
        return port
    sys.exit("the master's metrics port was not found")


if __name__ == "__main__":
    main()
