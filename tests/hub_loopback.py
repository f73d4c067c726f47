"""A loopback Hugging Face hub for tests and `scripts/bench_hub.py`: never the network.

It answers what huggingface_hub and `datasets` ask of the hub, on 127.0.0.1:
- `HEAD/GET /[datasets/]ORG/NAME/resolve/REV/PATH` with X-Repo-Commit, ETag and Content-Length, HTTP Range
  (206) for resumed transfers;
- `GET /api/{models,datasets}/ORG/NAME[/revision/REV]` (the commit and the file list, `siblings`);
- `GET /api/{models,datasets}/ORG/NAME/tree/REV[/PATH]` (`recursive`), `POST .../paths-info/REV`;
- errors as the hub sends them (X-Error-Code RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo).

A repo has commits (each a {path: bytes}) and refs naming them (`main`, tags, `refs/convert/parquet`). A gated
repo's files need `Authorization: Bearer TOKEN` with a token it lists (none: 401, another: 403); its info is
public, as on the hub. `faults[path]` breaks one file's transfer: "truncate" (full Content-Length, half the
body, then the connection closes), "drop-once" (the same, once: a resumed request then gets the rest) or
"overlong" (a Content-Length 100 bytes over the body, and the connection left open: a stall). Every request is recorded. The server stops itself after `lifetime` seconds at most.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Repo:
    kind: str  # "model" or "dataset"
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    tokens: set[str] | None = None  # gated: the tokens that may read its files

    def commit(self, files: dict[str, bytes], *refs: str) -> str:
        """Add a commit holding `files`, named by `refs` (e.g. "main", "v1.0"); its sha."""
        sha = hashlib.sha1(json.dumps(sorted((p, hashlib.sha1(d).hexdigest()) for p, d in files.items())).encode()
                           + str(len(self.commits)).encode()).hexdigest()  # fmt: skip
        self.commits[sha] = dict(files)
        for ref in refs:
            self.refs[ref] = sha
        return sha

    def resolve(self, rev: str) -> str | None:
        if rev in self.refs:
            return self.refs[rev]
        return rev if rev in self.commits else None


@dataclass
class Hub:
    repos: dict[tuple[str, str], Repo] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    ranges: list[tuple[str, str]] = field(default_factory=list)  # (path, Range header) of resumed requests
    faults: dict[str, str] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    url: str = ""
    stop: threading.Event = field(default_factory=threading.Event)

    def repo(self, kind: str, name: str) -> Repo:
        return self.repos.setdefault((kind, name), Repo(kind))

    def dataset(self, name: str, files: dict[str, bytes], *refs: str) -> str:
        return self.repo("dataset", name).commit(files, *(refs or ("main",)))

    def model(self, name: str, files: dict[str, bytes], *refs: str) -> str:
        return self.repo("model", name).commit(files, *(refs or ("main",)))

    def fetched(self) -> list[str]:
        """The paths of the files whose bodies were sent (GET .../resolve/...)."""
        return [p.split("/resolve/", 1)[1].split("/", 1)[1] for m, p, _ in self.requests
                if m == "GET" and "/resolve/" in p]  # fmt: skip


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: Hub

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._route(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._route(body=True)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else b""
        self._route(body=True, form=data)

    def _route(self, body: bool, form: bytes | None = None) -> None:
        self.hub.requests.append((self.command, self.path, self.headers.get("Authorization")))
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.lstrip("/").split("/")]
        if parts[0] == "api" and len(parts) >= 4 and parts[1] in ("models", "datasets"):
            return self._api("model" if parts[1] == "models" else "dataset", f"{parts[2]}/{parts[3]}", parts[4:],
                             parse_qs(url.query), form)  # fmt: skip
        kind = "model"
        if parts[0] == "datasets":
            kind, parts = "dataset", parts[1:]
        if len(parts) < 5 or parts[2] != "resolve":
            return self._error(404, "RepoNotFound")
        return self._resolve(kind, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), body)

    def _repo(self, kind: str, name: str) -> Repo | None:
        repo = self.hub.repos.get((kind, name))
        if repo is None:
            self._error(401 if not self.headers.get("Authorization") else 404, "RepoNotFound")
        return repo

    def _revision(self, repo: Repo, rev: str) -> str | None:
        sha = repo.resolve(rev)
        if sha is None:
            self._error(404, "RevisionNotFound")
        return sha

    def _api(self, kind: str, name: str, rest: list[str], query: dict[str, list[str]], form: bytes | None) -> None:
        repo = self._repo(kind, name)
        if repo is None:
            return
        if not rest or rest[0] == "revision":
            rev = "/".join(rest[1:]) if rest else "main"
            sha = self._revision(repo, rev)
            if sha is None:
                return
            files = repo.commits[sha]
            info = {"id": name, "sha": sha, "private": False, "gated": "manual" if repo.tokens is not None else False,
                    "siblings": [{"rfilename": p} for p in sorted(files)], "disabled": False, "downloads": 0,
                    "likes": 0, "tags": [], "cardData": {}}  # fmt: skip
            return self._json(info)
        if rest[0] in ("tree", "paths-info"):
            # the revision may hold slashes (refs/convert/parquet, sent encoded): the longest ref that matches
            joined = "/".join(rest[1:])
            rev = next((r for r in sorted(repo.refs, key=len, reverse=True) if joined == r or joined.startswith(r + "/")),
                       rest[1] if len(rest) > 1 else "main")  # fmt: skip
            sha = self._revision(repo, rev)
            if sha is None:
                return
            files = repo.commits[sha]
            if rest[0] == "paths-info":
                fields = parse_qs(form.decode()) if form else {}
                if form and form.lstrip().startswith(b"{"):
                    fields = {"paths": json.loads(form)["paths"]}
                wanted = fields.get("paths", [])
                return self._json([self._entry(p, files) for p in wanted if self._entry(p, files)])
            path = joined[len(rev) :].strip("/")
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            entries = self._listing(files, path, recursive)
            if entries is None:
                return self._error(404, "EntryNotFound")
            return self._json(entries)
        return self._error(404, "RepoNotFound")

    @staticmethod
    def _entry(path: str, files: dict[str, bytes]) -> dict[str, object] | None:
        if path in files:
            data = files[path]
            return {"type": "file", "path": path, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
        if any(p.startswith(path.rstrip("/") + "/") for p in files):
            return {"type": "directory", "path": path.rstrip("/"), "oid": "0" * 40}
        return None

    def _listing(self, files: dict[str, bytes], folder: str, recursive: bool) -> list[dict[str, object]] | None:
        prefix = folder + "/" if folder else ""
        if folder and not any(p.startswith(prefix) for p in files):
            return None
        out: dict[str, dict[str, object]] = {}
        for p in sorted(files):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix) :].split("/")
            for depth in range(1, len(rest)):
                if not recursive and depth > 1:
                    break
                d = prefix + "/".join(rest[:depth])
                out.setdefault(d, {"type": "directory", "path": d, "oid": "0" * 40})
            if recursive or len(rest) == 1:
                out[p] = self._entry(p, files) or {}
        return list(out.values())

    def _resolve(self, kind: str, name: str, rev: str, path: str, body: bool) -> None:
        repo = self._repo(kind, name)
        if repo is None:
            return
        if repo.tokens is not None:
            auth = self.headers.get("Authorization") or ""
            if not auth:
                return self._error(401, "GatedRepo")
            if auth.removeprefix("Bearer ") not in repo.tokens:
                return self._error(403, "GatedRepo")
        # a branch whose name holds slashes: `refs/convert/parquet` arrives encoded, as one part
        sha = self._revision(repo, rev)
        if sha is None:
            return
        data = repo.commits[sha].get(path)
        if data is None:
            return self._error(404, "EntryNotFound")
        fault = self.hub.faults.get(path)
        if fault == "drop-once":
            fault = None if path in self.hub.dropped or not body else "truncate"
            if body:
                self.hub.dropped.add(path)
        start = 0
        rng = self.headers.get("Range")
        if rng:
            self.hub.ranges.append((path, rng))
        if rng and rng.startswith("bytes=") and fault is None:
            start = int(rng[6:].split("-")[0] or 0)
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", sha)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        extra = 100 if fault == "overlong" else 0
        self.send_header("Content-Length", str(len(data) - start + extra))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if not body:
            return
        if fault == "truncate":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(data[start:])
        self.wfile.flush()
        if fault == "overlong":  # hold the connection open, sending nothing: the client waits for 100 bytes
            self.hub.stop.wait(60)

    def _json(self, value: object) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str) -> None:
        data = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


@contextmanager
def loopback_hub(lifetime: float = 600.0) -> Iterator[Hub]:
    """A running loopback hub (its `url` for HF_ENDPOINT); stopped on exit, or after `lifetime` seconds."""
    hub = Hub()
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    timer = threading.Timer(lifetime, server.shutdown)
    timer.daemon = True
    timer.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    started = time.monotonic()
    try:
        yield hub
    finally:
        hub.stop.set()
        timer.cancel()
        if time.monotonic() - started < lifetime:
            server.shutdown()
        server.server_close()
