"""``convmatrix serve`` against input and callers it must refuse (``service.access``,
``service.inputs``): malformed ids, bodies and text answered 400/404/413 on SQLite and
PostgreSQL, never 500 or 503; the Host header checked (DNS rebinding); tokens of 16 to 1024
characters read from a bounded file; an empty or partial token never accepted; wrong guesses
throttled. Through Starlette's TestClient and the real server.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
import warnings
from urllib.parse import urlsplit

import pytest
import test_serve_triage
from test_serve import running_server
from test_serve_triage import TOKEN, _fill, _post

from convmatrix.cli import main
from convmatrix.core.errors import UsageError
from convmatrix.db.queries import MAX_ID
from convmatrix.service.access import MAX_TOKEN, MIN_TOKEN, Hosts, Throttle, read_token
from convmatrix.service.inputs import parse_id

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from convmatrix.service.app import create_app

database = test_serve_triage.database  # its database (three runs, two alerts), written once
reader_url = test_serve_triage.db_copy  # a copy of it a test may change

# -- malformed input: 400, 404 or 413, never 500 or 503 -----------------------------------

DEEP = 30_000  # brackets: a body of 60 kB, inside the 64 KiB limit, past Python's recursion
BODIES = {
    "nested arrays": b"[" * DEEP + b"]" * DEEP,
    "a nested note": b'{"note": ' + b"[" * 30 + b"]" * 30 + b"}",
    "a 5000-digit number": b'{"note": ' + b"1" * 5000 + b"}",
    "a huge float": b'{"note": 1e99999}',
    "NaN": b'{"note": NaN}',
    "a lone surrogate in a note": b'{"note": "why \\ud800"}',
    "a lone surrogate in a name": b'{"note": "x", "by": "\\udc80"}',
    "a NUL in a note": b'{"note": "a\\u0000b"}',
    "a NUL in an assignee": b'{"assignee": "ana\\u0000"}',
    "a NUL in a state": b'{"state": "fixed\\u0000"}',
    "a bell in a bug link": b'{"bug": "https://x/\\u0007"}',
    "an escape in an assignee": b'{"assignee": "\\u001b[31mred"}',
    "Latin-1, not UTF-8": '{"note": "caf\u00e9"}'.encode("latin-1"),
    "UTF-8 of a surrogate": b'{"note": "\xed\xa0\x80"}',
}
IDS = ["\u00b2", "1\u00b2", "\u0661", str(2**31), "9" * 19, "9" * 30, str(2**63), "-1", "1.0",
       "0x1", "+1"]  # fmt: skip


def _refusals(client: TestClient) -> list[tuple[str, int, str]]:
    """(what, status, text) of every malformed request of the probe list."""
    answers = []
    for name, body in BODIES.items():
        answer = _post(client, "/api/regressions/1", None, raw=body)
        answers.append((f"body with {name}", answer.status_code, answer.text))
    for raw in IDS:
        target = urllib.parse.quote(raw, safe="")
        for path in (f"/api/regressions/{target}", f"/api/alerts/{target}"):
            answer = _post(client, path, {"note": "x"})
            answers.append((f"POST {path}", answer.status_code, answer.text))
        for page in ("alerts", "regressions", "runs"):  # a run: no id, label or commit
            for path in (f"/{page}/{target}", f"/api/{page}/{target}"):
                answer = client.get(path)
                answers.append((f"GET {path}", answer.status_code, answer.text))
        answer = client.get(f"/api/diff/{target}/1")
        answers.append((f"GET /api/diff/{target}/1", answer.status_code, answer.text))
    return answers


def test_malformed_ids_bodies_and_text_are_400_or_404_on_both_backends(db_url):
    """Each of these was a 500 (RecursionError, ValueError, UnicodeEncodeError, int('²'), an id
    past INTEGER on PostgreSQL) or, on PostgreSQL, a 503 'cannot use database' (a NUL in
    text, an id past INTEGER in a write)."""
    _fill(db_url)
    with TestClient(create_app(db_url, token=TOKEN), raise_server_exceptions=False) as client:
        before = client.get("/api/regressions/1").json()["regression"]
        answers = _refusals(client)
        assert client.get("/api/regressions/1").json()["regression"] == before  # nothing changed
    wrong = [(what, status, text[:80]) for what, status, text in answers
             if status != (400 if what.startswith("body") else 404)]  # fmt: skip
    assert wrong == []
    assert all(text.startswith("convmatrix serve: ") for _, _, text in answers)
    said = {what: text for what, _, text in answers}
    assert "nests deeper than" in said["body with nested arrays"]
    assert "a number of 5000 characters" in said["body with a 5000-digit number"]
    assert "note: a lone surrogate (U+D800)" in said["body with a lone surrogate in a note"]
    assert "assignee: a control character (U+0000)" in said["body with a NUL in an assignee"]


def test_a_note_keeps_its_line_breaks_and_any_language(client_and_reg):
    client, reg = client_and_reg
    note = "first line\n\tsecond: caf\u00e9, \u4e2d\u6587, \U0001f600"
    answer = _post(client, f"/api/regressions/{reg}", {"note": note})
    assert answer.status_code == 200, answer.text
    assert answer.json()["regressions"][0]["note"] == note


def test_ids_are_ascii_digits_an_integer_column_holds():
    assert parse_id("12") == 12 and parse_id(str(MAX_ID)) == MAX_ID
    for bad in [*IDS, "", " 1", "1 "]:
        assert parse_id(bad) is None, bad


# -- the Host header ------------------------------------------------------------------------


def test_hosts_a_server_answers():
    local = Hosts.bound("127.0.0.1", 8000)
    for good in ("127.0.0.1:8000", "localhost:8000", "LOCALHOST:8000", "localhost.:8000"):
        assert local.refusal(good) is None, good
    for bad in ("rebind.example:8000", "127.0.0.1:8001", "127.0.0.1", "10.0.0.1:8000",
                "127.0.0.1:80x", "[::1]:8000", "127.0.0.1:8000@evil", ""):  # fmt: skip
        refusal = local.refusal(bad)
        assert refusal is not None and refusal.status in (400, 421), bad
    assert local.refusal(None).status == 400  # HTTP/1.1 requires it
    v6 = Hosts.bound("::1", 8000)
    assert v6.refusal("[::1]:8000") is None and v6.refusal("localhost:8000") is None
    everywhere = Hosts.bound("0.0.0.0", 80)
    assert everywhere.refusal("192.0.2.7") is None and everywhere.refusal("[2001:db8::1]") is None
    assert everywhere.refusal("localhost:80") is None
    assert everywhere.refusal("rebind.example").status == 421  # a name is what rebinds
    proxied = Hosts.bound("127.0.0.1", 8000, ["Reports.Example.org"])
    assert proxied.refusal("reports.example.org") is None  # any port: the proxy's
    assert proxied.refusal("reports.example.org:443") is None
    assert Hosts.bound("127.0.0.1", 8000, ["*"]).refusal("anything.example") is None


def test_a_request_naming_another_host_is_421(reader_url):
    hosts = Hosts.bound("127.0.0.1", 8000)
    with TestClient(create_app(reader_url, hosts=hosts), base_url="http://127.0.0.1:8000") as c:
        assert c.get("/regressions").status_code == 200
        assert c.get("/regressions", headers={"Host": "localhost:8000"}).status_code == 200
        for host in ("rebind.example:8000", "127.0.0.1:9999"):
            for answer in (
                c.get("/api/alerts/1", headers={"Host": host}),
                c.post("/api/alerts/1", headers={"Host": host}, content=b"{}"),
            ):
                assert answer.status_code == 421, host
                assert "is not this server" in answer.text and "--allow-host" in answer.text


def _raw(base: str, method: str, path: str, host: str, body: bytes = b"") -> int:
    """The status of a request with this exact Host header (urllib would set its own)."""
    where = urlsplit(base)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True)
        conn.putheader("Host", host)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Authorization", f"Bearer {TOKEN}")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_real_server_answers_its_own_address_only(database, tmp_path):
    """DNS rebinding: a page at http://rebind.example:PORT whose name now resolves to
    127.0.0.1 reaches the server with that name in Host; it used to be served."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    url = f"sqlite:///{database / 'results.db'}"
    with running_server(url, "--token-file", str(token_file)) as base:
        port = urlsplit(base).port
        assert _raw(base, "GET", "/api/alerts/1", f"127.0.0.1:{port}") == 200
        assert _raw(base, "GET", "/api/alerts/1", f"localhost:{port}") == 200
        assert _raw(base, "GET", "/api/alerts/1", f"rebind.example:{port}") == 421
        assert _raw(base, "GET", "/", f"rebind.example:{port}") == 421
        note = json.dumps({"note": "from elsewhere"}).encode()
        assert _raw(base, "POST", "/api/regressions/1", f"rebind.example:{port}", note) == 421
    with running_server(url, "--allow-host", "reports.example") as base:
        assert _raw(base, "GET", "/api/alerts/1", "reports.example") == 200
        assert _raw(base, "GET", "/api/alerts/1", "rebind.example") == 421


# -- tokens -----------------------------------------------------------------------------------


def test_a_token_is_16_to_1024_characters(tmp_path):
    path = tmp_path / "token"
    for size in (1, MIN_TOKEN - 1, MAX_TOKEN + 1):
        path.write_text("t" * size)
        with pytest.raises(UsageError, match=rf"--token-file .*: the token has {size} char"):
            read_token(path, {})
        with pytest.raises(UsageError, match="CONVMATRIX_SERVE_TOKEN: the token has"):
            read_token(None, {"CONVMATRIX_SERVE_TOKEN": "t" * size})
    for size in (MIN_TOKEN, MAX_TOKEN):
        path.write_text("t" * size + "\n")
        assert read_token(path, {}) == "t" * size
    with pytest.raises(UsageError, match="the token has 3 characters"):
        create_app("sqlite:///unused.db", token="abc")


def test_the_token_file_is_read_no_further_than_a_token(tmp_path):
    """``--token-file /dev/zero`` read until MemoryError; a 1 MB file was a token that could
    never be sent."""
    with pytest.raises(UsageError, match=r"--token-file /dev/zero: over 4096 bytes"):
        read_token("/dev/zero", {})
    big = tmp_path / "big"
    big.write_text("t" * 1_000_000)
    with pytest.raises(UsageError, match="over 4096 bytes"):
        read_token(big, {})
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff" * 20)
    with pytest.raises(UsageError, match="not UTF-8"):
        read_token(binary, {})


@pytest.mark.parametrize("token_file", ["/dev/zero", "short"])
def test_serve_exits_2_naming_the_token_file(database, tmp_path, capsys, token_file):
    if token_file == "short":
        token_file = str(tmp_path / "short")
        (tmp_path / "short").write_text("x")
    url = f"sqlite:///{database / 'results.db'}"
    assert main(["serve", "--db", url, "--port", "0", "--token-file", token_file]) == 2
    assert f"--token-file {token_file}" in capsys.readouterr().err


def test_an_empty_or_partial_token_is_no_token(client_and_reg):
    """A check that accepts a prefix of the token (``token.startswith(sent)``) lets an empty
    ``Bearer `` header write; each of these must be refused."""
    client, reg = client_and_reg
    path = f"/api/regressions/{reg}"
    for header in ("Bearer", "Bearer ", "Bearer  ", f"Bearer {TOKEN[:1]}",
                   f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", f"Bearer {TOKEN.upper()}",
                   f"Bearer {TOKEN[1:]}", TOKEN):  # fmt: skip
        answer = client.post(
            path, content=b'{"state": "acknowledged"}',
            headers={"Content-Type": "application/json", "Authorization": header},
        )  # fmt: skip
        assert answer.status_code == 403, header
    assert client.get(path).json()["regression"]["state"] == "detected"


class _Clock:
    """A clock the test moves (the throttle's window is a minute)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_wrong_guesses_are_throttled_per_address(reader_url):
    """~2,500 wrong tokens a second were checked from one address; now a handful a window."""
    clock = _Clock()
    throttle = Throttle(limit=3, window_s=60, clock=clock)
    with TestClient(create_app(reader_url, token=TOKEN, throttle=throttle)) as client:
        path = "/api/regressions/1"
        for _ in range(3):
            assert _post(client, path, {"note": "x"}, token="guess-guess-guess").status_code == 403
        for token in ("guess-guess-guess", TOKEN):  # the right one waits too, or guessing goes on
            blocked = _post(client, path, {"note": "x"}, token=token)
            assert blocked.status_code == 429 and "too many wrong tokens" in blocked.text
            assert 1 <= int(blocked.headers["retry-after"]) <= 60
        clock.now += 61
        assert _post(client, path, {"note": "a note"}).status_code == 200
    other = Throttle(limit=3, window_s=60, clock=clock)
    for _ in range(3):
        other.failed("10.0.0.1")
    assert other.wait("10.0.0.1") > 0 and other.wait("10.0.0.2") == 0  # per address
    few = Throttle(limit=1, clients=2, clock=clock)
    for address in ("a", "b", "c"):
        few.failed(address)
    assert few.wait("a") == 0 and few.wait("c") > 0  # the oldest address forgotten first


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def client_and_reg(reader_url):
    with TestClient(create_app(reader_url, token=TOKEN)) as client:
        reg = client.get("/api/alerts/1").json()["alert"]["regressions"][0]["id"]
        yield client, reg
