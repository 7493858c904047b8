// AMB viewer: runs list, run page (timeline + event list paged around the viewport), diff, grid.
// Everything shown comes from /api/ (docs/viewer.md). Agent output is hostile: it only ever enters
// the DOM as text (textContent / text nodes), never as HTML; the page's CSP forbids inline script.
"use strict";

const app = document.getElementById("app");
const crumb = document.getElementById("crumb");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "href") node.setAttribute("href", safeHref(v));
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function safeHref(v) {
  const s = String(v);
  // Only links this page builds: same-origin paths and fragments.
  return s.startsWith("/") || s.startsWith("#") || s.startsWith("?") ? s : "#";
}

async function getJSON(url) {
  const r = await fetch(url, { headers: { Accept: "application/json" } });
  let body;
  try { body = await r.json(); } catch (e) { body = { error: `HTTP ${r.status}` }; }
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}

function qs(params) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") p.set(k, v);
  return p.toString();
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "";
  if (Math.abs(ms) < 1000) return `${ms.toFixed(0)} ms`;
  if (Math.abs(ms) < 60000) return `${(ms / 1000).toFixed(2)} s`;
  if (Math.abs(ms) < 3600000) return `${Math.floor(ms / 60000)} m ${Math.floor((ms % 60000) / 1000)} s`;
  return `${Math.floor(ms / 3600000)} h ${Math.floor((ms % 3600000) / 60000)} m`;
}
const fmtNum = (n) => (n === null || n === undefined ? "" : Number(n).toLocaleString("en-US"));
// An unknown cost (a model missing from the price table, a run not scored yet) is never shown as 0,
// and neither is a known one below a tenth of a cent.
const fmtCost = (v) =>
  v === null || v === undefined ? "unknown" : v !== 0 && Math.abs(v) < 0.001 ? v.toPrecision(2) : v.toFixed(3);
const fmtScore = (v) => (v === null || v === undefined ? "–" : (100 * v).toFixed(1));
const runLink = (id, key) => `/runs/${encodeURIComponent(id)}${key ? "#" + key : ""}`;

// Header cells of one class ("num": a column of numbers, aligned right).
const th = (names, cls) => names.map((n) => el("th", { class: cls }, n));

// A labelled value: the label in bold, then the value's parts.
const kv = (label, ...value) => el("span", {}, el("b", {}, label), ...value);

function error(e) {
  return el("p", { class: "bad" }, String(e.message || e));
}

// ------------------------------------------------------------------ runs list

const RUN_FILTERS = ["task", "track", "tier", "agent", "model", "status"];

async function runsPage() {
  crumb.textContent = "runs";
  const url = new URL(location.href);
  const state = Object.fromEntries(url.searchParams.entries());
  app.replaceChildren(el("p", { class: "muted" }, "Loading runs…"));
  const runs = (cursor) => getJSON(`/api/runs?${qs({ ...state, limit: state.limit || 50, cursor })}`);
  const first = await runs(state.cursor).catch((e) => app.replaceChildren(error(e)));
  if (!first) return;
  const form = el("form", { class: "filters", id: "run-filters" });
  // A select of these values, `picked` selected; `any` (when given) first, for no value.
  const select = (name, values, picked, any) => el("select", { name },
    any ? el("option", { value: "" }, any) : null,
    values.map((v) => el("option", { value: v, selected: picked === v }, v)));
  for (const f of RUN_FILTERS) form.append(el("label", {}, f, select(f, first.facets[f] || [], state[f], "any")));
  const input = (name, ph, size) => el("input", { name, placeholder: ph, size, value: state[name] || "" });
  const profile = select("profile", first.profiles, state.profile, "best of any");
  const scanner = select("scanner", first.scanners || [], state.scanner, "any");
  const sort = select("sort", ["started", "duration", "tokens", "cost", "score", "run", "task", "agent", "model", "status", "events"],
    state.sort || "started");
  const order = select("order", ["desc", "asc"], state.order === "asc" ? "asc" : "desc");
  form.append(
    el("label", {}, "label", input("label", "key=value", 12)),
    el("label", {}, "score profile", profile),
    el("label", {}, "score ≥", input("score_min", "0–1", 4)),
    el("label", {}, "score ≤", input("score_max", "0–1", 4)),
    el("label", {}, "flagged by", scanner),
    el("label", {}, "scan value", input("scan_value", "flagged", 8)),
    el("label", {}, "search", input("q", "id, task, agent, label…", 18)),
    el("label", {}, "sort", sort),
    el("label", {}, "order", order),
    el("button", { type: "submit" }, "Apply"),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = {};
    for (const [k, v] of new FormData(form).entries()) if (v) p[k] = v;
    history.pushState(null, "", `/?${qs(p)}`);
    routed = location.pathname + location.search;
    runsPage();
  });
  form.addEventListener("change", (ev) => { if (ev.target.tagName === "SELECT") form.requestSubmit(); });

  const profiles = first.profiles;
  const head = el("tr", {}, th(["", "run", "task", "track", "tier", "agent", "model", "status"]),
    th(["duration", "events", "tokens", "cost $", ...profiles], "num"), th(["codes"]));
  const body = el("tbody", { id: "runs-body" });
  const table = el("table", { id: "runs-table" }, el("thead", {}, head), body);
  const picked = new Set();
  const diffBtn = el("button", { id: "diff-selected", disabled: true }, "Diff the two selected runs");
  diffBtn.addEventListener("click", () => {
    const [a, b] = [...picked];
    location.href = `/diff?${qs({ a, b })}`;
  });
  const count = el("span", { class: "muted", id: "runs-count" });
  const more = el("button", { id: "runs-more" }, "More runs");
  let next = null;
  let shown = 0;
  const addPage = (page) => {
    for (const r of page.runs) {
      const box = el("input", { type: "checkbox", class: "pick" });
      box.addEventListener("change", () => {
        if (box.checked) picked.add(r.run_id); else picked.delete(r.run_id);
        diffBtn.disabled = picked.size !== 2;
      });
      const codes = new Set();
      for (const s of Object.values(r.scores)) for (const c of s.codes) codes.add(c);
      body.append(el("tr", { class: "run-row", "data-run": r.run_id },
        el("td", {}, box),
        el("td", {}, el("a", { href: runLink(r.run_id), class: "run-link" }, r.run_id)),
        el("td", {}, r.task ? el("a", { href: `/grid?${qs({ task: r.task })}`, title: "all runs of this task" }, r.task) : ""),
        el("td", {}, r.track || ""), el("td", {}, r.tier || ""), el("td", {}, r.labels.agent || r.agent || ""),
        el("td", {}, r.model || ""), el("td", { class: r.status === "completed" ? "" : "bad" }, r.status || ""),
        el("td", { class: "num" }, r.duration_s === null ? "" : fmtMs(r.duration_s * 1000)),
        el("td", { class: "num" }, fmtNum(r.n_events)),
        el("td", { class: "num" }, fmtNum(r.tokens)),
        el("td", { class: "num" }, fmtCost(r.cost_usd)),
        profiles.map((p) => el("td", { class: "num" }, r.scores[p] ? fmtScore(r.scores[p].overall) : "")),
        el("td", {}, [...codes].sort().join(" ")),
      ));
    }
    shown += page.runs.length;
    next = page.next;
    more.hidden = !next;
    count.textContent = `${shown} shown of ${page.remaining + shown - page.runs.length} matching (${page.total} runs in the store)`;
  };
  more.addEventListener("click", async () => {
    more.disabled = true;
    try { addPage(await runs(next)); }
    catch (e) { app.append(error(e)); }
    more.disabled = false;
  });
  addPage(first);
  app.replaceChildren(form, el("p", {}, count, " ", diffBtn), table, el("p", {}, more));
}

// ------------------------------------------------------------------ run page

const DEFAULT_HIDDEN = new Set(["file.accessed"]);
const MAX_ROWS = 600;
const FIRST_ROWS = 100; // the first page around a deep link: enough to fill the list and scroll a little
const LANE_COLORS = { model: "#2563eb", tool: "#7c3aed", process: "#059669", file: "#ca8a04", network: "#db2777", run: "#6b7280" };

function cursorOf(row) {
  const raw = JSON.stringify([row.ts_ns, row.source, row.seq]);
  return btoa(unescape(encodeURIComponent(raw))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function runPage(runId) {
  crumb.textContent = runId;
  document.title = `${runId} · AMB viewer`;
  const api = `/api/runs/${encodeURIComponent(runId)}`;
  // A deep link waits for one thing: the page of events around its event. It is asked for before
  // anything else and drawn into the page's shell as soon as it comes; the run's header, the kind
  // filters, the scores and the timeline are asked for once it is shown, so that they never compete
  // with it for the server (on a busy machine, answers asked for together each took the time of all).
  const firstKey = decodeURIComponent(location.hash.slice(1));
  const firstPage = getJSON(`${api}/events?${qs({ hide: [...DEFAULT_HIDDEN].join(","), limit: FIRST_ROWS, around: firstKey })}`)
    .catch((e) => e);
  const verifyBadge = el("span", { class: "badge", id: "verify-badge" }, "verifying…");
  const manifest = el("details", { id: "manifest" }, el("summary", {}, "manifest and verify details"));
  const header = el("div", { class: "panel", id: "run-header" }, el("p", { class: "muted" }, "Loading run…"));
  const scores = el("div", { class: "panel", id: "scores" }, el("h3", {}, "Scores"), el("p", { class: "muted" }, "loading…"));
  const canvas = el("canvas", { id: "timeline", width: 1200, height: 128 });
  const tlInfo = el("div", { class: "tl-info", id: "timeline-info" });
  const hidden = new Set(DEFAULT_HIDDEN);
  const search = el("input", { id: "event-search", placeholder: "search event contents (server side)", size: 34 });
  const kindBoxes = el("span", { class: "kinds" });
  const evbar = el("div", { class: "evbar" }, kindBoxes, search, el("button", { onclick: () => reload() }, "Search"));
  search.addEventListener("keydown", (ev) => { if (ev.key === "Enter") reload(); });
  const list = el("div", { id: "events" });
  app.replaceChildren(header, scores, canvas, tlInfo, evbar, list);

  // -- the run's header and the kind filters (asked for once the first page of events is shown)
  const loadHeader = () => getJSON(api).then((run) => {
    header.replaceChildren(
      el("div", { class: "kv" },
        kv("task", run.task || "–", " ", run.tier || ""),
        kv("agent", run.labels.agent || run.agent || "–"),
        kv("model", run.model || "–"),
        kv("status", run.status, run.reason ? ` (${run.reason})` : ""),
        kv("duration", run.duration_s === null ? "–" : fmtMs(run.duration_s * 1000)),
        kv("events", fmtNum(run.n_events)),
        kv("model calls", fmtNum(run.n_model_calls)),
        kv("tokens in/out", `${fmtNum(run.tokens_in)} / ${fmtNum(run.tokens_out)}`),
        kv("cost", run.cost_usd === null ? "unknown" : `$${fmtCost(run.cost_usd)}`),
        kv("chain", verifyBadge)),
      el("div", { class: "kv muted" },
        Object.entries(run.labels).map(([k, v]) => kv(k, v))),
      manifest);
    kindBoxes.replaceChildren(...Object.keys(run.kinds).sort().map((k) => {
      const box = el("input", { type: "checkbox", checked: !hidden.has(k), "data-kind": k });
      box.addEventListener("change", () => { if (box.checked) hidden.delete(k); else hidden.add(k); reload(); });
      return el("label", {}, box, ` ${k} (${run.kinds[k]})`);
    }));
    if (run.n_events <= 20000) verify();
    else {
      verifyBadge.textContent = "verify now";
      verifyBadge.setAttribute("role", "button");
      verifyBadge.addEventListener("click", () => { verifyBadge.textContent = "verifying…"; verify(); }, { once: true });
    }
  }).catch((e) => header.replaceChildren(error(e)));

  // -- verify badge and manifest: it re-reads every blob of the run, so a big run waits for a click
  const verify = () => getJSON(`${api}/verify`).then((v) => {
    verifyBadge.textContent = v.ok ? "verified" : `${v.n_problems} problem(s)`;
    verifyBadge.className = `badge ${v.ok ? "ok" : "fail"}`;
    for (const p of v.problems) {
      manifest.append(el("div", { class: "bad" }, p.key ? el("a", { href: `#${p.key}` }, p.key) : "", " ", p.what));
    }
    manifest.append(el("pre", {}, JSON.stringify({ manifest: v.manifest, stored: v.stored_manifest }, null, 1)));
  }).catch((e) => { verifyBadge.textContent = `verify failed: ${e.message}`; });

  // -- scores with cited events (asked for once the first page of events is shown: see the end)
  const loadScores = () =>
    getJSON(`${api}/scores`).then((s) => renderScores(scores, s)).catch((e) => scores.append(error(e)));

  // -- the event list, paged around the viewport
  let prev = null, next = null, busy = false;
  const params = () => ({ hide: [...hidden].join(","), q: search.value });
  const rowOf = (ev) => {
    const row = el("div", { class: `ev lane-${ev.lane}${ev.flagged ? " flagged" : ""}`, id: `ev-${ev.key}`, "data-key": ev.key, "data-kind": ev.kind },
      el("span", { class: "t" }, fmtMs(ev.t_ms)),
      el("span", { class: "k" }, ev.key),
      el("span", { class: "kind" }, ev.kind),
      el("span", { class: "s" }, ev.summary),
      el("span", { class: "d" }, [ev.dur_ms !== undefined ? fmtMs(ev.dur_ms) : "", ev.tokens ? ` ${fmtNum(ev.tokens[0])}→${fmtNum(ev.tokens[1])} tok` : ""].join("")));
    row._ev = ev;
    row.addEventListener("click", () => toggleDetail(api, row));
    return row;
  };
  const trim = (fromTop) => {
    const rows = list.querySelectorAll(".ev");
    if (rows.length <= MAX_ROWS) return;
    const drop = rows.length - MAX_ROWS;
    if (fromTop) {
      const before = list.scrollHeight;
      for (let i = 0; i < drop; i++) { removeRow(rows[i]); }
      list.scrollTop -= before - list.scrollHeight;
      prev = cursorOf(list.querySelector(".ev")._ev);
    } else {
      for (let i = rows.length - drop; i < rows.length; i++) removeRow(rows[i]);
      const all = list.querySelectorAll(".ev");
      next = cursorOf(all[all.length - 1]._ev);
    }
  };
  const removeRow = (row) => { if (row._detail) row._detail.remove(); row.remove(); };
  const render = (page, target) => {
    list.replaceChildren(...page.events.map(rowOf));
    prev = page.prev; next = page.next;
    if (!page.events.length) list.append(el("p", { class: "more" }, "No events match."));
    if (target) {
      const row = document.getElementById(`ev-${target}`);
      if (!row && hidden.size) {
        // The linked event is of a kind the list hides: show every kind, then open there again.
        hidden.clear();
        for (const box of evbar.querySelectorAll("input[data-kind]")) box.checked = true;
        open({ around: target }, target);
        return;
      }
      if (row) {
        row.classList.add("target");
        list.scrollTop = row.offsetTop - list.offsetTop - list.clientHeight / 2;
      }
    }
    drawViewport();
  };
  const open = async (extra, target) => {
    busy = true;
    try { render(await getJSON(`${api}/events?${qs({ ...params(), ...extra, limit: 200 })}`), target); }
    catch (e) { list.replaceChildren(error(e)); }
    busy = false;
  };
  const reload = () => open({});
  // The next page past the list's end (forward) or its start, the rows in view kept where they are.
  const extend = async (forward) => {
    busy = true;
    try {
      const edge = forward ? { after: next } : { before: prev };
      const page = await getJSON(`${api}/events?${qs({ ...params(), ...edge, limit: 150 })}`);
      const height = list.scrollHeight;
      if (forward) { list.append(...page.events.map(rowOf)); next = page.next; }
      else { list.prepend(...page.events.map(rowOf)); list.scrollTop += list.scrollHeight - height; prev = page.prev; }
      trim(forward);
    } catch (e) { list.append(error(e)); }
    busy = false;
  };
  list.addEventListener("scroll", async () => {
    if (busy) return;
    if (next && list.scrollTop + list.clientHeight > list.scrollHeight - 400) await extend(true);
    else if (prev && list.scrollTop < 400) await extend(false);
    drawViewport();
  });

  // -- the timeline: spans on lanes with real durations (or counts per bin when too many)
  let tl = null, view = null;
  const drawTimeline = () => {
    if (!tl) return;
    const ctx = canvas.getContext("2d");
    const w = canvas.width = canvas.clientWidth || 1200;
    const h = canvas.height;
    ctx.clearRect(0, 0, w, h);
    const laneH = (h - 14) / tl.lanes.length;
    const x = (ms) => ((ms - tl.from_ms) / (tl.to_ms - tl.from_ms)) * (w - 70) + 70;
    ctx.font = "10px sans-serif";
    tl.lanes.forEach((lane, i) => {
      ctx.fillStyle = "#6b7280";
      ctx.fillText(lane, 4, 12 + i * laneH + laneH / 2);
      ctx.fillStyle = i % 2 ? "#fafafa" : "#f3f4f6";
      ctx.fillRect(70, i * laneH, w - 70, laneH);
    });
    const laneIdx = Object.fromEntries(tl.lanes.map((l, i) => [l, i]));
    if (tl.spans) {
      for (const [lane, start, dur] of tl.spans) {
        ctx.fillStyle = LANE_COLORS[lane] || "#333";
        const x0 = x(start);
        ctx.fillRect(x0, laneIdx[lane] * laneH + 2, Math.max(x(start + dur) - x0, 1.5), laneH - 4);
      }
    } else if (tl.bins) {
      const peak = Math.max(...tl.bins.rows.map((r) => r[2]));
      const bw = (w - 70) / tl.bins.n;
      for (const [lane, b, c] of tl.bins.rows) {
        ctx.fillStyle = LANE_COLORS[lane] || "#333";
        const hh = Math.max(((laneH - 4) * Math.log1p(c)) / Math.log1p(peak), 1);
        ctx.fillRect(70 + b * bw, laneIdx[lane] * laneH + laneH - 2 - hh, Math.max(bw - 0.5, 1), hh);
      }
    }
    if (view) {
      ctx.strokeStyle = "#f59e0b"; ctx.lineWidth = 2;
      const x0 = x(view[0]), x1 = x(view[1]);
      ctx.strokeRect(x0, 1, Math.max(x1 - x0, 2), h - 16);
    }
    ctx.fillStyle = "#6b7280";
    ctx.fillText(fmtMs(tl.from_ms), 72, h - 2);
    const end = fmtMs(tl.to_ms);
    ctx.fillText(end, w - ctx.measureText(end).width - 4, h - 2);
  };
  const drawViewport = () => {
    const rows = [...list.querySelectorAll(".ev")];
    const top = list.scrollTop + list.offsetTop, bottom = top + list.clientHeight;
    const seen = rows.filter((r) => r.offsetTop + r.offsetHeight >= top && r.offsetTop <= bottom);
    view = seen.length ? [seen[0]._ev.t_ms, seen[seen.length - 1]._ev.t_ms] : null;
    drawTimeline();
  };
  const loadTimeline = async (from, to) => {
    try {
      tl = await getJSON(`${api}/timeline?${qs({ from_ms: from, to_ms: to })}`);
      tlInfo.textContent = `${fmtNum(tl.count)} events from ${fmtMs(tl.from_ms)} to ${fmtMs(tl.to_ms)}` +
        (tl.spans ? " (each drawn with its real duration)" : " (too many to draw one by one: counts per bin; zoom in with the wheel)") +
        " · click to open the list there · wheel to zoom · double-click to reset";
      drawTimeline();
    } catch (e) { tlInfo.textContent = `timeline: ${e.message}`; }
  };
  const msAt = (ev) => {
    const r = canvas.getBoundingClientRect();
    const fx = Math.min(Math.max((ev.clientX - r.left - 70) / (r.width - 70), 0), 1);
    return tl.from_ms + fx * (tl.to_ms - tl.from_ms);
  };
  canvas.addEventListener("click", (ev) => { if (tl) { history.replaceState(null, "", location.pathname); open({ at_ms: msAt(ev) }); } });
  canvas.addEventListener("dblclick", () => loadTimeline());
  let wheelTimer = null;
  canvas.addEventListener("wheel", (ev) => {
    if (!tl) return;
    ev.preventDefault();
    const at = msAt(ev), f = ev.deltaY < 0 ? 0.5 : 2;
    const from = Math.max(at - (at - tl.from_ms) * f, tl.run_from_ms), to = Math.min(at + (tl.to_ms - at) * f, tl.run_to_ms);
    tl.from_ms = from; tl.to_ms = to;
    clearTimeout(wheelTimer);
    wheelTimer = setTimeout(() => loadTimeline(from, to), 150);
  }, { passive: false });
  window.addEventListener("resize", drawTimeline);

  const jump = () => {
    const key = decodeURIComponent(location.hash.slice(1));
    if (key) open({ around: key }, key); else reload();
  };
  window.onhashchange = jump;
  // The first page of events first (see the top); the rest once it is painted: after the next frame
  // (a busy renderer would otherwise handle their answers before it drew the list), or at the latest
  // after 300 ms (a page opened in a background tab gets no frames).
  const afterPaint = (fn) => {
    let done = false;
    const go = () => { if (!done) { done = true; fn(); } };
    requestAnimationFrame(() => setTimeout(go, 0));
    setTimeout(go, 300);
  };
  firstPage.then((page) => {
    if (page instanceof Error) { list.replaceChildren(error(page)); return; }
    render(page, firstKey || null);
  }).finally(() => afterPaint(() => { loadHeader(); loadScores(); loadTimeline(); }));
}

function renderScores(panel, data) {
  panel.replaceChildren(el("h3", {}, "Scores"));
  const evLinks = (keys) => (keys || []).map((k) => [el("a", { href: `#${k}`, class: "cite" }, k), " "]);
  for (const f of data.findings || []) {
    const ul = el("ul", { class: "findings" }, f.error ? el("li", { class: "bad" }, `error: ${f.error}`) : "");
    for (const x of f.findings) ul.append(el("li", { class: "finding" }, el("b", {}, JSON.stringify(x.value)), ` ${x.explanation} `, evLinks(x.events)));
    panel.append(el("div", { class: "scan", "data-scanner": f.scanner }, el("b", {}, `scanner ${f.scanner}`),
      ` (${f.version}) ${f.findings.length} finding(s)`, ul));
  }
  if (!data.scores.length) { panel.append(el("p", { class: "muted" }, data.reason || "not scored yet (amb score)")); return; }
  for (const s of data.scores) {
    panel.append(el("div", { class: "kv" },
      kv("profile", s.profile_name),
      kv("judge", s.judge),
      ["s1", "s2", "s3", "s4", "s5", "agentic", "task_score", "overall"]
        .map((k) => kv(k.replace("_score", "").toUpperCase(), fmtScore(s[k]))),
      kv("status", s.status, " / audit ", s.audit_status)));
    const ul = el("ul", { class: "findings" });
    for (const c of s.details.codes || []) ul.append(el("li", { class: "code" }, el("b", {}, c.code), ` ${c.reason} `, evLinks(c.events)));
    for (const v of s.details.violations || []) ul.append(el("li", { class: "violation bad" }, el("b", {}, v.rule), ` ${v.detail} `, evLinks(v.events)));
    for (const [k, why] of Object.entries(s.reasons || {})) ul.append(el("li", { class: "muted" }, `${k}: ${why}`));
    panel.append(ul);
  }
}

async function toggleDetail(api, row) {
  if (row._detail) { row._detail.remove(); row._detail = null; return; }
  const box = el("div", { class: "detail" }, el("span", { class: "muted" }, "loading…"));
  row._detail = box;
  row.after(box);
  const ev = row._ev;
  try {
    if (ev.kind === "model_call.completed") {
      box.replaceChildren(renderCall(api, await getJSON(`${api}/calls/${encodeURIComponent(ev.source)}/${ev.seq}`)));
    } else {
      const d = await getJSON(`${api}/events/${encodeURIComponent(ev.source)}/${ev.seq}`);
      const at = `${ev.source}:${ev.seq}`;
      const downloads = el("div", { class: "muted workspace-at" },
        el("a", { class: "workspace-tar", href: `${api}/workspace.tar?${qs({ at })}` }, "download the workspace at this event (.tar)"));
      if (ev.kind === "file.written" && d.payload.path && !d.payload.path.startsWith("/")) {
        downloads.append(" · ", el("a", { class: "workspace-file", href: `${api}/workspace/file?${qs({ at, path: d.payload.path })}` }, "this file as it was then"));
      }
      const parts = [downloads, el("pre", { class: "payload" }, JSON.stringify(d.payload, null, 1))];
      if (ev.kind === "file.written" && d.payload.path) {
        const f = await getJSON(`${api}/files?${qs({ path: d.payload.path, seq: ev.seq })}`);
        parts.unshift(renderFile(f));
      }
      box.replaceChildren(...parts);
    }
  } catch (e) { box.replaceChildren(error(e)); }
}

function renderFile(f) {
  const c = f.content;
  const versions = el("div", { class: "muted" }, `${f.versions.length} version(s): `,
    f.versions.map((v) => [el("a", { href: `#${v.key}` }, `${v.op} ${fmtNum(v.size)} B`), " "]));
  let body;
  if (c.kind === "image") body = el("img", { class: "preview", src: c.url, alt: f.path });
  else if (c.kind === "volume") body = el("div", {}, el("img", { class: "preview volume", src: c.url, alt: `middle slice of ${f.path}` }),
    el("span", { class: "muted" }, `middle slice · ${fmtNum(c.size)} bytes stored`));
  else if (c.kind === "text") body = el("pre", { class: "file-text" }, c.text + (c.truncated ? "\n[… cut; download the blob for the rest]" : ""));
  else if (c.kind === "binary") body = el("a", { href: c.url }, `binary, ${fmtNum(c.size)} bytes: download`);
  else body = el("span", { class: "muted" }, c.error || "content not stored (above the size cap)");
  return el("div", { class: "file" }, el("b", {}, f.path), versions, body);
}

const toolCall = (t) => el("pre", { class: "tool-call" }, `${t.name}(${t.arguments})`);

function renderCall(api, c) {
  const msgs = el("div", { class: "messages" });
  for (const m of c.messages) {
    const parts = [];
    for (const p of m.parts || []) {
      if (p.type === "image" && p.index !== undefined) parts.push(el("img", { class: "preview", src: `${api}/calls/${encodeURIComponent(c.key.split(":")[0])}/${c.key.split(":")[1]}/images/${p.index}`, alt: "image from the request" }));
      else if (p.type === "tool_result") parts.push(el("pre", { class: "tool-result" }, `[result ${p.id}] ${p.text}`));
      else if (p.type === "tool_call") parts.push(toolCall(p));
      else parts.push(el("pre", {}, `[${p.type}] ${p.url || p.json || ""}`));
    }
    for (const t of m.tool_calls || []) parts.push(toolCall(t));
    msgs.append(el("div", { class: "msg" },
      el("div", { class: "role" }, m.role, m.tool_call_id ? ` · ${m.tool_call_id}` : "", m.truncated ? " · cut, see raw" : ""),
      m.text ? el("pre", { class: "msg-text" }, m.text) : "", parts));
  }
  const reply = el("div", { class: "msg reply" }, el("div", { class: "role" }, "reply", c.stop_reason ? ` · ${c.stop_reason}` : ""),
    c.reply.reasoning ? el("pre", { class: "muted" }, c.reply.reasoning) : "",
    c.reply.text ? el("pre", { class: "reply-text" }, c.reply.text) : "",
    c.reply.tool_calls.map(toolCall));
  const raw = (r) => r ? el("div", {},
    el("div", { class: "muted" }, `${fmtNum(r.size)} bytes · ${r.media_type || ""} · `, el("a", { href: `/api/blobs/${r.blob}?download=1` }, "download")),
    el("pre", { class: "raw" }, r.text !== undefined ? r.text + (r.truncated ? "\n[… cut; download for the rest]" : "") : r.error)) : el("p", { class: "muted" }, "no body");
  const panes = { messages: el("div", {}, msgs, reply), "raw request": raw(c.request_raw), "raw response": raw(c.response_raw) };
  const holder = el("div", { class: "pane" }, panes.messages);
  const tabs = el("div", { class: "tabs" });
  for (const name of Object.keys(panes)) {
    const b = el("button", { type: "button", class: name === "messages" ? "on" : "", "data-tab": name }, name);
    b.addEventListener("click", (ev) => {
      ev.stopPropagation();
      for (const x of tabs.children) x.classList.toggle("on", x === b);
      holder.replaceChildren(panes[name]);
    });
    tabs.append(b);
  }
  const meta = el("div", { class: "kv muted" },
    el("span", {}, `${c.provider} ${c.api} · ${c.model || "?"}${c.stream ? " · stream" : ""}`),
    el("span", {}, `HTTP ${c.status ?? "–"}${c.ok ? "" : ` · FAILED ${c.error || ""}`}`),
    el("span", {}, `ttfb ${fmtMs(c.ttfb_ms)} · latency ${fmtMs(c.latency_ms)}`),
    el("span", {}, `tokens ${fmtNum(c.usage && c.usage.input_total)} in / ${fmtNum(c.usage && c.usage.output)} out`),
    c.parse_error ? el("span", { class: "bad" }, c.parse_error) : "");
  return el("div", { class: "call" }, meta, tabs, holder);
}

// ------------------------------------------------------------------ diff

async function diffPage() {
  const p = new URL(location.href).searchParams;
  const a = p.get("a"), b = p.get("b");
  crumb.textContent = `diff ${a} ↔ ${b}`;
  if (!a || !b) { app.replaceChildren(el("p", {}, "Pick two runs on the runs page to diff them.")); return; }
  app.replaceChildren(el("p", { class: "muted" }, "Aligning…"));
  const d = await getJSON(`/api/diff?${qs({ a, b, at: p.get("at") || "" })}`).catch((e) => app.replaceChildren(error(e)));
  if (!d) return;
  const s = d.summary;
  const fd = s.first_divergence;
  const sumPanel = el("div", { class: "panel", id: "diff-summary" },
    el("div", { class: "kv" },
      kv("a", el("a", { href: runLink(a) }, a), ` (${d.a.labels.agent || d.a.agent || "?"}, ${s.steps_a} steps)`),
      kv("b", el("a", { href: runLink(b) }, b), ` (${d.b.labels.agent || d.b.agent || "?"}, ${s.steps_b} steps)`),
      Object.entries(s.counts).map(([op, n]) => kv(op, n)),
      kv("tokens a", `${fmtNum(s.tokens_a[0])} / ${fmtNum(s.tokens_a[1])}`),
      kv("tokens b", `${fmtNum(s.tokens_b[0])} / ${fmtNum(s.tokens_b[1])}`),
      kv("model time a / b", `${fmtMs(s.latency_ms_a)} / ${fmtMs(s.latency_ms_b)}`)),
    el("p", { id: "divergence", class: s.identical ? "good" : "bad" }, s.identical ? "The two runs take identical steps." :
      ["First divergence at step row ", String(fd.row), ": ", fd.op, " — a: ",
        fd.a ? el("a", { href: runLink(a, fd.a.key) }, `${fd.a.key} ${fd.a.tools}`) : "(none)", "  b: ",
        fd.b ? el("a", { href: runLink(b, fd.b.key) }, `${fd.b.key} ${fd.b.tools}`) : "(none)",
        " ", el("a", { href: `/diff?${qs({ a, b, at: "first" })}` }, "show it")]));
  const oc = d.outcomes;
  const scoreRows = oc.scores.map((r) => el("tr", {}, el("td", {}, r.profile),
    el("td", { class: "num" }, r.a ? fmtScore(r.a.overall) : "–"), el("td", { class: "num" }, r.b ? fmtScore(r.b.overall) : "–"),
    el("td", {}, r.a ? r.a.codes.join(" ") : ""), el("td", {}, r.b ? r.b.codes.join(" ") : "")));
  const fileRows = oc.submission.files.map((f) => el("tr", { class: f.state === "same" ? "op-same" : "op-changed" },
    el("td", { class: "wrap" }, f.path), el("td", {}, f.state), el("td", {}, (f.a || "–").slice(0, 19)), el("td", {}, (f.b || "–").slice(0, 19))));
  const outPanel = el("div", { class: "panel split", id: "diff-outcomes" },
    el("div", {}, el("h3", {}, "Scores (OVERALL ×100)"), el("table", {}, el("tr", {}, th(["profile", "a", "b", "codes a", "codes b"])), scoreRows)),
    el("div", {}, el("h3", {}, "Submission files by hash"), oc.submission.files.length ? el("table", {}, el("tr", {}, th(["path", "state", "a", "b"])), fileRows) : el("p", { class: "muted" }, "no sealed files")));
  const body = el("tbody", { id: "diff-rows" });
  const more = el("button", { id: "diff-more" }, "More steps");
  let next = d.next;
  const side = (x, run) => x ? [el("a", { href: runLink(run, x.key) }, x.key), ` ${x.tools}`, x.ok ? "" : el("span", { class: "bad" }, " failed")] : "";
  const add = (page) => {
    for (const r of page.rows) {
      const changes = (r.changes || []).flatMap((c) => c.fields.map((f) => {
        const name = `${c.name_a === c.name_b ? c.name_a : `${c.name_a} → ${c.name_b}`}${f.field ? "." + f.field : ""}: `;
        if (f.lines) {
          return el("div", {}, name, el("pre", { class: "line-diff" }, f.lines.map((l) =>
            el("span", { class: l.startsWith("+") ? "good" : l.startsWith("-") ? "bad" : "muted" }, l + "\n"))));
        }
        return el("div", {}, name, el("span", { class: "bad" }, f.a === null ? "(absent)" : f.a), " → ",
          el("span", { class: "good" }, f.b === null ? "(absent)" : f.b));
      }));
      body.append(el("tr", { class: `op-${r.op}${fd && r.row === fd.row ? " first-divergence" : ""}`, "data-op": r.op },
        el("td", { class: "num" }, r.row), el("td", {}, r.op), el("td", {}, side(r.a, a)), el("td", {}, side(r.b, b)),
        el("td", { class: "num" }, r.d_tokens_in === undefined ? "" : `${r.d_tokens_in >= 0 ? "+" : ""}${r.d_tokens_in} / ${r.d_tokens_out >= 0 ? "+" : ""}${r.d_tokens_out}`),
        el("td", { class: "num" }, r.d_latency_ms === undefined ? "" : `${r.d_latency_ms >= 0 ? "+" : ""}${fmtMs(r.d_latency_ms)}`),
        el("td", { class: "wrap" }, changes)));
    }
    next = page.next;
    more.hidden = !next;
  };
  more.addEventListener("click", async () => { add(await getJSON(`/api/diff?${qs({ a, b, cursor: next })}`)); });
  add(d);
  const head = el("tr", {}, th(["#", "step", "a", "b"]), th(["Δ tokens in/out", "Δ latency"], "num"), th(["changed arguments"]));
  const table = el("table", { id: "diff-table" }, el("thead", {}, head), body);
  app.replaceChildren(sumPanel, outPanel, d.from_row ? el("p", { class: "muted" }, `steps from row ${d.from_row}`) : "", table, el("p", {}, more));
}

// ------------------------------------------------------------------ grid

async function gridPage() {
  const p = new URL(location.href).searchParams;
  const task = p.get("task");
  crumb.textContent = `grid ${task}`;
  const g = await getJSON(`/api/grid?${qs({ task, profile: p.get("profile") || "" })}`).catch((e) => app.replaceChildren(error(e)));
  if (!g) return;
  const head = el("tr", {}, th(["agent · model", ...Array.from({ length: g.repeats }, (_, i) => `run ${i + 1}`)]));
  const rows = g.rows.map((r) => el("tr", {}, el("td", {}, r.agent), r.runs.map((x) => el("td", {},
    el("a", { class: `cell ${["completed", "failed", "breach"].includes(x.score_status || x.status) ? (x.score_status || x.status) : "other"}`, href: runLink(x.run_id) },
      el("div", {}, fmtScore(x.overall), " ", x.score_status || x.status), el("div", { class: "muted" }, `${x.tier || ""} ${x.codes.join(" ")}`))))));
  app.replaceChildren(el("h3", {}, `${task}: ${g.rows.length} agents × up to ${g.repeats} runs (OVERALL ×100, ${g.profile || "unscored"})`),
    el("table", { class: "grid", id: "grid" }, head, rows));
}

// ------------------------------------------------------------------ routing

function route() {
  const parts = location.pathname.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "runs" && parts[1]) return runPage(parts[1]);
  if (parts[0] === "diff") return diffPage();
  if (parts[0] === "grid") return gridPage();
  return runsPage();
}
let routed = location.pathname + location.search;
window.addEventListener("popstate", () => {
  // A fragment change (a deep link within the run page) is handled by that page's hashchange.
  if (location.pathname + location.search === routed) return;
  routed = location.pathname + location.search;
  window.onhashchange = null;
  route();
});
route();
