"""A browser-like HTTP client of the web console: keeps the console's cookies (also for a
127.0.0.1 host, which aiohttp's default jar ignores), follows no redirect on its own, and reads
each page's CSRF token to send it back with the next form."""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.cookies import SimpleCookie

import aiohttp
from yarl import URL

CSRF_FIELD = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@dataclass
class Page:
    status: int
    text: str
    headers: dict[str, str]
    set_cookies: SimpleCookie

    @property
    def location(self) -> str:
        return self.headers.get("Location", "")

    @property
    def csrf(self) -> str:
        found = CSRF_FIELD.search(self.text)
        assert found is not None, "the page has no CSRF field"
        return found.group(1)


class ConsoleClient:
    def __init__(self, base_url: str, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.base_url = base_url
        connector = aiohttp.TCPConnector(ssl=ssl_context) if ssl_context is not None else None
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True), connector=connector)

    async def close(self) -> None:
        await self.session.close()

    def cookie(self, name: str) -> str | None:
        for c in self.session.cookie_jar:
            if c.key == name:
                return c.value
        return None

    def set_cookie(self, name: str, value: str) -> None:
        self.session.cookie_jar.update_cookies({name: value}, URL(self.base_url + "/console/"))

    async def _page(self, resp: aiohttp.ClientResponse) -> Page:
        cookies: SimpleCookie = SimpleCookie()
        for header in resp.headers.getall("Set-Cookie", []):
            cookies.load(header)
        return Page(resp.status, await resp.text(), dict(resp.headers), cookies)

    async def get(self, path: str) -> Page:
        async with self.session.get(self.base_url + path, allow_redirects=False) as resp:
            return await self._page(resp)

    async def post(self, path: str, form: dict[str, str] | list[tuple[str, str]], *, csrf: str | None) -> Page:
        fields = list(form.items()) if isinstance(form, dict) else list(form)
        if csrf is not None:
            fields.append(("csrf", csrf))
        async with self.session.post(self.base_url + path, data=fields, allow_redirects=False) as resp:
            return await self._page(resp)

    async def sign_in(self, client_id: str, secret: str) -> Page:
        form = await self.get("/console/sign-in")
        return await self.post(
            "/console/sign-in", {"client_id": client_id, "client_secret": secret, "next": "/console/"}, csrf=form.csrf
        )

    async def submit(self, page_path: str, action: str, form: dict[str, str] | list[tuple[str, str]]) -> Page:
        """POST ``form`` to ``action`` with the CSRF token of the page at ``page_path``."""
        page = await self.get(page_path)
        assert page.status == 200, (page.status, page.text[:500])
        return await self.post(action, form, csrf=page.csrf)


@dataclass
class FormFields(HTMLParser):
    """The form fields of a page that no label names: an ``<input>`` (not hidden), ``<select>``
    or ``<textarea>`` without a ``<label for>`` of its id, an ``aria-label``, or a ``<label>``
    around it."""

    labelled_ids: set[str] = field(default_factory=set)
    fields: list[dict[str, str | None]] = field(default_factory=list)
    inside_label: int = 0

    def __post_init__(self) -> None:
        super().__init__()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "label":
            self.inside_label += 1
            if a.get("for"):
                self.labelled_ids.add(str(a["for"]))
        elif tag in ("input", "select", "textarea") and a.get("type") != "hidden":
            self.fields.append({**a, "wrapped": "yes" if self.inside_label else None})

    def handle_endtag(self, tag: str) -> None:
        if tag == "label":
            self.inside_label -= 1

    def unlabelled(self, html: str) -> list[dict[str, str | None]]:
        self.feed(html)
        return [
            f for f in self.fields
            if not (f.get("wrapped") or f.get("aria-label") or (f.get("id") or "") in self.labelled_ids)
        ]  # fmt: skip
