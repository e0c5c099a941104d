// The drums console: the grid of live slots, the slot page and the host panel.
// Plain DOM, no dependencies: it runs on hosts without internet. Every request rides on the
// HttpOnly session cookie; the token is never seen here.
"use strict";

const API = "/console/api";
const GRID_EVERY_MS = 2000; // slot list and thumbnails
const HOST_EVERY_MS = 5000;
const FRAME_EVERY_MS = 250; // the slot page's desktop, a few frames per second
const THUMB_PARALLEL = 4;
// At most this many thumbnails per grid tick, the longest-unrefreshed first: with 200 cards in
// view each refreshes every ~8 s instead of the daemon answering 100 requests a second.
const THUMBS_PER_TICK = 48;

const state = {
  write: false,
  rows: [],
  cards: new Map(), // slot id -> {el, img, etag, visible}
  visible: new Set(),
  slotId: null,
  frameEtag: "",
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

async function getJson(path) {
  const r = await fetch(API + path, { cache: "no-store", credentials: "same-origin" });
  if (r.status === 401) {
    location.href = "/console/login";
    throw new Error("session ended");
  }
  const body = await r.json();
  if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
  return body;
}

// A picture through the browser's cache: If-None-Match is sent for us and a 304 comes back as
// the cached image; the ETag tells whether the screen changed (then, and only then, redraw).
async function fetchPicture(path, lastEtag) {
  const r = await fetch(API + path, { cache: "no-cache", credentials: "same-origin" });
  if (!r.ok) return null;
  const etag = r.headers.get("ETag") || "";
  if (etag && etag === lastEtag) return { etag, url: null };
  return { etag, url: URL.createObjectURL(await r.blob()) };
}

function age(s) {
  if (s === null || s === undefined) return "-";
  if (s < 90) return `${Math.round(s)}s`;
  if (s < 5400) return `${Math.round(s / 60)}m`;
  return `${(s / 3600).toFixed(1)}h`;
}

// --- grid --------------------------------------------------------------------------------

const observer = new IntersectionObserver((entries) => {
  for (const e of entries) {
    const id = e.target.dataset.slot;
    if (e.isIntersecting) state.visible.add(id);
    else state.visible.delete(id);
  }
});

function filters() {
  const f = {};
  for (const sel of document.querySelectorAll("select[data-facet]")) f[sel.dataset.facet] = sel.value;
  f.text = $("f-text").value.trim().toLowerCase();
  return f;
}

function matches(row, f) {
  for (const k of ["host", "state", "task", "image", "verdict"]) if (f[k] && row[k] !== f[k]) return false;
  if (f.text) {
    const hay = [row.id, row.task, row.image, ...Object.values(row.labels)].join(" ").toLowerCase();
    if (!hay.includes(f.text)) return false;
  }
  return true;
}

function fillFacets(facets) {
  $("f-host-box").hidden = !(facets.host && facets.host.length); // the pool gateway's console
  for (const sel of document.querySelectorAll("select[data-facet]")) {
    const values = facets[sel.dataset.facet] || [];
    const keep = sel.value;
    const want = ["", ...values];
    if (keep && !want.includes(keep)) want.push(keep);
    const have = [...sel.options].map((o) => o.value);
    if (have.join("\n") === want.join("\n")) continue;
    sel.replaceChildren(...want.map((v) => el("option", { value: v, text: v || "all" })));
    sel.value = keep;
  }
}

function gateLights(gates) {
  const box = el("span", { class: "lights" });
  for (const [name, status] of Object.entries(gates)) {
    box.append(el("i", { class: `light ${status}`, title: `${name}: ${status}` }));
  }
  return box;
}

function makeCard(row) {
  const img = el("img", { class: "thumb", alt: `desktop of ${row.id}` });
  const card = el("a", { class: "card", href: `#/slot/${row.id}`, "data-slot": row.id });
  card.append(el("div", { class: "thumb-box" }, img), el("div", { class: "meta" }));
  observer.observe(card);
  return { el: card, img, etag: "", fetchedAt: 0 };
}

function fillCard(card, row) {
  const meta = card.el.querySelector(".meta");
  const flags = row.audit_flags.length ? row.audit_flags.join(", ") : "";
  meta.replaceChildren(
    el("div", { class: "line" },
      el("b", { text: row.id }),
      el("span", { class: `badge state-${row.state}`, text: row.state }),
      el("span", { class: `badge verdict-${row.verdict}`, text: row.verdict })),
    el("div", { class: "line" },
      el("span", { text: row.task || "(no task)" }),
      el("span", { text: `ep ${row.episode}` }),
      el("span", { text: `age ${age(row.age_s)}` }),
      el("span", { text: `lease ${age(row.lease_s)}` })),
    el("div", { class: "line" }, gateLights(row.gates),
      el("span", { class: "flags", text: flags })),
  );
  card.el.dataset.verdict = row.verdict;
  card.el.dataset.state = row.state;
  card.el.title = row.quarantine_reason || "";
}

function renderGrid() {
  const f = filters();
  const grid = $("grid");
  const wanted = [];
  for (const row of state.rows) {
    let card = state.cards.get(row.id);
    if (!card) {
      card = makeCard(row);
      state.cards.set(row.id, card);
    }
    fillCard(card, row);
    card.el.hidden = !matches(row, f);
    if (!card.el.hidden) wanted.push(card.el);
  }
  const live = new Set(state.rows.map((r) => r.id));
  for (const [id, card] of state.cards) {
    if (!live.has(id)) {
      observer.unobserve(card.el);
      card.el.remove();
      if (card.img.src) URL.revokeObjectURL(card.img.src);
      state.cards.delete(id);
      state.visible.delete(id);
    }
  }
  // Append in order only when the order changed (a re-append of 500 nodes every tick is waste).
  const current = [...grid.children];
  const all = state.rows.map((r) => state.cards.get(r.id).el);
  if (current.length !== all.length || current.some((n, i) => n !== all[i])) grid.replaceChildren(...all);
  $("shown").textContent = `${wanted.length} of ${state.rows.length} shown`;
}

async function refreshThumbs() {
  const ids = [...state.visible]
    .filter((id) => {
      const c = state.cards.get(id);
      return c && !c.el.hidden;
    })
    .sort((a, b) => state.cards.get(a).fetchedAt - state.cards.get(b).fetchedAt)
    .slice(0, THUMBS_PER_TICK);
  let next = 0;
  async function worker() {
    while (next < ids.length) {
      const card = state.cards.get(ids[next++]);
      if (!card) continue;
      card.fetchedAt = performance.now();
      const pic = await fetchPicture(`/slots/${card.el.dataset.slot}/thumbnail`, card.etag).catch(() => null);
      if (!pic || !pic.url) continue;
      const old = card.img.src;
      card.img.src = pic.url;
      card.img.dataset.etag = pic.etag;
      card.etag = pic.etag;
      if (old) URL.revokeObjectURL(old);
    }
  }
  await Promise.all(Array.from({ length: THUMB_PARALLEL }, worker));
}

async function gridTick() {
  if (document.hidden || state.slotId || state.elsewhere) return;
  const body = await getJson("/slots");
  state.rows = body.slots;
  fillFacets(body.facets);
  renderGrid();
  const n = state.rows.length;
  const q = state.rows.filter((r) => r.state === "quarantined").length;
  $("summary").textContent = `${n} live slots` + (q ? `, ${q} quarantined` : "");
  await refreshThumbs();
}

// --- host panel --------------------------------------------------------------------------

function kv(title, pairs) {
  const dl = el("dl");
  for (const [k, v] of pairs) dl.append(el("dt", { text: k }), el("dd", { text: String(v) }));
  return el("div", { class: "panel" }, el("h3", { text: title }), dl);
}

function bars(title, counts) {
  const box = el("div", { class: "panel" }, el("h3", { text: title }));
  const entries = Object.entries(counts || {});
  const max = Math.max(1, ...entries.map(([, v]) => v));
  if (!entries.length) box.append(el("p", { class: "note", text: "none in this window" }));
  for (const [k, v] of entries) {
    const bar = el("span", { class: "bar" });
    bar.style.width = `${Math.round((100 * v) / max)}%`;
    box.append(el("div", { class: "bar-row" }, el("span", { text: k }), bar, el("span", { text: String(v) })));
  }
  return box;
}

// --- charts: the daemon's host history (a sample every few seconds, the last hour) ------------

const SVG = "http://www.w3.org/2000/svg";
const CHARTS = [
  { title: "Live slots", unit: "", series: [["slots", "live"], ["quarantined", "quarantined"]] },
  { title: "Restores / s", unit: "/s", series: [["restores_per_s", "create+reset+fork"]] },
  { title: "Steps / s", unit: "/s", series: [["steps_per_s", "steps"]] },
  { title: "Memory available", unit: " MiB", series: [["mem_available_mib", "available"]] },
  { title: "KSM saved", unit: " MiB", series: [["ksm_saved_mib", "saved"]] },
  { title: "Spares parked", unit: "", series: [["spares_parked", "parked"]] },
];

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function num(v, unit) {
  if (v === null || v === undefined) return "-";
  const r = Math.abs(v) >= 100 ? Math.round(v) : +v.toFixed(2);
  return `${r}${unit}`;
}

// One small line chart: a polyline per series over the samples' time span, y from 0 to max.
function chart(spec, samples) {
  const W = 240, H = 70;
  const box = el("div", { class: "panel chart", "data-chart": spec.series[0][0] });
  const t0 = samples.length ? samples[0].ts : 0;
  const t1 = samples.length ? samples[samples.length - 1].ts : 1;
  const values = samples.flatMap((s) => spec.series.map(([k]) => s[k]).filter((v) => v !== null && v !== undefined));
  const max = Math.max(1e-9, ...values);
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
  plot.append(svg("line", { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: "axis" }));
  spec.series.forEach(([key], i) => {
    const pts = samples.filter((s) => s[key] !== null && s[key] !== undefined).map((s) => {
      const x = t1 > t0 ? ((s.ts - t0) / (t1 - t0)) * W : W;
      return `${x.toFixed(1)},${(H - 2 - (s[key] / max) * (H - 6)).toFixed(1)}`;
    });
    if (pts.length) plot.append(svg("polyline", { points: pts.join(" "), class: `series s${i}`, "data-key": key }));
  });
  const last = samples.length ? samples[samples.length - 1] : {};
  const legend = el("div", { class: "legend" });
  spec.series.forEach(([key, label], i) => legend.append(
    el("span", { class: `key s${i}`, text: `${label} ${num(last[key], spec.unit)}` })));
  const span = samples.length > 1 ? age(t1 - t0) : "-";
  box.append(el("h3", { text: spec.title }), plot, legend,
    el("div", { class: "note", text: `max ${num(values.length ? max : null, spec.unit)} · last ${span} · ${samples.length} samples` }));
  return box;
}

// Only samples newer than the last one held are asked for: the hour's buffer is sent once.
const history = { samples: [], size: 720 };

async function chartsTick() {
  const last = history.samples.length ? history.samples[history.samples.length - 1].ts : null;
  const body = await getJson(last === null ? "/history" : `/history?since=${last}`);
  history.size = body.size || history.size;
  history.samples.push(...body.samples);
  if (history.samples.length > history.size) history.samples.splice(0, history.samples.length - history.size);
  $("charts").replaceChildren(...CHARTS.map((c) => chart(c, history.samples)));
}

const mib = (v) => (v === null || v === undefined ? "-" : `${Math.round(v)} MiB`);

async function hostTick() {
  if (document.hidden || state.slotId || state.elsewhere) return;
  chartsTick().catch(() => {});
  const { health, metrics } = await getJson("/host");
  const a = health.admission;
  const cps = health.checkpoints;
  const templates = cps.filter((c) => c.kind === "template");
  const spares = (health.pools && health.pools.spares) || {};
  const ksm = health.ksm || {};
  const lat = Object.entries(metrics.latencies).map(([k, s]) => [
    k, `p50 ${fmtS(s.p50)} · p99 ${fmtS(s.p99)} · n ${s.count}`,
  ]);
  $("host").replaceChildren(
    kv("Host", [["status", health.status], ["version", health.version], ["profile", health.profile],
      ...Object.entries(health.slots_by_state)], ),
    kv("Admission", [["admitting", a.admitting ? "yes" : `no: ${a.reason}`],
      ["memory available", mib(a.mem_available_mib)], ["memory total", mib(a.mem_total_mib)],
      ["one more slot", mib(a.slot_cost_mib)], ["state dir free", mib(a.state_free_mib)],
      ["memory PSI avg10", a.psi_memory_some_avg10 ?? "-"]]),
    kv("Templates", templates.length ? templates.map((t) => [t.image || t.id, mib(t.size_mib)])
      : Object.entries((health.pools && health.pools.templates) || {})),
    kv("Checkpoints", [["count", cps.length],
      ["saved / prefork", `${cps.filter((c) => c.kind !== "template").length}`],
      ["total size", mib(cps.reduce((s, c) => s + c.size_mib, 0))]]),
    kv("Spares", flat(spares)),
    kv("KSM", Object.keys(ksm).length ? flat(ksm) : [["", "not offered by this runtime"]]),
    kv("Crash watch", flat(health.crash_watch)),
    kv("Latency (this window)", lat.length ? lat : [["", "no operations yet"]]),
    bars("Episodes by verdict", metrics.episodes_by_verdict),
    bars("Failures by class", metrics.failures_by_class),
    kv("Cost", flat(metrics.cost)),
    kv("Warnings", health.warnings.length ? health.warnings.map((w, i) => [i + 1, w]) : [["", "none"]]),
  );
}

function fmtS(v) {
  return v === null || v === undefined ? "-" : v < 1 ? `${Math.round(v * 1000)}ms` : `${v.toFixed(2)}s`;
}

function flat(obj, prefix = "") {
  const out = [];
  for (const [k, v] of Object.entries(obj || {})) {
    if (v && typeof v === "object" && !Array.isArray(v)) out.push(...flat(v, `${prefix}${k}.`));
    else out.push([prefix + k, Array.isArray(v) ? v.join(", ") : typeof v === "number" ? +v.toFixed(3) : v]);
  }
  return out.slice(0, 24);
}

// --- slot page ---------------------------------------------------------------------------

async function slotTick() {
  if (!state.slotId || document.hidden) return;
  let body;
  try {
    body = await getJson(`/slots/${state.slotId}`);
  } catch (e) {
    $("slot-title").textContent = `${state.slotId}: ${e.message}`;
    return;
  }
  const row = body.slot;
  $("slot-title").textContent = `${row.id} · ${row.state}` + (row.verdict !== row.state ? ` · ${row.verdict}` : "");
  const facts = [["task", row.task || "-"], ["image", row.image], ["profile", row.profile],
    ["episode", `${row.episode} (${row.episode_id})`], ["actions", row.actions],
    ["age", age(row.age_s)], ["episode age", age(row.episode_age_s)], ["idle", age(row.idle_s)],
    ["lease left", age(row.lease_s)], ["quarantine", row.quarantine_reason || "-"],
    ["failed gates", row.failed_gates.join(", ") || "-"]];
  $("slot-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v) })]));
  const tbody = $("gates").querySelector("tbody");
  const order = { fail: 0, pending: 1, pass: 2 }; // failures first: what the operator came for
  const gates = [...body.gates.gates].sort((a, b) => order[a.status] - order[b.status]);
  tbody.replaceChildren(...gates.map((g) => el("tr", { "data-gate": g.name, class: `gate-${g.status}` },
    el("td", { text: g.name }),
    el("td", {}, el("i", { class: `light ${g.status}` }), ` ${g.status}`),
    el("td", { text: g.checked_at ? new Date(g.checked_at).toLocaleTimeString() : "-" }),
    el("td", {}, el("pre", { text: JSON.stringify(g.evidence, null, 1) })))));
  const lat = Object.entries(body.latencies || {});
  $("slot-latency").replaceChildren(...(lat.length ? lat : [["", null]]).flatMap(([k, l]) => [
    el("dt", { text: k }),
    el("dd", { text: l ? `p50 ${fmtS(l.p50)} · p99 ${fmtS(l.p99)} · max ${fmtS(l.max)} · n ${l.count}` : "no operations yet" })]));
  const v = body.verify;
  $("verify").replaceChildren(v
    ? el("pre", { text: JSON.stringify({ score: v.score, verdict: v.verdict, valid: v.valid, trusted: v.trusted,
      invalid_reasons: v.invalid_reasons, checker_error: v.checker_error, audit: v.audit }, null, 1) })
    : el("p", { class: "note", text: "not verified in this episode" }));
  for (const b of document.querySelectorAll(".actions button")) b.disabled = !state.write;
  $("act-release").disabled = !state.write || row.state !== "quarantined";
  $("act-quarantine").disabled = !state.write || row.state === "quarantined";
  $("act-note").textContent = state.write ? "" : "read-only session: log in with actions on to act";
}

// An action's outcome stays shown until the next action or slot (the 1 s refresh keeps it).
function showResult(action, ok, message) {
  const box = $("act-result");
  box.className = ok ? "done" : "refused";
  box.dataset.action = action;
  box.textContent = ok ? `${action}: done` : `${action} refused: ${message}`;
}

async function loadTimeline() {
  const id = state.slotId;
  const body = await getJson(`/slots/${id}/timeline`);
  $("timeline").querySelector("tbody").replaceChildren(...body.events.map((e) => el("tr", {},
    el("td", { text: e.ts ? new Date(e.ts * 1000).toLocaleTimeString() : "-" }),
    el("td", { text: e.event }), el("td", { text: e.state ?? "-" }),
    el("td", { text: e.episode ?? "-" }), el("td", { text: e.actions ?? "-" }),
    el("td", { text: e.last_action ?? "-" }))));
}

function episodeRow(e) {
  const at = e.ts ? new Date(e.ts * 1000).toLocaleTimeString() : "-";
  const plus = e.offset_s === null || e.offset_s === undefined ? "-" : `+${fmtS(e.offset_s)}`;
  if (e.kind === "step") {
    const outcome = e.error ? `refused: ${e.error}` : e.returncode !== null && e.returncode !== undefined ? `exit ${e.returncode}` : "ok";
    return el("tr", { class: `ep-step${e.error ? " gate-fail" : ""}`, "data-kind": "step", "data-index": e.index },
      el("td", { text: plus }), el("td", { text: at }), el("td", { text: `step ${e.index}: ${e.action}` }),
      el("td", { text: e.detail }), el("td", { text: fmtS(e.elapsed_s) }), el("td", { text: outcome }));
  }
  if (e.kind === "gate") {
    const after = e.after_step === null || e.after_step === undefined ? "before any step" : `after step ${e.after_step}`;
    return el("tr", { class: `ep-gate gate-${e.status}`, "data-kind": "gate", "data-gate": e.gate },
      el("td", { text: plus }), el("td", { text: at }),
      el("td", {}, el("i", { class: `light ${e.status}` }), ` gate ${e.gate}`),
      el("td", { text: JSON.stringify(e.evidence).slice(0, 160) }), el("td", { text: "" }),
      el("td", { text: `${e.status}, ${after}` }));
  }
  return el("tr", { class: "ep-event", "data-kind": "event", "data-event": e.event },
    el("td", { text: plus }), el("td", { text: at }), el("td", { text: e.event }),
    el("td", { text: "" }), el("td", { text: "" }), el("td", { text: e.state ?? "" }));
}

async function loadEpisode() {
  const body = await getJson(`/slots/${state.slotId}/episode`);
  $("episode").querySelector("tbody").replaceChildren(...body.entries.map(episodeRow));
  const kept = body.steps_kept < body.actions ? ` (${body.steps_kept} of its ${body.actions} steps kept since the daemon started)` : "";
  $("episode-note").textContent = `episode ${body.episode}: ${body.actions} steps${kept}`;
}

async function frameLoop() {
  while (state.slotId) {
    const id = state.slotId;
    if (!document.hidden) {
      const pic = await fetchPicture(`/slots/${id}/frame`, state.frameEtag).catch(() => null);
      if (pic && pic.url && state.slotId === id) {
        const img = $("frame");
        const old = img.src;
        img.src = pic.url;
        img.dataset.etag = pic.etag;
        state.frameEtag = pic.etag;
        if (old) URL.revokeObjectURL(old);
      }
    }
    await new Promise((r) => setTimeout(r, FRAME_EVERY_MS));
  }
}

function confirmDialog(text) {
  return new Promise((resolve) => {
    const d = $("confirm");
    $("confirm-text").textContent = text;
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.showModal();
  });
}

async function act(action) {
  const id = state.slotId;
  const words = { destroy: "Destroy", quarantine: "Quarantine", release: "Release" };
  if (!(await confirmDialog(`${words[action]} slot ${id}?` + (action === "destroy" ? " Its desktop is killed; this cannot be undone." : "")))) return;
  const r = await fetch(`${API}/slots/${id}/${action}`, {
    method: "POST", credentials: "same-origin", headers: { "X-Drums-Console": "1" },
  });
  const body = await r.json().catch(() => ({}));
  showResult(action, r.ok, body.error ? body.error.message : `HTTP ${r.status}`);
  if (r.ok && action === "destroy") location.hash = "#/";
  else slotTick();
}

// --- failure records --------------------------------------------------------------------

function size(n) {
  return n < 1024 * 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`;
}

function stamp(s) {
  return `${s.slice(0, 4)}-${s.slice(4, 6)}-${s.slice(6, 8)} ${s.slice(9, 11)}:${s.slice(11, 13)}:${s.slice(13, 15)}`;
}

async function showRecords() {
  const body = await getJson("/records");
  const tbody = $("records").querySelector("tbody");
  tbody.replaceChildren(...body.records.map((r) => {
    const open = el("a", { href: `#/record/${encodeURIComponent(r.name)}`, text: "open" });
    return el("tr", { "data-record": r.name, "data-slot": r.slot, "data-kind": r.kind },
      el("td", { text: stamp(r.stamp) }), el("td", { text: r.slot }), el("td", { text: r.kind }),
      el("td", { text: size(r.size) }), el("td", {}, open));
  }));
  if (!body.records.length) tbody.append(el("tr", {}, el("td", { text: `none in ${body.dir}` })));
}

async function showRecord(name) {
  const q = encodeURIComponent(name);
  const body = await getJson(`/records/${q}`);
  const rec = body.record || {};
  $("record-title").textContent = `${rec.id || name} · ${body.kind}`;
  $("record-download").href = `${API}/records/${q}/download`;
  const facts = [["image", rec.image], ["task", rec.task_id], ["episode", rec.episode ?? rec.episodes],
    ["verdicts", (rec.verdicts || []).join(", ")], ["quarantine", rec.quarantine_reason],
    ["failure", rec.failure], ["labels", JSON.stringify(rec.labels || {})]];
  if (rec.what) facts.unshift(["what", rec.what], ["why", rec.why], ["from slot", rec.source_slot],
    ["size", `${rec.size_mib} MiB`]); // a deleted state's or a rejected dump's record
  $("record-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v ?? "-" })]));
  $("record-members").textContent = body.members.join("\n") || "(a summary: no archive members)";
  const shot = $("record-shot");
  shot.hidden = !body.screenshot;
  $("record-noshot").textContent = body.screenshot ? "" : "no screenshot was kept";
  if (body.screenshot) shot.src = `${API}/records/${q}/screenshot`;
  const gates = ((body.gates && body.gates.gates) || []).sort((a, b) => (a.status === "fail" ? 0 : 1) - (b.status === "fail" ? 0 : 1));
  $("record-gates").querySelector("tbody").replaceChildren(...gates.map((g) => el("tr", { "data-gate": g.name, class: `gate-${g.status}` },
    el("td", { text: g.name }), el("td", {}, el("i", { class: `light ${g.status}` }), ` ${g.status}`),
    el("td", {}, el("pre", { text: JSON.stringify(g.evidence, null, 1) })))));
}

// --- routing -----------------------------------------------------------------------------

function route() {
  const m = location.hash.match(/^#\/slot\/([^/]+)$/);
  const rec = location.hash.match(/^#\/record\/([^/]+)$/);
  const records = location.hash === "#/records";
  const before = state.slotId;
  state.slotId = m ? decodeURIComponent(m[1]) : null;
  state.elsewhere = records || !!rec;
  $("grid-view").hidden = !!state.slotId || state.elsewhere;
  $("slot-view").hidden = !state.slotId;
  $("records-view").hidden = !records;
  $("record-view").hidden = !rec;
  if (records) showRecords().catch((e) => { $("records").querySelector("tbody").textContent = e.message; });
  if (rec) showRecord(decodeURIComponent(rec[1])).catch((e) => { $("record-title").textContent = e.message; });
  if (state.slotId && state.slotId !== before) {
    state.frameEtag = "";
    $("frame").removeAttribute("src");
    $("act-result").textContent = "";
    $("act-result").className = "";
    $("timeline").querySelector("tbody").replaceChildren();
    $("episode").querySelector("tbody").replaceChildren();
    $("episode-note").textContent = "";
    slotTick();
    frameLoop();
  }
  if (!state.slotId && !state.elsewhere) {
    gridTick().catch(() => {});
    hostTick().catch(() => {});
  }
}

function every(ms, fn) {
  const loop = async () => {
    try { await fn(); } catch (e) { /* shown by the next tick; the loop must go on */ }
    setTimeout(loop, ms);
  };
  setTimeout(loop, ms);
}

async function main() {
  const s = await getJson("/session");
  state.write = s.write;
  $("mode").textContent = s.write ? "actions on" : "read-only";
  for (const sel of document.querySelectorAll("select[data-facet], #f-text")) {
    sel.addEventListener("input", renderGrid);
  }
  for (const b of document.querySelectorAll(".actions button")) {
    b.addEventListener("click", () => act(b.dataset.action));
  }
  $("load-timeline").addEventListener("click", () => {
    loadEpisode().catch((e) => { $("episode-note").textContent = e.message; });
    loadTimeline().catch(() => {});
  });
  window.addEventListener("hashchange", route);
  route();
  every(GRID_EVERY_MS, gridTick);
  every(HOST_EVERY_MS, hostTick);
  every(1000, slotTick);
}

main();
