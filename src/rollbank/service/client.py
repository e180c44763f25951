"""A small client for trainers: :class:`CollectorClient` drives ``rollbank serve-collector``.

    from rollbank.service.client import CollectorClient
    with CollectorClient("http://127.0.0.1:8765", token) as c:
        while (b := c.next_batch(timeout_s=30)) is not None:   # None: collection over
            if b.lease is None:
                continue                                     # nothing yet (long poll timed out)
            table = b.table or pyarrow.parquet.read_table(b.lease["parquet"])
            ...train...
            c.ack(b)
            c.announce_version(step, checkpoint="/ckpt/v1")

Only httpx (a core dependency) is needed; ``arrow=True`` also needs pyarrow (core). A refused
request raises :class:`~rollbank.errors.ServiceError` with the service's HTTP status
(401 bad token, 409 stale lease or version, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx
import pyarrow as pa

from rollbank.errors import ServiceError

_HEADER = "x-rollbank-"


@dataclass(frozen=True)
class Fetched:
    """One answer of :meth:`CollectorClient.next_batch`: ``lease`` (batch_index, lease_id,
    path, parquet, rows, ...) or None when the long poll timed out; ``table`` with ``arrow``."""

    lease: dict[str, Any] | None
    table: pa.Table | None = None

    @property
    def batch_index(self) -> int:
        assert self.lease is not None
        return int(self.lease["batch_index"])


class CollectorClient:
    """Synchronous client of the collector service (one ``httpx.Client``)."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport,
                                  headers={"Authorization": f"Bearer {token}"})

    def __enter__(self) -> CollectorClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, *, ok: tuple[int, ...] = (200,), timeout: float | None = None,
              **kwargs: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, timeout=timeout or self.timeout_s, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceError(f"{method} {self.url}{path}: {exc}", status=0) from exc
        if resp.status_code not in ok:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            raise ServiceError(f"{method} {path}: HTTP {resp.status_code}: {detail}",
                               status=resp.status_code)
        return resp

    def next_batch(self, timeout_s: float = 30.0, *, arrow: bool = False) -> Fetched | None:
        """Lease the next batch (long poll up to ``timeout_s``). ``Fetched(lease=None)``: none
        within the timeout; None: the collection is over and every batch acknowledged."""
        resp = self._call("POST", "/v1/batches/next", ok=(200, 204, 410), timeout=timeout_s + 30,
                          params={"timeout_s": timeout_s, "format": "arrow" if arrow else "json"})
        if resp.status_code == 410:
            return None
        if resp.status_code == 204:
            return Fetched(None)
        if not arrow:
            return Fetched(resp.json())
        lease: dict[str, Any] = {k[len(_HEADER):].replace("-", "_"): v
                                 for k, v in resp.headers.items() if k.lower().startswith(_HEADER)}
        for key in ("batch_index", "delivery", "rows"):
            lease[key] = int(lease[key])
        lease["lease_expires_in_s"] = float(lease["lease_expires_in_s"])
        with pa.ipc.open_stream(resp.content) as reader:
            table = reader.read_all()
        return Fetched(lease, table)

    def ack(self, batch: Fetched | dict[str, Any]) -> bool:
        """Acknowledge a fetched batch (True: now; False: it already was)."""
        lease = batch.lease if isinstance(batch, Fetched) else batch
        assert lease is not None, "nothing to acknowledge: the fetch timed out"
        resp = self._call("POST", f"/v1/batches/{lease['batch_index']}/ack",
                          json={"lease_id": lease["lease_id"]})
        return bool(resp.json()["acknowledged"])

    def release(self, batch: Fetched | dict[str, Any]) -> None:
        """Give a fetched batch back: it is offered again at once."""
        lease = batch.lease if isinstance(batch, Fetched) else batch
        assert lease is not None, "nothing to release: the fetch timed out"
        self._call("POST", f"/v1/batches/{lease['batch_index']}/release",
                   json={"lease_id": lease["lease_id"]})

    def announce_version(self, version: int, *, checkpoint: str | None = None,
                         lora: str | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
        """Announce weight ``version`` (``checkpoint``: a directory the service hot-loads on its
        engines; None: the engines already serve it)."""
        body = {"version": version, "checkpoint": checkpoint, "lora": lora}
        out: dict[str, Any] = self._call("POST", "/v1/versions", json=body, timeout=timeout_s).json()
        return out

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = self._call("GET", "/v1/status").json()
        return out

    def metrics(self) -> str:
        """The Prometheus text exposition."""
        return self._call("GET", "/metrics").text
