"""The web page with API keys on: a browser signs in with a key (headless Chromium, driven over
its DevTools protocol), then sees the page, its pictures and its styles through a session
cookie; the cookie's attributes, cross-site posts, sign-out and a revoked key."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.ci import service_unavailable

from .conftest import REPO, Server, mixture_data
from .test_e2e_ui import CHROMIUM, FIRST_LINE, SECOND_LINE, SUCCEEDED_BADGE, count_colour, pixels

pytestmark = pytest.mark.e2e

MIXREG = REPO / ".venv" / "bin" / "mixreg"
FAST = {"n_init": 4, "n_partitions": 50, "subsample_size": 30}


def create_key(key_file: Path, scope: str) -> str:
    environment = {**os.environ, "MIXREG_API_KEYS_FILE": str(key_file)}
    environment.pop("MIXREG_API_KEYS", None)
    result = subprocess.run(
        [str(MIXREG), "keys", "create", "--scope", scope],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout.strip()


class Keyed:
    def __init__(self, server: Server, key_file: Path, read: str, write: str) -> None:
        self.server, self.key_file, self.read, self.write = server, key_file, read, write


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    """A server requiring keys, with a fitted model to show."""
    folder = tmp_path_factory.mktemp("ui-keys")
    key_file = folder / "api-keys.json"
    write, read = create_key(key_file, "write"), create_key(key_file, "read")
    server = Server(
        database_url=f"sqlite:///{folder / 'mixreg.db'}",
        log_path=folder / "server.log",
        settings={"MIXREG_API_KEYS_FILE": str(key_file)},
    )
    try:  # stopped even when the fit below fails: no teardown runs for a failed setup
        server.start()
        server.client.headers["Authorization"] = f"Bearer {write}"
        X, y = mixture_data(n_rows=150, seed=12)
        job = server.wait_for_job(
            server.fit({"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "params": FAST})
        )
        assert job["status"] == "succeeded"
        server.client.headers.pop("Authorization")
        yield Keyed(server, key_file, read, write)
    finally:
        server.stop()
        server.client.close()


class Browser:
    """Headless Chromium and one of its tabs, driven over the DevTools protocol."""

    def __init__(self, profile: Path) -> None:
        if not CHROMIUM.exists():
            service_unavailable(f"{CHROMIUM} is not installed (make test installs it)")
        self.process = subprocess.Popen(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--window-size=1400,1200",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.connections = contextlib.ExitStack()
        try:
            port_file = profile / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not port_file.exists() or not port_file.read_text().strip():
                assert time.monotonic() < deadline, "Chromium did not open its DevTools port"
                time.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            page = next(target for target in targets if target["type"] == "page")
            self.socket: ClientConnection = self.connections.enter_context(
                connect(page["webSocketDebuggerUrl"], max_size=None)
            )
        except BaseException:
            self.close()
            raise
        self.next_id = 0
        self.send("Page.enable")
        self.send("Network.enable")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        answer = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            assert time.monotonic() < deadline, f"never true: {expression}"
            time.sleep(0.1)

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])

    def close(self) -> None:
        self.connections.close()
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    browser = Browser(tmp_path / "profile")
    yield browser
    browser.close()


def test_a_browser_signs_in_with_a_key_and_sees_the_page(
    keyed: Keyed, browser: Browser, tmp_path: Path
):
    base = keyed.server.base_url
    browser.open(f"{base}/ui")
    assert browser.evaluate("location.pathname") == "/ui/sign-in"

    browser.evaluate(
        f"document.getElementById('api_key').value = {json.dumps(keyed.read)};"
        "document.querySelector('form[action=\"/ui/sign-in\"]').submit();"
    )
    browser.wait_for("location.pathname === '/ui' && document.readyState === 'complete'")
    browser.wait_for(
        "[...document.images].length > 0 && "
        "[...document.images].every(image => image.complete && image.naturalWidth > 0)"
    )
    png = browser.screenshot()
    (tmp_path / "signed-in.png").write_bytes(png)
    image = pixels(png)
    assert count_colour(image, SUCCEEDED_BADGE, tolerance=2) > 1500
    # The picture loaded: the page itself uses neither of the components' colours.
    assert count_colour(image, FIRST_LINE, 12) > 10 and count_colour(image, SECOND_LINE, 12) > 10
    key_id = keyed.read.split("_")[1]
    assert browser.evaluate("document.querySelector('form.sign-out').innerText").startswith(
        f"key {key_id}"
    )

    cookies = {cookie["name"]: cookie for cookie in browser.send("Network.getCookies")["cookies"]}
    session = cookies["mixreg_session"]
    assert session["httpOnly"] and session["sameSite"] == "Strict" and not session["secure"]
    assert 0 < session["expires"] - time.time() <= 8 * 3600 + 60
    assert keyed.read not in session["value"]
    # The cookie reads the page's data, and nothing else: not the API, not a write.
    with httpx.Client(base_url=base, cookies={"mixreg_session": session["value"]}) as cookie:
        assert cookie.get("/ui").status_code == 200
        assert cookie.get("/models").status_code == 401
        assert cookie.delete("/models/x").status_code == 401

    browser.evaluate("document.querySelector('form.sign-out').submit();")
    browser.wait_for("location.pathname === '/ui/sign-in'")
    names = {cookie["name"] for cookie in browser.send("Network.getCookies")["cookies"]}
    assert "mixreg_session" not in names
    browser.open(f"{base}/ui")
    assert browser.evaluate("location.pathname") == "/ui/sign-in"


def test_sign_in_refuses_cross_site_posts_and_bad_keys(keyed: Keyed):
    with httpx.Client(base_url=keyed.server.base_url, timeout=30) as client:
        form = client.get("/ui/sign-in")
        assert form.status_code == 200
        assert "mixreg_csrf" in form.cookies
        token = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert token is not None
        csrf = token.group(1)

        forged = client.post(
            "/ui/sign-in",
            data={"api_key": keyed.read, "csrf": csrf},
            headers={"Origin": "https://elsewhere.example"},
        )
        assert forged.status_code == 403 and "mixreg_session" not in forged.cookies
        without_token = httpx.post(
            f"{keyed.server.base_url}/ui/sign-in", data={"api_key": keyed.read, "csrf": "x"}
        )
        assert without_token.status_code == 403

        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/sign-in").text)
        assert csrf is not None
        wrong = client.post("/ui/sign-in", data={"api_key": "mixreg_0_x", "csrf": csrf.group(1)})
        assert wrong.status_code == 401 and "not a valid API key" in wrong.text

        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/sign-in").text)
        assert csrf is not None
        signed_in = client.post("/ui/sign-in", data={"api_key": keyed.read, "csrf": csrf.group(1)})
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "/ui"
        assert client.get("/ui").status_code == 200
        assert client.post("/ui/sign-out", data={"token": "forged"}).status_code == 403

        # Revoking the key ends its sessions at once.
        environment = {**os.environ, "MIXREG_API_KEYS_FILE": str(keyed.key_file)}
        key_id = keyed.read.split("_")[1]
        subprocess.run(
            [str(MIXREG), "keys", "revoke", key_id], env=environment, check=True, timeout=60
        )
        after = client.get("/ui")
        assert after.status_code == 303 and after.headers["location"] == "/ui/sign-in"


def test_a_browser_without_a_key_gets_the_form_but_an_api_client_a_problem(keyed: Keyed):
    page = keyed.server.request("GET", "/ui")
    assert page.status_code == 303 and page.headers["location"] == "/ui/sign-in"
    api = keyed.server.request("GET", "/models")
    assert api.status_code == 401
    assert api.headers["content-type"] == "application/problem+json"


def test_the_page_styles_answer_before_a_session_and_only_to_reads(keyed: Keyed):
    with httpx.Client(base_url=keyed.server.base_url, timeout=30) as client:
        styles = client.get("/ui/static/ui.css")
        assert styles.status_code == 200, styles.text
        assert styles.headers["content-type"].startswith("text/css")
        assert "font" in styles.text
        assert client.head("/ui/static/ui.css").status_code == 200
        # Public means read: a write to the same path still needs a key.
        assert client.post("/ui/static/ui.css").status_code == 401
        # Only the files of the folder: nothing else is reached through it.
        assert client.get("/ui/static/../../models").status_code in (401, 404)
        assert client.get("/ui/static/").status_code == 401
        assert client.get("/models").status_code == 401


def test_the_sign_in_page_is_styled(keyed: Keyed, browser: Browser, tmp_path: Path):
    browser.open(f"{keyed.server.base_url}/ui/sign-in")
    browser.wait_for("document.styleSheets.length > 0")
    (tmp_path / "sign-in.png").write_bytes(browser.screenshot())
    font = browser.evaluate("getComputedStyle(document.body).fontFamily")
    assert "system-ui" in font and "Times" not in font
    # The browser's default body margin is 8px; the page's styles set none.
    assert browser.evaluate("getComputedStyle(document.body).margin") == "0px"
