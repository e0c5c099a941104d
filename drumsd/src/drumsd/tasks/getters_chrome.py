"""OSWorld's active-tab getters over Chromium's DevTools instead of the accessibility tree and
Playwright: the active tab's URL, its title and HTML, values picked from its DOM, its URL parsed.

OSWorld reads the address bar's text from the a11y tree (the URL as the omnibox shows it: no
`https://`, no `www.`) and prefixes the task's `goto_prefix`; drums takes the URL of the most
recently active page target (DevTools lists page targets newest-activated first) and rebuilds the
same text. The DOM is read by a small stdlib CDP client run inside the slot (the DevTools port
listens on the slot's loopback only): one `Runtime.evaluate` in the tab, nothing navigates.
"""

from __future__ import annotations

import itertools
import json
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from .getters import GetterEnv, GetterError, _profile_json, getter, run_python

# argv: port, then "-" (only the tab list) or a JS expression evaluated in the first page whose
# URL equals the given one after normalisation ("" = the active page). Prints one JSON object.
CDP_SCRIPT = r"""
import base64, json, os, socket, struct, sys, urllib.parse, urllib.request
port, expression, want = sys.argv[1], sys.argv[2], sys.argv[3]
with urllib.request.urlopen("http://127.0.0.1:%s/json/list" % port, timeout=10) as r:
    pages = [t for t in json.load(r) if t.get("type") == "page"]
if not pages:
    print(json.dumps({"pages": []})); sys.exit(0)
norm = lambda u: urllib.parse.unquote(u).rstrip("/")
target = pages[0] if not want else next((p for p in pages if norm(p["url"]) == norm(want)), None)
out = {"pages": [{"url": p.get("url", ""), "title": p.get("title", "")} for p in pages]}
if target is None or expression == "-":
    print(json.dumps(out)); sys.exit(0)
ws = urllib.parse.urlparse(target["webSocketDebuggerUrl"])
sock = socket.create_connection((ws.hostname, ws.port), timeout=20)
key = base64.b64encode(os.urandom(16)).decode()
sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
              % (ws.path, ws.hostname, ws.port, key)).encode())
buf = b""
while b"\r\n\r\n" not in buf:
    chunk = sock.recv(4096)
    if not chunk: raise SystemExit("DevTools closed the websocket handshake")
    buf += chunk
head, buf = buf.split(b"\r\n\r\n", 1)
if b" 101 " not in head.split(b"\r\n", 1)[0]:
    raise SystemExit("DevTools refused the websocket: %r" % head[:200])
def need(n):
    global buf
    while len(buf) < n:
        chunk = sock.recv(65536)
        if not chunk: raise SystemExit("DevTools closed the websocket")
        buf += chunk
    data, buf = buf[:n], buf[n:]
    return data
def send(obj):
    payload = json.dumps(obj).encode()
    n = len(payload)
    head = struct.pack("!B", 0x81) + (struct.pack("!B", 0x80 | n) if n < 126 else
        struct.pack("!BH", 0x80 | 126, n) if n < 65536 else struct.pack("!BQ", 0x80 | 127, n))
    mask = os.urandom(4)
    sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
def receive():
    message = b""
    while True:
        b0, b1 = need(2)
        n = b1 & 0x7F
        if n == 126: n = struct.unpack("!H", need(2))[0]
        elif n == 127: n = struct.unpack("!Q", need(8))[0]
        mask = need(4) if b1 & 0x80 else None
        data = need(n)
        if mask: data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        if b0 & 0x0F in (0x1, 0x0): message += data
        if b0 & 0x80 and b0 & 0x0F in (0x1, 0x0): return json.loads(message)
send({"id": 1, "method": "Runtime.evaluate",
      "params": {"expression": expression, "returnByValue": True, "awaitPromise": True}})
while True:
    reply = receive()
    if reply.get("id") == 1: break
result = reply.get("result", {})
if "exceptionDetails" in result:
    raise SystemExit("the page's script failed: %s" % json.dumps(result["exceptionDetails"])[:500])
out["url"], out["title"] = target.get("url", ""), target.get("title", "")
out["value"] = result.get("result", {}).get("value")
print(json.dumps(out))
"""


def omnibox_text(url: str) -> str:
    """The address bar's text for a URL, as Chrome shows it by default (the a11y tree's value):
    the http(s) scheme and a leading `www.` hidden, a bare `/` path dropped."""
    for scheme in ("https://", "http://"):
        if url.startswith(scheme):
            rest = url[len(scheme) :]
            rest = rest.removeprefix("www.")
            host, slash, path = rest.partition("/")
            return host if slash and not path else rest
    return url


def normalized(url: str) -> str:
    return unquote(url).rstrip("/")


async def _devtools(env: GetterEnv, expression: str = "-", want: str = "") -> dict[str, Any]:
    args = [str(env.ctx.devtools_port), expression, want]
    rc, out, err = await run_python(env, CDP_SCRIPT, args)
    if rc != 0:
        raise GetterError(
            f"Chromium's DevTools (port {env.ctx.devtools_port}) did not answer in the slot: "
            f"{err.strip()[-400:]}"
        )
    try:
        answer = json.loads(out)
    except ValueError as exc:
        raise GetterError(f"the DevTools reader printed no JSON: {out[-200:]!r}") from exc
    return answer if isinstance(answer, dict) else {}


async def active_url(config: dict[str, Any], env: GetterEnv) -> str | None:
    """OSWorld's get_active_url_from_accessTree: goto_prefix + the active tab's address text."""
    pages = (await _devtools(env)).get("pages", [])
    if not pages:
        return None
    return f"{config.get('goto_prefix', 'https://')}{omnibox_text(pages[0]['url'])}"


@getter("active_url_from_accessTree")
async def active_url_from_access_tree(config: dict[str, Any], env: GetterEnv) -> Any:
    return await active_url(config, env)


async def _in_active_tab(config: dict[str, Any], env: GetterEnv, expression: str) -> Any:
    """Evaluate in the tab whose URL is the active URL (OSWorld looks the page up by the URL it
    built, so a wrong goto_prefix finds no tab): (value, url, title), or None: no such tab."""
    url = await active_url(config, env)
    if url is None:
        return None
    answer = await _devtools(env, expression, url)
    if "value" not in answer:
        return None
    return answer


_PAGE_INFO_JS = (
    "({title: document.title, url: location.href, content: (document.doctype ? "
    "new XMLSerializer().serializeToString(document.doctype) : '') + "
    "document.documentElement.outerHTML})"
)


@getter("active_tab_info")
async def active_tab_info(config: dict[str, Any], env: GetterEnv) -> Any:
    # OSWorld opens the URL again in a new page and reads that; drums reads the tab as it is.
    answer = await _in_active_tab(config, env, _PAGE_INFO_JS)
    if answer is None:
        return {} if await active_url(config, env) else None
    return answer["value"]


# OSWorld's categories of active_tab_html_parse, run in the page (Playwright's text_content is
# textContent, input_value is .value, `text=` finds the smallest element containing the text).
_HTML_PARSE_JS = r"""
((config) => {
  const out = {};
  const texts = (sel) => { try { return Array.from(document.querySelectorAll(sel))
      .map((e) => (e.textContent || '').trim()); } catch (e) { return []; } };
  const byXpath = (xp) => { try { return document.evaluate(xp, document, null,
      XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue; } catch (e) { return null; } };
  const pick = (obj, get) => { for (const [cls, keys] of Object.entries(obj || {})) {
      const found = get('.' + cls);
      for (const [i, key] of Object.entries(keys))
        out[key] = found.length > +i ? found[+i] : ''; } };
  const cat = config.category;
  if (cat === 'class') {
    pick(config.class_multiObject, texts);
    pick(config.class_multiObject_child, (sel) => { const e = document.querySelector(sel);
      return e ? Array.from(e.childNodes).filter((n) => n.nodeType === 3)
        .map((n) => n.textContent.trim()).filter(Boolean) : []; });
    pick(config.class_multiObject_only_child, (sel) => Array.from(document.querySelectorAll(sel))
      .map((e) => e.querySelector('h3')).filter(Boolean).map((h) => (h.textContent || '').trim()));
    for (const [cls, wanted] of Object.entries(config.class_multiObject_search_exist || {})) {
      const found = texts('.' + cls);
      for (const w of wanted) if (w !== 'is_other_exist') out[w] = found.includes(w);
      if (wanted.includes('is_other_exist'))
        out.is_other_exist = found.some((t) => !wanted.includes(t));
    }
    for (const [cls, key] of Object.entries(config.class_singleObject || {})) {
      const found = texts('.' + cls); out[key] = found.length ? found[0] : ''; }
  } else if (cat === 'label') {
    for (const [label, key] of Object.entries(config.labelObject || {})) {
      const needle = label.toLowerCase();
      const has = (e) => (e.textContent || '').toLowerCase().includes(needle);
      const best = Array.from(document.body ? document.body.querySelectorAll('*') : [])
        .find((e) => has(e) && !Array.from(e.children).some(has));
      out[key] = best ? (best.textContent || '').trim() : '';
    }
  } else if (cat === 'xpath') {
    for (const [xp, key] of Object.entries(config.xpathObject || {})) {
      const e = byXpath(xp); out[key] = e ? (e.textContent || '').trim() : ''; }
  } else if (cat === 'input') {
    for (const [xp, key] of Object.entries(config.inputObject || {})) {
      const e = byXpath(xp); out[key] = e && e.value != null ? String(e.value).trim() : ''; }
  } else if (cat === 'class&url') {
    const lists = [[config.class_multiObject, texts], [config.class_multiObject_li, (sel) =>
      Array.from(document.querySelectorAll(sel + ' li.catAllProducts')).map((li) =>
        li.querySelector('span')).filter(Boolean).map((s) => (s.innerText || '').trim())]];
    for (const [obj, get] of lists) for (const [cls, wanted] of Object.entries(obj || {})) {
      const found = get('.' + cls);
      const low = (s) => s.toLowerCase();
      for (const w of wanted) if (found.some((t) => low(t) === low(w))) out[low(w)] = true;
      if (found.some((t) => wanted.every((w) => !low(w).includes(low(t)))))
        out.is_other_exist = true;
      if (!('is_other_exist' in out)) out.is_other_exist = false;
    }
    const url = location.href.toLowerCase();
    for (const k of config.url_include_expected || [])
      if (!(k.toLowerCase() in out)) out[k.toLowerCase()] = url.includes(k.toLowerCase());
    for (const [k, v] of Object.entries(config.url_include_expected_multichoice || {}))
      if (!(v.toLowerCase() in out)) out[v.toLowerCase()] = url.includes(k.toLowerCase());
  }
  return out;
})
"""


@getter("active_tab_html_parse")
async def active_tab_html_parse(config: dict[str, Any], env: GetterEnv) -> Any:
    if config.get("category") not in ("class", "label", "xpath", "input", "class&url"):
        raise GetterError(
            f"active_tab_html_parse: unknown category {config.get('category')!r} "
            "(OSWorld's are class, label, xpath, input, class&url)"
        )
    keys = ("category", "class_multiObject", "class_multiObject_child", "labelObject",
            "class_multiObject_only_child", "class_multiObject_search_exist", "inputObject",
            "class_singleObject", "xpathObject", "class_multiObject_li", "url_include_expected",
            "url_include_expected_multichoice")  # fmt: skip
    wanted = {k: config[k] for k in keys if k in config}
    answer = await _in_active_tab(config, env, f"({_HTML_PARSE_JS})({json.dumps(wanted)})")
    if answer is None:
        return {} if await active_url(config, env) else None
    return answer["value"]


def macys_url_fields(url: str, parse_keys: list[str]) -> dict[str, Any]:
    """OSWorld's get_url_path_parse (its Macy's product-URL parser): flags and the `k1,k2/v1,v2`
    key-value pair segments of the path."""
    path = unquote(urlparse(url).path)
    parts = path.strip("/").split("/")
    pairs: dict[str, Any] = {}
    shirts, short_sleeve = "shirts" in path, "short-sleeve" in path
    for here, after in itertools.pairwise(parts):
        if "," in here and "," in after:
            for key, value in zip(
                (k.strip() for k in here.split(",")),
                (v.strip() for v in after.split(",")),
                strict=False,
            ):
                if key == "Price_discount_range":
                    pairs[key] = [item.strip() for item in value.split("|")] if value else None
                else:
                    pairs[key] = value or None
                shirts |= key == "Product_department" and value in ("shirts", "Shirts", "Shirt")
                short_sleeve |= key == "Sleeve_length" and value in ("short-sleeve", "Short Sleeve")
            break
    for key in ("Men_regular_size_t", "Price_discount_range"):
        pairs.setdefault(key, None)
    result: dict[str, Any] = {
        "mens_clothing": True if "mens-clothing" in path else None,
        "shirts": True if shirts else None,
        "short_sleeve": True if short_sleeve else None,
    }
    for key in parse_keys:
        if key not in pairs:
            continue
        if key == "Price_discount_range":
            ranges = pairs[key]
            only_50 = (
                ranges is not None
                and "50_PERCENT_ off & more" in ranges
                and "30_PERCENT_ off & more" not in ranges
                and "20_PERCENT_ off & more" not in ranges
            )
            result[key] = "50_PERCENT_ off & more" if only_50 else "not_50_PERCENT_ off & more"
        else:
            result[key] = pairs[key]
    return result


@getter("url_path_parse")
async def url_path_parse(config: dict[str, Any], env: GetterEnv) -> Any:
    url = await active_url(config, env)
    return None if url is None else macys_url_fields(url, list(config.get("parse_keys", [])))


def query_fields(url: str, config: dict[str, Any]) -> dict[str, Any]:
    """OSWorld's get_active_tab_url_parse: the named query parameters (renamed, split)."""
    query = parse_qs(urlparse(url).query)
    fields: dict[str, Any] = {key: query.get(key, [""])[0] for key in config["parse_keys"]}
    for old, new in config.get("replace", {}).items():
        fields[new] = fields.pop(old)
    if config.get("split_list"):
        fields = {key: value.split(",") for key, value in fields.items()}
    return fields


@getter("active_tab_url_parse")
async def active_tab_url_parse(config: dict[str, Any], env: GetterEnv) -> Any:
    url = await active_url(config, env)
    return None if url is None else query_fields(url, config)


def url_dash_part(url: str, config: dict[str, Any]) -> Any:
    """OSWorld's get_url_dashPart: one `/`-separated part of the URL (its query dropped with
    needDeleteId), as a string or {key: part}; None when the index is out of range."""
    parts = url.split("/")
    index = int(config["partIndex"])
    if index >= len(parts):
        return None
    part = parts[index].split("?")[0] if config.get("needDeleteId") else parts[index]
    if config["returnType"] == "string":
        return part
    if config["returnType"] == "json":
        return {config["key"]: part}
    raise GetterError(
        f"url_dashPart: returnType must be 'string' or 'json', not {config['returnType']!r}"
    )


@getter("url_dashPart")
async def url_dash_part_getter(config: dict[str, Any], env: GetterEnv) -> Any:
    url = await active_url(config, env)
    return None if url is None else url_dash_part(url, config)


def color_scheme(preferences: Any) -> str:
    """Chrome's appearance mode from its Preferences: "light", "dark" or "system" (OSWorld's
    get_chrome_color_scheme, which its settings-page reader falls back to)."""
    if not isinstance(preferences, dict):
        return "system"
    theme = preferences.get("browser", {}).get("theme", {})
    raw = theme.get("color_scheme2", theme.get("color_scheme"))
    names = {"system": "system", "default": "system", "0": "system", "light": "light", "1": "light",
             "dark": "dark", "2": "dark"}  # fmt: skip
    mode = names.get(raw.strip().lower()) if isinstance(raw, str) else None
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        mode = {0: "system", 1: "light", 2: "dark"}.get(int(raw))
    if preferences.get("extensions", {}).get("theme", {}).get("system_theme") in (0, "0", False):
        return "light"
    return mode or "system"


@getter("chrome_appearance_mode_ui")
async def chrome_appearance_mode_ui(config: dict[str, Any], env: GetterEnv) -> str:
    # OSWorld reads chrome://settings/appearance and falls back to the Preferences file; the
    # settings page shows what Preferences holds, so drums reads the file.
    return color_scheme(await _profile_json(env, "Default", "Preferences"))
