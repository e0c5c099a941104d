"""Chromium families: read a seeded local page and report what it says, or print it to PDF.

Answers go to a text file; the oracle writes it from a shell as an agent with a terminal would
(what the oracle proves is that the checker accepts the right answer in the desktop, not that
a model can read the page). Printing uses Chromium's own headless --print-to-pdf.
"""

from __future__ import annotations

import random
from html import escape
from typing import Any

from ..actions import HEADLESS_TIMEOUT_S, Action, execute, shell, wait
from ..spec import Solution, TaskSpec, sha256
from . import content
from .registry import family
from .writer import pdf_of

DOCS = "/home/user/Documents"
DESKTOP = "/home/user/Desktop"
ANSWER = f"{DESKTOP}/answer.txt"
CHROMIUM = ["chromium", "--no-sandbox", "--disable-gpu", "--no-first-run", "--password-store=basic"]


def page(title: str, h1: str, body: str) -> bytes:
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em} td,th{border:1px solid #999;"
        "padding:4px 10px}</style></head>\n"
        f"<body><h1>{escape(h1)}</h1>\n{body}\n</body></html>\n"
    ).encode()


def table_html(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>\n" for r in rows)
    return f"<table><tr>{head}</tr>\n{body}</table>"


def answer(name: str, text: str, path: str = ANSWER, why: str = "") -> Solution:
    q = text.replace("'", "'\\''")
    return Solution(
        name,
        [shell(f"printf '%s\\n' '{q}' > '{path}'")],
        lambda _i: {path: (text + "\n").encode()},
        why,
    )


def source_answer(source_type: str, source: bytes, question: dict[str, Any]) -> dict[str, Any]:
    """Options of `answer_from_source`: the answer file is judged against what `question` asks
    of the seeded `source`, read back from the desktop; the answer itself is in no option."""
    return {
        "file": "answer.txt",
        "source": f"source.{source_type}",
        "source_type": source_type,
        "source_sha256": sha256(source),
        "question": question,
    }


def chromium_spec(
    rng: random.Random,
    instruction: str,
    html_path: str,
    html: bytes,
    question: dict[str, Any],
    oracle: Solution,
    near: list[Solution],
    extra_files: dict[str, bytes] | None = None,
) -> TaskSpec:
    decoy = f"{DOCS}/README.txt"
    return TaskSpec(
        family="",
        app="chrome",
        instruction=instruction,
        files={
            html_path: html,
            decoy: ("Saved pages.\n" + content.sentence(rng) + "\n").encode(),
            **(extra_files or {}),
        },
        launch=[
            {"type": "launch", "parameters": {"command": [*CHROMIUM, f"file://{html_path}"]}},
            {"type": "sleep", "parameters": {"seconds": 4}},
        ],
        results=[(ANSWER, "answer.txt"), (html_path, "source.html")],
        check="answer_from_source",
        check_alt="answer_from_source_raw",
        options=source_answer("html", html, question),
        roots=[DOCS, DESKTOP],
        allow=[ANSWER],
        oracle=oracle,
        near_misses=near,
        decoy=decoy,
        related_apps=["chrome", "os"],
        dirs=[DESKTOP],  # the answer's folder: an image need not have ~/Desktop
    )


def _html_path(rng: random.Random) -> str:
    return (
        f"{DOCS}/{content.filename(rng, ['catalog', 'status', 'price_list', 'overview'], 'html')}"
    )


def _write_hint() -> str:
    return f"Write only the answer into {ANSWER} (create the file)."


@family("chrome_table_lookup", "chrome")
def table_lookup(rng: random.Random) -> TaskSpec:
    n = rng.randint(5, 9)
    items = content.pick(rng, content.ITEMS, n)
    prices = [f"{rng.randint(1, 300)}.{rng.randint(0, 99):02d}" for _ in items]
    stock = [str(rng.randint(0, 80)) for _ in items]
    k = rng.randint(0, n - 2)
    path = _html_path(rng)
    html = page(
        "Price list",
        "Price list",
        table_html(
            ["Item", "Price (USD)", "In stock"],
            [[i, p, s] for i, p, s in zip(items, prices, stock, strict=False)],
        ),
    )
    want = prices[k]
    instr = (
        f"The page open in Chromium ({path}) lists prices. What is the price of {items[k]}? "
        f"{_write_hint()} Give the number with two decimals and no currency sign."
    )
    near = [
        answer("next_row", prices[k + 1], why="price of the next item"),
        answer("currency_sign", f"${want}", why="right value, wrong format"),
        answer("stock_instead", stock[k], why="the stock column"),
        answer("wrong_folder", want, f"{DOCS}/answer.txt", why="answer saved in Documents"),
    ]
    near = [
        s
        for s in near
        if s.name == "wrong_folder" or s.simulate({})[ANSWER] != f"{want}\n".encode()
    ]
    question = {"kind": "table_cell", "key": items[k], "column": 1}
    return chromium_spec(rng, instr, path, html, question, answer("oracle", want), near)


@family("chrome_count_status", "chrome")
def count_status(rng: random.Random) -> TaskSpec:
    n = rng.randint(8, 14)
    statuses = [rng.choice(["open", "closed", "waiting"]) for _ in range(n)]
    if "open" not in statuses:
        statuses[0] = "open"
    rows = [[f"T-{100 + i}", rng.choice(content.PEOPLE), s] for i, s in enumerate(statuses)]
    path = _html_path(rng)
    html = page("Tickets", "Ticket status", table_html(["Ticket", "Owner", "Status"], rows))
    want = statuses.count("open")
    instr = f"How many tickets on the page open in Chromium have the status 'open'? {_write_hint()}"
    cands = [
        ("one_more", want + 1),
        ("one_less", want - 1),
        ("all_tickets", n),
        ("closed_count", statuses.count("closed")),
    ]
    near = [answer(nm, str(v), why=nm.replace("_", " ")) for nm, v in cands if v != want]
    question = {"kind": "table_count", "column": 2, "equals": "open"}
    return chromium_spec(rng, instr, path, html, question, answer("oracle", str(want)), near[:4])


@family("chrome_heading_text", "chrome")
def heading_text(rng: random.Random) -> TaskSpec:
    topic = rng.choice(content.TOPICS)
    h1 = f"{topic.capitalize()}: {rng.choice(['status', 'timeline', 'contacts', 'budget'])}"
    title = f"Intranet - {rng.choice(content.REGIONS)} office"
    h2s = content.pick(rng, ["Overview", "Details", "History", "Next steps", "Contacts"], 2)
    body = "".join(f"<h2>{h}</h2><p>{escape(content.sentence(rng))}</p>" for h in h2s)
    path = _html_path(rng)
    html = page(title, h1, body)
    instr = (
        "Copy the main heading (the big headline at the top) of the page open in Chromium, "
        f"exactly as shown. {_write_hint()}"
    )
    near = [
        answer("tab_title", title, why="the window title"),
        answer("first_subheading", h2s[0], why="a sub-heading"),
        answer("lowercase", h1.lower(), why="wrong case"),
    ]
    return chromium_spec(rng, instr, path, html, {"kind": "heading"}, answer("oracle", h1), near)


@family("chrome_sum_column", "chrome")
def sum_column(rng: random.Random) -> TaskSpec:
    n = rng.randint(4, 8)
    people = content.pick(rng, content.PEOPLE, n)
    hours = [rng.randint(1, 45) for _ in people]
    path = _html_path(rng)
    html = page(
        "Timesheet",
        "Weekly timesheet",
        table_html(["Name", "Hours"], [[p, str(h)] for p, h in zip(people, hours, strict=False)]),
    )
    want = sum(hours)
    instr = f"What is the total of the Hours column on the page open in Chromium? {_write_hint()}"
    cands = [
        ("without_last", sum(hours[:-1])),
        ("largest", max(hours)),
        ("average", round(want / n, 2)),
        ("count", n),
    ]
    near = [answer(nm, str(v), why=nm) for nm, v in cands if str(v) != str(want)]
    question = {"kind": "table_sum", "column": 1}
    return chromium_spec(rng, instr, path, html, question, answer("oracle", str(want)), near[:4])


@family("chrome_link_target", "chrome")
def link_target(rng: random.Random) -> TaskSpec:
    labels = content.pick(
        rng,
        [
            "Handbook",
            "Holiday plan",
            "Canteen menu",
            "IT desk",
            "Parking",
            "Travel policy",
            "Phone list",
        ],
        4,
    )
    hosts = ["intranet.example.org", "docs.example.org", "wiki.example.org"]
    urls = [
        f"https://{rng.choice(hosts)}/{lab.lower().replace(' ', '-')}/{rng.randint(10, 99)}"
        for lab in labels
    ]
    k = rng.randint(0, 2)
    links = (
        "<ul>"
        + "".join(
            f'<li><a href="{u}">{escape(lab)}</a></li>'
            for u, lab in zip(urls, labels, strict=False)
        )
        + "</ul>"
    )
    path = _html_path(rng)
    html = page("Links", "Useful links", links)
    instr = (
        f"On the page open in Chromium, which address does the link '{labels[k]}' point to? "
        f"{_write_hint()} Write the full URL."
    )
    near = [
        answer("next_link", urls[k + 1], why="another link"),
        answer("label_text", labels[k], why="the label, not the address"),
        answer("no_scheme", urls[k].split("://", 1)[1], why="URL without https://"),
    ]
    question = {"kind": "link", "label": labels[k]}
    return chromium_spec(rng, instr, path, html, question, answer("oracle", urls[k]), near)


@family("chrome_print_pdf", "chrome")
def print_pdf(rng: random.Random) -> TaskSpec:
    h1 = f"{rng.choice(content.TOPICS).capitalize()} - {rng.choice(content.REGIONS)} edition"
    paras = content.sentences(rng, 3)
    path = _html_path(rng)
    html = page(h1, h1, "".join(f"<p>{escape(p)}</p>" for p in paras))
    other_path = f"{DOCS}/old_{path.rsplit('/', 1)[1]}"
    other_h1 = f"Old notes {rng.randint(100, 999)}"
    other_paras = content.sentences(rng, 2)
    other = page(other_h1, other_h1, "".join(f"<p>{escape(p)}</p>" for p in other_paras))
    out = f"{DESKTOP}/{path.rsplit('/', 1)[1][:-5]}.pdf"

    def printing(src: str, dest: str) -> list[Action]:
        return [
            execute(
                [*CHROMIUM, "--headless", f"--print-to-pdf={dest}", f"file://{src}"],
                HEADLESS_TIMEOUT_S,
            ),
            wait(1.0),
        ]

    oracle = Solution("oracle", printing(path, out), lambda _i: {out: pdf_of([h1, *paras])})
    near = [
        Solution(
            "wrong_folder",
            printing(path, f"{DOCS}/x.pdf"),
            lambda _i: {f"{DOCS}/x.pdf": pdf_of([h1, *paras])},
            "PDF saved in Documents",
        ),
        Solution(
            "other_page",
            printing(other_path, out),
            lambda _i: {out: pdf_of([other_h1, *other_paras])},
            "prints the old page",
        ),
        Solution(
            "html_renamed",
            [execute(["cp", path, out])],
            lambda i: {out: i[path]},
            "copies the HTML under a .pdf name",
        ),
    ]
    instr = f"Save the page open in Chromium as a PDF file at {out}."
    spec = chromium_spec(rng, instr, path, html, {}, oracle, near, {other_path: other})
    spec.results = [(out, "out.pdf")]
    spec.check, spec.check_alt = "pdf_text", "pdf_text_fitz"
    spec.options = {"docs": [{"file": "out.pdf", "contains": [h1, paras[0], paras[-1]]}]}
    spec.allow = [out]
    return spec
