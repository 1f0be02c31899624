"""KV events (`mooring.events`): a subscriber of a real master's `/kv_events` feed sees every
value stored and removed by a scripted workload, in order, and nothing else; evictions and
removals keep its picture equal to what the store holds; and it is told when it missed some."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from conftest import Master, connect, free_port, mooring_binary
from mooring.events import KvEventError, KvEventSubscriber
from mooring.store import MooncakeDistributedStore


def feed_master(*flags: str) -> tuple[Master, str]:
    metrics = f"127.0.0.1:{free_port()}"
    return Master("--metrics-listen", metrics, *flags), metrics


def replay(events: list[dict], into: set[str]) -> None:
    for event in events:
        if event["type"] == "BlockStored":
            into.add(event["block_hashes"][0])
        elif event["type"] == "BlockRemoved":
            into.remove(event["block_hashes"][0])
        else:
            into.clear()


@pytest.fixture(scope="module")
def cluster():
    master, metrics = feed_master("--kv-events", "100000")
    store = connect(master, segment="8MB", local="8MB")
    yield store, metrics
    store.close()
    master.stop()


def test_a_subscriber_sees_each_put_and_removal_in_order_and_nothing_else(cluster):
    store, metrics = cluster
    feed = KvEventSubscriber(metrics, prefix="script/")
    assert feed.poll() == []  # starts from now
    assert store.put("script/a", b"1" * 100) == 0
    assert store.put("script/b", b"2" * 200) == 0
    assert store.put("elsewhere/c", b"3") == 0  # another prefix: not for this subscriber
    assert store.upsert("script/a", b"4" * 300) == 0  # the old value goes, the new one comes
    assert store.remove("script/b") == 0
    assert store.get("script/a") == b"4" * 300  # reads are no events
    # A put of a key that exists keeps the value (as Mooncake's does): no event either.
    assert store.put("script/a", b"5") == 0
    assert store.get("script/a") == b"4" * 300
    events = feed.poll()
    seen = [(e["type"], e["block_hashes"][0], e["size"]) for e in events]
    assert seen == [
        ("BlockStored", "script/a", 100),
        ("BlockStored", "script/b", 200),
        ("BlockRemoved", "script/a", 0),
        ("BlockStored", "script/a", 300),
        ("BlockRemoved", "script/b", 0),
    ]
    numbers = [e["seq"] for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    # The removal names the write whose value went; the upsert's store a newer one.
    assert events[2]["write"] == events[0]["write"] < events[3]["write"]
    assert all(e["tenant"] == "default" and e["medium"] == "mooring" for e in events)
    assert feed.poll() == []


def test_evictions_keep_the_subscribers_picture_equal_to_the_store(cluster):
    store, metrics = cluster
    feed = KvEventSubscriber(metrics, prefix="fill/", page=50)
    feed.poll()
    value = b"x" * (512 * 1024)
    # 8 MB of memory, 24 values of 512 KiB: the oldest are evicted to make room.
    for i in range(24):
        assert store.put(f"fill/{i:02}", value) == 0
    assert store.remove("fill/23") == 0
    picture: set[str] = set()
    # Pages of at most 50 events: follow until caught up.
    for _ in range(10):
        events = feed.poll()
        replay(events, picture)
        if not events:
            break
    held = {f"fill/{i:02}" for i in range(24) if store.is_exist(f"fill/{i:02}") == 1}
    assert held, "something must still be stored"
    assert len(held) < 23, "the workload must evict"
    assert picture == held


def test_a_subscriber_that_fell_behind_is_told_to_forget():
    master, metrics = feed_master("--kv-events", "3")
    store = connect(master, segment="8MB", local="8MB")
    try:
        feed = KvEventSubscriber(metrics, from_start=True)
        for i in range(5):
            assert store.put(f"k{i}", b"v") == 0
        events = feed.poll()
        assert events[0] == {"type": "AllBlocksCleared"}
        assert [e["block_hashes"][0] for e in events[1:]] == ["k2", "k3", "k4"]
        assert feed.poll() == []
    finally:
        store.close()
        master.stop()


def test_a_new_master_is_a_new_epoch(tmp_path):
    port = free_port()
    state = str(tmp_path / "state")
    flags = ("--metrics-listen", f"127.0.0.1:{port}", "--kv-events", "100", "--state-dir", state)
    master = Master(*flags)
    feed = KvEventSubscriber(f"127.0.0.1:{port}")
    try:
        assert feed.poll() == []
    finally:
        master.stop()
    time.sleep(0.01)  # epochs are milliseconds of the wall clock
    master = Master(*flags)
    try:
        assert feed.poll() == [{"type": "AllBlocksCleared"}]
        assert feed.poll() == []
    finally:
        master.stop()


def test_the_feed_is_off_unless_asked_for_and_needs_the_metrics_token(tmp_path):
    master, metrics = feed_master()
    try:
        with pytest.raises(KvEventError, match="--kv-events"):
            KvEventSubscriber(metrics).poll()
    finally:
        master.stop()
    token = tmp_path / "scrape.token"
    token.write_text("s3cret-scrape-token\n")
    token.chmod(0o600)
    master, metrics = feed_master("--kv-events", "10", "--metrics-token-file", str(token))
    try:
        with pytest.raises(KvEventError, match="401"):
            KvEventSubscriber(metrics).poll()
        assert KvEventSubscriber(metrics, token_file=token).poll() == []
    finally:
        master.stop()
    # Without --metrics-listen there is nowhere to serve it: the master says so at once.
    refused = subprocess.run(
        [mooring_binary(), "master", "--kv-events", "10"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0
    assert "--metrics-listen" in refused.stderr


def test_each_tenant_follows_its_own_keys(tmp_path):
    token = tmp_path / "cluster.token"
    subprocess.run([mooring_binary(), "token", "new", str(token)], check=True)
    credential = tmp_path / "team-a.cred"
    subprocess.run(
        [mooring_binary(), "token", "issue", "--token-file", str(token), "--name", "engine"]
        + ["--tenant", "team-a", "--role", "node,client", str(credential)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    master, metrics = feed_master("--token-file", str(token), "--kv-events", "100")
    store = MooncakeDistributedStore()
    code = store.setup(
        "127.0.0.1", "P2PHANDSHAKE", "8MB", "8MB", "tcp", "", master.address,
        tenant_id="team-a", token_file=str(credential),
    )  # fmt: skip
    assert code == 0, code
    try:
        own = KvEventSubscriber(metrics, tenant="team-a", from_start=True)
        other = KvEventSubscriber(metrics, from_start=True)
        assert store.put("shared-name", b"v") == 0
        events = own.poll()
        assert [(e["type"], e["block_hashes"], e["tenant"]) for e in events] == [
            ("BlockStored", ["shared-name"], "team-a")
        ]
        assert other.poll() == []
    finally:
        store.close()
        master.stop()


def test_the_cli_follows_the_feed_one_json_line_per_event(cluster):
    store, metrics = cluster
    follower = subprocess.Popen(
        [
            mooring_binary(),
            "events",
            "--metrics",
            metrics,
            "--prefix",
            "cli/",
            "--interval",
            "20ms",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)  # it starts following from now
        assert store.put("cli/a", b"x" * 10) == 0
        assert store.put("not-cli/b", b"y") == 0
        assert store.remove("cli/a") == 0
        lines = [json.loads(follower.stdout.readline()) for _ in range(2)]
        assert [(e["type"], e["block_hashes"], e["size"]) for e in lines] == [
            ("BlockStored", ["cli/a"], 10),
            ("BlockRemoved", ["cli/a"], 0),
        ]
    finally:
        follower.terminate()
        follower.wait(timeout=10)
    # A master without the feed: the CLI says what to do and stops.
    master, plain = feed_master()
    try:
        refused = subprocess.run(
            [mooring_binary(), "events", "--metrics", plain],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert refused.returncode != 0
        assert "--kv-events" in refused.stderr
    finally:
        master.stop()
