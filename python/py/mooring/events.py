"""KV events: follow the keys a Mooring master stores and removes, for cache-aware routing.

A master started with ``--kv-events N --metrics-listen ADDR`` keeps its latest N key changes
and serves them at ``/kv_events`` on the metrics address. Each event has the shape of vLLM's
KV-event records (``BlockStored`` / ``BlockRemoved``, with the key in ``block_hashes``), plus
its number (``seq``), the write that stored the value (``write``) and the value's ``size``::

    from mooring.events import KvEventSubscriber

    feed = KvEventSubscriber("127.0.0.1:9090", prefix="model-7b/")
    for event in feed.follow():
        if event["type"] == "BlockStored":
            router.add(event["block_hashes"][0])
        elif event["type"] == "BlockRemoved":
            router.remove(event["block_hashes"][0])
        else:  # "AllBlocksCleared": events were missed; forget what you know
            router.clear()

When the subscriber falls behind the master's N events, or the master restarts or a standby
takes over (a new ``epoch``), it yields ``{"type": "AllBlocksCleared"}`` first, as vLLM does
when a cache is reset, then goes on from the oldest event still kept: keys stored before that
are known again only once stored again (or listed with ``mooring ls``).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["KvEventError", "KvEventSubscriber"]

ALL_BLOCKS_CLEARED = "AllBlocksCleared"


class KvEventError(RuntimeError):
    """The feed could not be read: off on that master, a wrong token, or a bad request."""


class KvEventSubscriber:
    """Polls one master's ``/kv_events`` feed, keeping its place between polls.

    ``address`` is the master's metrics address (``host:port`` or an ``http://`` URL).
    ``token`` (or ``token_file``) is the bearer token the metrics address requires, if any.
    Only ``tenant``'s keys that start with ``prefix`` are yielded. With ``from_start`` the
    first poll returns every event the master still keeps; otherwise only what happens after
    the first poll.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        token_file: str | Path | None = None,
        tenant: str = "default",
        prefix: str = "",
        from_start: bool = False,
        page: int = 1000,
        timeout: float = 5.0,
    ) -> None:
        base = address if "://" in address else f"http://{address}"
        self._url = base.rstrip("/") + "/kv_events"
        if token is None and token_file is not None:
            token = Path(token_file).read_text().strip()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._filter = {"tenant": tenant, "prefix": prefix, "limit": str(page)}
        self._timeout = timeout
        self._epoch: int | None = None
        self._next: int | None = 0 if from_start else None

    @property
    def position(self) -> int | None:
        """The number of the last event looked at (``None`` before the first poll)."""
        return self._next

    def poll(self) -> list[dict[str, Any]]:
        """The events since the last poll (one page of at most ``page`` looked at), oldest
        first; an ``AllBlocksCleared`` marker first if some were missed."""
        query = dict(self._filter)
        if self._next is not None:
            query["after"] = str(self._next)
        answer = self._get(query)
        events: list[dict[str, Any]] = list(answer["events"])
        restarted = self._epoch is not None and answer["epoch"] != self._epoch
        if restarted and "after" in query:
            # Numbers from another master's feed mean nothing here: start over from its
            # oldest kept event.
            self._epoch = answer["epoch"]
            self._next = 0
            return [{"type": ALL_BLOCKS_CLEARED}] + self.poll()
        self._epoch = answer["epoch"]
        self._next = answer["next"]
        if answer["missed"]:
            events.insert(0, {"type": ALL_BLOCKS_CLEARED})
        return events

    def follow(
        self, interval: float = 0.1, stop: Callable[[], bool] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Yields events as they come, polling every ``interval`` seconds while idle (at once
        while a page comes back full), until ``stop()`` says so."""
        while stop is None or not stop():
            before = self._next
            events = self.poll()
            yield from events
            looked = (self._next or 0) - (before or 0)
            if looked < int(self._filter["limit"]):
                time.sleep(interval)

    def _get(self, query: dict[str, str]) -> dict[str, Any]:
        url = f"{self._url}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            reason = e.read().decode(errors="replace").strip()
            raise KvEventError(f"{self._url}: {e.code} {reason}") from None
        except urllib.error.URLError as e:
            raise KvEventError(
                f"{self._url}: cannot reach the master's metrics address ({e.reason}); "
                "is it started with --metrics-listen and --kv-events?"
            ) from None
