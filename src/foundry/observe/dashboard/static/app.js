// Foundry dashboard. Vanilla JS, no build step, nothing loaded from elsewhere.
// Every value from the server is inserted as text (textContent / text nodes), never as
// markup: names, arguments, tracebacks and messages cannot inject HTML or script.
"use strict";

(() => {
  const csrf = document.querySelector('meta[name="foundry-csrf"]').getAttribute("content");
  const state = { meta: null, live: null, history: [], lastT: 0, poll: 2, window: 900, failures: 0 };
  const view = document.getElementById("view");
  let current = null; // { name, params, refresh }
  let timer = null;

  // -- DOM helpers ---------------------------------------------------------------------

  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") el.className = value;
      else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
      else if (key === "text") el.textContent = String(value);
      else el.setAttribute(key, String(value));
    }
    append(el, children);
    return el;
  }

  function append(el, children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  const svgNS = "http://www.w3.org/2000/svg";
  function s(tag, attrs, text) {
    const el = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    if (text !== undefined) el.textContent = String(text);
    return el;
  }

  // A form control whose value survives the periodic re-render of its view.
  function kept(store, key, el) {
    if (key in store) el.value = store[key];
    el.dataset.keep = key;
    const remember = () => { store[key] = el.value; };
    el.addEventListener("input", remember);
    el.addEventListener("change", remember);
    return el;
  }

  // Re-render ``box`` with ``build`` without losing the focus of a kept control.
  function rerender(box, build) {
    const active = document.activeElement;
    const key = active && box.contains(active) && active.dataset ? active.dataset.keep : null;
    clear(box);
    build();
    if (key) {
      const again = [...box.querySelectorAll("[data-keep]")].find((el) => el.dataset.keep === key);
      if (again) again.focus();
    }
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
  }

  // -- formatting ----------------------------------------------------------------------

  function dur(sec) {
    if (sec === null || sec === undefined || !isFinite(sec)) return "–";
    const a = Math.abs(sec);
    if (a === 0) return "0 s";
    if (a < 1e-3) return (a * 1e6).toFixed(0) + " µs";
    if (a < 1) return (a * 1e3).toFixed(a < 0.01 ? 2 : 0) + " ms";
    if (a < 120) return a.toFixed(a < 10 ? 2 : 1) + " s";
    if (a < 7200) return (a / 60).toFixed(1) + " min";
    if (a < 172800) return (a / 3600).toFixed(1) + " h";
    return (a / 86400).toFixed(1) + " d";
  }
  function ago(t) {
    if (!t) return "–";
    const d = Date.now() / 1000 - t;
    return d >= 0 ? dur(d) + " ago" : "in " + dur(-d);
  }
  function when(t) {
    if (!t) return "–";
    return new Date(t * 1000).toLocaleTimeString();
  }
  function num(v, unit) {
    if (v === null || v === undefined) return "no data";
    if (unit === "s") return dur(v);
    if (unit === "ratio") return (v * 100).toFixed(0) + " %";
    if (unit === "/s") return (v < 10 ? v.toFixed(2) : v.toFixed(0)) + "/s";
    return Number.isInteger(v) ? String(v) : v.toFixed(2);
  }
  function status(value) {
    return h("span", { class: "st st-" + String(value).replace(/[^a-z]/g, "") }, value);
  }

  // -- server --------------------------------------------------------------------------

  async function api(path) {
    const res = await fetch(path, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    const body = await res.json().catch(() => ({ error: "unreadable answer (" + res.status + ")" }));
    if (!res.ok) throw new Error(body.error || "HTTP " + res.status);
    return body;
  }

  async function act(path, body) {
    const res = await fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Foundry-CSRF": csrf },
      body: JSON.stringify(body || {}),
    });
    const answer = await res.json().catch(() => ({ error: "unreadable answer (" + res.status + ")" }));
    if (!res.ok) throw new Error(answer.error || "HTTP " + res.status);
    return answer;
  }

  function toast(message, error) {
    const el = h("div", { class: "toast" + (error ? " error" : ""), role: "status", "data-testid": "toast" }, message);
    document.body.appendChild(el);
    setTimeout(() => el.remove(), 6000);
  }

  function actionButton(label, path, body, opts) {
    opts = opts || {};
    const btn = h("button", { class: opts.danger ? "danger" : "", "data-action": opts.name || label.toLowerCase(),
      title: opts.title || null, disabled: opts.disabled || null }, label);
    btn.addEventListener("click", async () => {
      if (opts.confirm && !window.confirm(opts.confirm)) return;
      const payload = typeof body === "function" ? body() : body;
      if (payload === null) return;
      btn.disabled = true;
      try {
        const answer = await act(path, payload);
        toast(answer.message || "done");
        refresh(true);
      } catch (err) {
        toast(err.message, true);
      } finally {
        btn.disabled = false;
      }
    });
    return btn;
  }

  // -- routing -------------------------------------------------------------------------

  function route() {
    const hash = location.hash.replace(/^#\/?/, "") || "plan";
    const [path, qs] = hash.split("?");
    const parts = path.split("/").map(decodeURIComponent);
    const params = new URLSearchParams(qs || "");
    return { name: parts[0] || "plan", arg: parts.slice(1).join("/"), params };
  }

  function setHash(name, params) {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v) qs.set(k, v);
    const text = qs.toString();
    location.hash = "#/" + name + (text ? "?" + text : "");
  }

  const views = {};

  function show() {
    const r = route();
    const tab = { job: "jobs", workflow: "workflows" }[r.name] || r.name;
    document.querySelectorAll("#tabs a").forEach((a) => a.classList.toggle("active", a.dataset.tab === tab));
    const make = views[r.name] || views.plan;
    clear(view);
    current = make(r);
    refresh(true);
  }

  async function refresh(now) {
    if (current && current.refresh) {
      try {
        await current.refresh(now);
      } catch (err) {
        banner(err.message, true);
      }
    }
  }

  function banner(message, error) {
    const el = document.getElementById("banner");
    if (!message) {
      el.hidden = true;
      return;
    }
    el.hidden = false;
    el.className = "banner" + (error ? " error" : "");
    el.textContent = message;
  }

  // -- polling the live picture --------------------------------------------------------

  async function poll() {
    try {
      const live = await api("/api/live?since=" + state.lastT);
      state.failures = 0;
      state.live = live;
      for (const p of live.history) {
        if (p.t > state.lastT) {
          state.history.push(p);
          state.lastT = p.t;
        }
      }
      const horizon = live.now - state.window;
      while (state.history.length && state.history[0].t < horizon) state.history.shift();
      const st = document.getElementById("status");
      const down = live.fleet.filter((m) => m.state === "down").length;
      st.className = "status" + (down ? " down" : "");
      st.textContent = "updated " + when(live.now) + (down ? " · " + down + " down" : "");
      const errs = Object.entries(live.errors || {});
      banner(errs.length ? errs.map(([k, v]) => k + ": " + v).join(" · ") : "", true);
      document.body.dataset.lastPoll = String(live.now);
      await refresh(false);
    } catch (err) {
      state.failures += 1;
      const st = document.getElementById("status");
      st.className = "status down";
      st.textContent = "dashboard unreachable: " + err.message;
    } finally {
      clearTimeout(timer);
      timer = setTimeout(poll, state.poll * 1000);
    }
  }

  // -- plan ----------------------------------------------------------------------------

  function chip(f) {
    const limit = f.limit === null ? "" : f.limit === 0 ? " (limit 0)" : " (limit " + num(f.limit, f.unit) + ")";
    return h("span", { class: "chip " + f.state, title: f.metric + " · " + f.why + " · from " + f.source,
      "data-metric": f.metric, "data-state": f.state }, f.label + " " + num(f.value, f.unit) + limit);
  }

  views.plan = () => {
    const box = h("div", {});
    view.appendChild(box);
    let units = null;
    return {
      async refresh() {
        if (units === null) units = (await api("/api/plan")).units;
        const live = state.live;
        clear(box);
        if (!units.length) {
          box.appendChild(h("p", { class: "dim" },
            "No app loaded, so no plan: start the dashboard with the app (foundry dashboard app.py) to see each " +
            "unit's decision beside the figures it says to watch. Jobs, workflows, streams and the fleet work without it."));
          return;
        }
        const byUnit = {};
        for (const u of (live && live.plan) || []) byUnit[u.name] = u;
        const table = h("table", { "data-testid": "plan" },
          h("thead", {}, h("tr", {}, ["unit · phase", "delivery (deciding question)", "execution (deciding question)", "bill: first failure", "watch (live, against the decision's limits)"]
            .map((c) => h("th", {}, c)))));
        const body = h("tbody", {});
        for (const u of units) {
          const liveUnit = byUnit[u.name] || { phases: [], reports: [], runs: {} };
          u.phases.forEach((d, i) => {
            const livePhase = liveUnit.phases.find((p) => p.phase === d.phase) || { figures: [], drift: [] };
            const nameCell = i === 0
              ? h("td", {}, h("strong", {}, u.name), " ", h("span", { class: "dim" }, u.kind + (u.queue ? " · queue " + u.queue : "")),
                  Object.keys(liveUnit.runs || {}).length
                    ? h("div", { class: "dim" }, Object.entries(liveUnit.runs).map(([k, v]) => k + " " + v).join(" · "))
                    : null)
              : h("td", {}, "· " + d.phase);
            const bill = h("details", {}, h("summary", {}, d.first_failure),
              h("table", { class: "bill" }, h("tbody", {},
                ["why", "costs", "fails", "guarantees"].map((k) => h("tr", {}, h("td", {}, k),
                  h("td", {}, h("div", {}, "delivery: " + d.delivery_bill[k]), h("div", {}, "execution: " + d.execution_bill[k])))),
                h("tr", {}, h("td", {}, "consider first"), h("td", {}, d.simpler)),
                d.rejected.length ? h("tr", {}, h("td", {}, "rejected"), h("td", {}, d.rejected.map((r) => h("div", {}, r.model + ": " + r.reason)))) : null)));
            const watch = h("td", {}, livePhase.figures.map(chip),
              d.warnings.map((w) => h("div", { class: "warn" }, "⚠ " + w.title + ": " + w.message + ". Fix: " + w.fix)),
              livePhase.drift.map((w) => h("div", { class: "drift", "data-testid": "drift" }, "↻ " + w)),
              i === 0 ? liveUnit.reports.map((r) => h("div", { class: "drift", "data-testid": "stall" }, "⏱ " + r.message)) : null);
            body.appendChild(h("tr", { class: i ? "phase" : "", "data-unit": u.name, "data-phase": d.phase },
              nameCell,
              h("td", {}, h("code", {}, d.delivery), h("div", { class: "dim" }, d.delivery_decided_by + ": " + d.delivery_answer)),
              h("td", {}, h("code", {}, d.execution), h("div", { class: "dim" }, d.decided_by + ": " + d.execution_answer)),
              h("td", {}, bill),
              watch));
          });
        }
        table.appendChild(body);
        box.appendChild(table);
        const reports = ((live && live.reports) || []).filter((r) => !units.some((u) => (r.message || "").includes("'" + u.name)));
        if (reports.length) {
          box.appendChild(h("h2", {}, "Watchdog reports"));
          box.appendChild(h("div", {}, reports.map((r) => h("div", { class: "drift" }, when(r.at) + " " + r.member + ": " + r.message))));
        }
      },
    };
  };

  // -- charts --------------------------------------------------------------------------

  const palette = ["#58a6ff", "#3fb950", "#d29922", "#f85149", "#d2a8ff", "#39c5cf", "#ff7b72", "#a5d6ff"];

  function lineChart(id, title, series, unit) {
    const W = 640, H = 200, L = 56, R = 10, T = 10, B = 22;
    const now = Date.now() / 1000;
    const t0 = now - state.window;
    let max = 0, points = 0;
    for (const ser of series) for (const [, v] of ser.points) { max = Math.max(max, v); points += 1; }
    const top = max > 0 ? max * 1.15 : 1;
    const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none",
      "data-chart": id, "data-max": max, "data-points": points, role: "img", "aria-label": title });
    for (let i = 0; i <= 4; i++) {
      const y = T + (H - T - B) * (i / 4);
      svg.appendChild(s("line", { x1: L, x2: W - R, y1: y, y2: y, class: "axis" }));
      svg.appendChild(s("text", { x: L - 4, y: y + 3, "text-anchor": "end" }, num(top * (1 - i / 4), unit)));
    }
    for (let m = 0; m <= 15; m += 5) {
      const x = L + (W - L - R) * (1 - m / 15);
      svg.appendChild(s("text", { x, y: H - 6, "text-anchor": "middle" }, m ? "-" + m + " min" : "now"));
    }
    const X = (t) => L + (W - L - R) * ((t - t0) / state.window);
    const Y = (v) => T + (H - T - B) * (1 - v / top);
    series.forEach((ser, i) => {
      if (!ser.points.length) return;
      const d = ser.points.map(([t, v], j) => (j ? "L" : "M") + X(t).toFixed(1) + " " + Y(v).toFixed(1)).join(" ");
      svg.appendChild(s("path", { d, fill: "none", stroke: ser.color || palette[i % palette.length], "stroke-width": 1.6,
        "vector-effect": "non-scaling-stroke" }));
    });
    const legend = h("div", { class: "legend" }, series.map((ser, i) => [h("i", { style: null }), ser.name]));
    legend.querySelectorAll("i").forEach((el, i) => { el.style.background = series[i].color || palette[i % palette.length]; });
    return h("div", { class: "card" }, h("h3", {}, title), svg,
      series.length ? legend : h("div", { class: "dim" }, "nothing reports this yet"));
  }

  function scatter(id, title) {
    const W = 640, H = 200, L = 56, R = 10, T = 10, B = 22;
    const pts = state.history.map((p) => [p.in_flight, p.throughput]);
    const mx = Math.max(1, ...pts.map((p) => p[0])) * 1.1;
    const my = Math.max(0.001, ...pts.map((p) => p[1])) * 1.15;
    const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", "data-chart": id,
      "data-points": pts.length, role: "img", "aria-label": title });
    svg.appendChild(s("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
    svg.appendChild(s("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
    svg.appendChild(s("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, num(my, "/s")));
    svg.appendChild(s("text", { x: W - R, y: H - 6, "text-anchor": "end" }, "in flight " + num(mx)));
    pts.forEach(([x, y], i) => {
      svg.appendChild(s("circle", { cx: L + (W - L - R) * (x / mx), cy: T + (H - T - B) * (1 - y / my), r: 2.5,
        fill: palette[0], "fill-opacity": 0.25 + 0.75 * (i / Math.max(1, pts.length - 1)) }));
    });
    return h("div", { class: "card" }, h("h3", {}, title), svg,
      h("div", { class: "legend" }, "each dot: one sample; darker is newer. A flat top while in-flight grows is saturation."));
  }

  function seriesOf(field) {
    const names = new Set();
    for (const p of state.history) for (const k of Object.keys(p[field] || {})) names.add(k);
    return [...names].sort().map((name) => ({ name, points: state.history.filter((p) => name in (p[field] || {})).map((p) => [p.t, p[field][name]]) }));
  }

  views.charts = () => {
    const box = h("div", { class: "grid" });
    view.appendChild(h("p", { class: "dim" }, "The last 15 minutes, sampled every poll while a page is open (kept in the page and on the dashboard server)."));
    view.appendChild(box);
    return {
      refresh() {
        clear(box);
        const tp = { name: "throughput /s", points: state.history.map((p) => [p.t, p.throughput]) };
        const fl = { name: "in flight", points: state.history.map((p) => [p.t, p.in_flight]) };
        box.appendChild(lineChart("throughput", "Throughput (completed/s)", [tp], "/s"));
        box.appendChild(lineChart("in_flight", "In flight", [fl], ""));
        box.appendChild(scatter("curve", "Throughput vs in flight (the concurrency curve)"));
        box.appendChild(lineChart("queue_age", "Queue: age of the oldest waiting job", seriesOf("queue_age"), "s"));
        box.appendChild(lineChart("queue_depth", "Queue depth", seriesOf("queue_depth"), ""));
        box.appendChild(lineChart("loop_lag", "Event-loop lag p99", seriesOf("loop_lag_p99"), "s"));
        box.appendChild(lineChart("consumer_lag", "Stream consumer lag (events)", seriesOf("consumer_lag"), ""));
      },
    };
  };

  // -- jobs ----------------------------------------------------------------------------

  const SINCE = { "": "any time", "300": "last 5 min", "3600": "last hour", "86400": "last day" };

  function select(name, options, value) {
    return h("select", { name }, Object.entries(options).map(([k, v]) => h("option", { value: k, selected: k === (value || "") ? "selected" : null }, v)));
  }

  views.jobs = (r) => {
    const p = r.params;
    const meta = state.meta;
    const queues = ((state.live && state.live.queues) || []).map((q) => q.queue);
    const form = h("form", { class: "toolbar" },
      h("label", {}, "queue", select("queue", Object.fromEntries([["", "all"], ...queues.map((q) => [q, q])]), p.get("queue"))),
      h("label", {}, "state", select("status", Object.fromEntries([["", "all"], ...meta.states.map((x) => [x, x])]), p.get("status"))),
      h("label", {}, "unit", h("input", { name: "unit", value: p.get("unit") || "", placeholder: "any unit" })),
      h("label", {}, "enqueued", select("since", SINCE, p.get("since"))),
      h("button", { type: "submit" }, "Filter"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const f = new FormData(form);
      setHash("jobs", { queue: f.get("queue"), status: f.get("status"), unit: f.get("unit"), since: f.get("since") });
    });
    const stats = h("div", {});
    const box = h("div", {});
    view.append(stats, form, box);
    return {
      async refresh() {
        const qs = new URLSearchParams();
        for (const k of ["queue", "status", "unit"]) if (p.get(k)) qs.set(k, p.get(k));
        if (p.get("since")) qs.set("since", String(Date.now() / 1000 - Number(p.get("since"))));
        const data = await api("/api/jobs?" + qs.toString());
        clear(stats);
        const qrows = (state.live && state.live.queues) || [];
        if (qrows.length) {
          stats.appendChild(h("table", { "data-testid": "queues" },
            h("thead", {}, h("tr", {}, ["queue", "depth", "oldest age", "scheduled", "running", "dead", ""].map((c) => h("th", {}, c)))),
            h("tbody", {}, qrows.map((q) => h("tr", { "data-queue": q.queue },
              h("td", {}, q.queue), h("td", { class: "num" }, q.depth), h("td", { class: "num" }, dur(q.oldest_age)),
              h("td", { class: "num" }, q.scheduled), h("td", { class: "num" }, q.running),
              h("td", { class: "num" }, h("a", { href: "#/jobs?status=dead&queue=" + encodeURIComponent(q.queue) }, String(q.dead))),
              h("td", {},
                actionButton("Purge queued", "/api/queues/" + encodeURIComponent(q.queue) + "/purge", () => {
                  const typed = window.prompt("Cancel every job waiting in queue " + q.queue + "? Type the queue name:");
                  return typed === null ? null : { what: "queued", confirm: typed };
                }, { danger: true, name: "purge" }),
                " ",
                actionButton("Purge expired", "/api/queues/" + encodeURIComponent(q.queue) + "/purge", { what: "expired" },
                  { name: "purge-expired", title: "delete finished job records past their result TTL (every queue)" })))))));
        }
        clear(box);
        if (!data.can_list) box.appendChild(h("p", { class: "warn" }, "This engine cannot list jobs; showing dead letters only."));
        if (data.capped) box.appendChild(h("p", { class: "dim" }, "Filtered over the most recent " + data.scanned + " jobs."));
        const table = h("table", { "data-testid": "jobs" },
          h("thead", {}, h("tr", {}, ["id", "unit", "queue", "state", "progress", "att.", "arguments", "enqueued", "finished", "why", ""].map((c) => h("th", {}, c)))));
        const body = h("tbody", {});
        for (const j of data.jobs) {
          body.appendChild(h("tr", { "data-job-id": j.id, "data-status": j.status },
            h("td", {}, h("a", { href: "#/job/" + encodeURIComponent(j.id), class: "mono" }, j.id.slice(0, 12))),
            h("td", {}, j.unit), h("td", {}, j.queue), h("td", {}, status(j.status),
              j.cancel_requested_at && j.status === "running" ? h("span", { class: "drift" }, " cancel requested") : null),
            h("td", { "data-testid": "progress" }, progressCell(j.progress)),
            h("td", { class: "num" }, j.attempts + "/" + j.deliveries),
            h("td", { class: "mono", "data-testid": "args" }, j.args || ""),
            h("td", {}, ago(j.enqueued_at)), h("td", {}, j.finished_at ? ago(j.finished_at) : ""),
            h("td", {}, j.dead_reason || j.error || ""),
            h("td", {}, (j.status === "dead" || j.status === "failed")
              ? actionButton("Retry", "/api/jobs/" + encodeURIComponent(j.id) + "/retry", {}, { name: "retry" })
              : j.status === "queued" || (j.status === "running" && !j.cancel_requested_at)
                ? actionButton("Cancel", "/api/jobs/" + encodeURIComponent(j.id) + "/cancel", {}, { name: "cancel",
                  confirm: j.status === "running" ? "Cancel running job " + j.id + "? Its worker stops it." : null })
                : null)));
        }
        if (!data.jobs.length) body.appendChild(h("tr", {}, h("td", { colspan: 11, class: "dim" }, "no jobs match")));
        table.appendChild(body);
        box.appendChild(table);
      },
    };
  };

  function progressCell(p) {
    if (!p) return "";
    const bar = p.fraction === null ? null : h("progress", { max: "1", value: String(p.fraction) });
    return [bar, " ", h("span", { class: "dim" }, p.text)];
  }

  function errorBlock(err) {
    if (!err) return null;
    return [h("div", { class: "drift" }, (err.type || "error") + ": " + err.message),
      err.traceback ? h("pre", { "data-testid": "traceback" }, err.traceback) : null];
  }

  views.job = (r) => {
    const box = h("div", {});
    view.appendChild(box);
    return {
      async refresh() {
        const j = await api("/api/jobs/" + encodeURIComponent(r.arg));
        clear(box);
        box.append(
          h("h2", {}, j.unit + " · job ", h("span", { class: "mono" }, j.id), " ", status(j.status)),
          h("div", { class: "toolbar" },
            actionButton("Retry", "/api/jobs/" + encodeURIComponent(j.id) + "/retry", {}, { name: "retry", disabled: !j.can_retry }),
            actionButton("Cancel", "/api/jobs/" + encodeURIComponent(j.id) + "/cancel", {}, { name: "cancel", disabled: !j.can_cancel,
              title: j.cancel_note || null,
              confirm: j.status === "running" ? "Cancel running job " + j.id + "? Its worker stops it; it is not retried." : null }),
            j.cancel_note ? h("span", { class: "dim" }, j.cancel_note) : null),
          kv([
            ["queue", j.queue], ["priority", j.priority], ["idempotency key", j.key || "–"], ["deliveries", j.deliveries],
            ["failed attempts", j.attempts], ["codec", j.codec], ["enqueued", when(j.enqueued_at) + " (" + ago(j.enqueued_at) + ")"],
            ["due", when(j.eta)], ["finished", when(j.finished_at)], ["dead letter", j.dead_reason || "–"],
            ["cancel requested", j.cancel_requested_at ? when(j.cancel_requested_at) : "–"],
            ["progress", j.progress ? [progressCell(j.progress), " at " + when(j.progress.at)] : "–"]]),
          h("h3", {}, "Arguments"), h("pre", { "data-testid": "job-args" }, j.args === null ? "–" : j.args),
          j.result !== null ? [h("h3", {}, "Result"), h("pre", {}, j.result)] : null,
          j.error ? [h("h3", {}, "Error"), errorBlock(j.error)] : null,
          h("h3", {}, "Timeline"),
          h("table", {}, h("tbody", {}, j.timeline.map((e) => h("tr", {}, h("td", {}, e.at ? when(e.at) : ""), h("td", {}, status(e.what)), h("td", {}, e.detail))))),
          h("p", { class: "dim" }, "The store keeps counters and times per job, not a per-delivery log; the workers' logs have each delivery."));
      },
    };
  };

  function kv(rows) {
    const shown = (v) => v === null || v === undefined ? "–" : (Array.isArray(v) || v instanceof Node) ? v : String(v);
    return h("div", { class: "kv" }, rows.map(([k, v]) => [h("div", {}, k), h("div", {}, shown(v))]));
  }

  // -- workflows -----------------------------------------------------------------------

  views.workflows = (r) => {
    const p = r.params;
    const form = h("form", { class: "toolbar" },
      h("label", {}, "status", select("status", Object.fromEntries([["", "all"], ...state.meta.workflow_statuses.map((x) => [x, x])]), p.get("status"))),
      h("label", {}, "workflow", h("input", { name: "name", value: p.get("name") || "", placeholder: "any" })),
      h("button", { type: "submit" }, "Filter"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const f = new FormData(form);
      setHash("workflows", { status: f.get("status"), name: f.get("name") });
    });
    const box = h("div", {});
    view.append(form, box);
    return {
      async refresh() {
        const qs = new URLSearchParams();
        for (const k of ["status", "name"]) if (p.get(k)) qs.set(k, p.get(k));
        const data = await api("/api/workflows?" + qs.toString());
        clear(box);
        const table = h("table", { "data-testid": "workflows" },
          h("thead", {}, h("tr", {}, ["id", "workflow", "status", "now", "compensation", "runs", "created", "took"].map((c) => h("th", {}, c)))),
          h("tbody", {}, data.workflows.length ? data.workflows.map((w) => h("tr", { "data-workflow-id": w.id },
            h("td", {}, h("a", { href: "#/workflow/" + encodeURIComponent(w.id), class: "mono" }, w.id)),
            h("td", {}, w.name), h("td", {}, status(w.status), w.cancel_requested && !w.finished_at ? h("span", { class: "drift" }, " cancel requested") : null),
            h("td", {}, w.current_step || (w.finished_at ? "" : "#" + w.position)), h("td", {}, w.compensation || ""),
            h("td", { class: "num" }, w.runs), h("td", {}, ago(w.created_at)),
            h("td", {}, dur((w.finished_at || Date.now() / 1000) - w.created_at))))
            : h("tr", {}, h("td", { colspan: 8, class: "dim" }, "no workflows match"))));
        box.appendChild(table);
      },
    };
  };

  const treeRows = (nodes) => nodes.map((c) => h("li", {},
    h("a", { href: "#/workflow/" + encodeURIComponent(c.id) }, c.id), " " + c.name + " ", status(c.status),
    c.current_step ? h("span", { class: "dim" }, " " + c.current_step) : null,
    c.children.length ? h("ul", {}, treeRows(c.children)) : null));

  views.workflow = (r) => {
    const box = h("div", {});
    const typed = {};
    view.appendChild(box);
    return {
      async refresh() {
        const w = await api("/api/workflows/" + encodeURIComponent(r.arg));
        rerender(box, () => {
        const sigName = kept(typed, "name", h("input", { placeholder: "signal name", "data-testid": "signal-name" }));
        const sigBody = kept(typed, "payload", h("input", { placeholder: "JSON payload (null)", "data-testid": "signal-payload", size: 40 }));
        append(box, [
          h("h2", {}, w.name + " · ", h("span", { class: "mono" }, w.id), " ", status(w.status)),
          h("div", { class: "toolbar" },
            sigName, sigBody,
            actionButton("Signal", "/api/workflows/" + encodeURIComponent(w.id) + "/signal", () => {
              let payload = null;
              if (sigBody.value.trim()) {
                try { payload = JSON.parse(sigBody.value); } catch (e) { toast("payload is not JSON: " + e.message, true); return null; }
              }
              return { name: sigName.value, payload };
            }, { name: "signal", disabled: !w.can_signal }),
            actionButton("Cancel", "/api/workflows/" + encodeURIComponent(w.id) + "/cancel", {}, { name: "cancel", danger: true,
              disabled: !w.can_cancel, confirm: "Cancel " + w.id + "? Its completed steps are compensated." })),
          kv([["compensation", w.compensation || "none"], ["now", w.current_step || "–"], ["position", w.position],
            ["runs", w.runs], ["owner", w.owner ? w.owner + " (lease " + ago(w.lease_until) + ")" : "–"],
            ["wakes", w.wake_at ? when(w.wake_at) + " (" + ago(w.wake_at) + ")" : "–"],
            ["created", when(w.created_at)], ["finished", when(w.finished_at)], ["parent", w.parent_id || "–"],
            ["deadline", w.deadline ? when(w.deadline) + " (" + ago(w.deadline) + ")" : "none"],
            ["origin", w.origin || "–"],
            ["cancel requested", w.cancel_requested ? "yes" : "no"]]),
          w.published ? h("div", {}, h("h3", {}, "Published state"), h("pre", { "data-testid": "published" }, w.published)) : null,
          h("h3", {}, "Arguments"), h("pre", {}, w.args || "–"),
          w.result ? h("div", {}, h("h3", {}, "Result"), h("pre", {}, w.result)) : null,
          w.error ? h("div", {}, h("h3", {}, "Error"), errorBlock(w.error)) : null,
          h("h3", {}, "Step history"),
          h("table", { "data-testid": "history" },
            h("thead", {}, h("tr", {}, ["#", "kind", "name", "status", "tries", "at", "took", "detail"].map((c) => h("th", {}, c)))),
            h("tbody", {}, w.history.map((e) => h("tr", { "data-position": e.position },
              h("td", { class: "num" }, e.position), h("td", {}, e.kind + (e.kind === "undo" ? " #" + e.ref : "")), h("td", {}, e.name),
              h("td", {}, status(e.status)), h("td", { class: "num" }, e.attempts || ""),
              h("td", {}, "+" + dur(e.started_at - w.created_at)), h("td", {}, e.took === null ? "…" : dur(e.took)),
              h("td", {}, e.error ? (e.error.type.split(".").pop() + ": " + e.error.message) : (e.wake_at ? "wakes " + ago(e.wake_at) : (e.detail || e.result || ""))))))),
          w.compensated.length ? h("p", { class: "warn" }, "compensated steps: " + w.compensated.map((x) => "#" + x).join(", ")) : null,
          h("h3", {}, "Timers"),
          w.timers.length ? h("table", {}, h("tbody", {}, w.timers.map((t) => h("tr", {}, h("td", {}, "#" + t.position + " " + t.kind + " " + t.name),
            h("td", {}, t.wake_at ? when(t.wake_at) + " (" + ago(t.wake_at) + ")" : "until a signal")))))
            : h("p", { class: "dim" }, "none pending"),
          h("h3", {}, "Inbox"),
          w.inbox.length ? h("table", { "data-testid": "inbox" }, h("tbody", {}, w.inbox.map((sg) => h("tr", {}, h("td", {}, "#" + sg.seq), h("td", {}, sg.name),
            h("td", { class: "mono" }, sg.payload), h("td", {}, sg.consumed_position === null ? "waiting" : "consumed at #" + sg.consumed_position)))))
            : h("p", { class: "dim" }, "empty"),
          w.tree.length ? h("div", {}, h("h3", {}, "Children"), h("ul", { class: "tree", "data-testid": "children" }, treeRows(w.tree))) : null]);
        });
      },
    };
  };

  // -- streams -------------------------------------------------------------------------

  views.streams = () => {
    const box = h("div", {});
    const typed = {};
    view.appendChild(box);
    return {
      async refresh() {
        const data = await api("/api/streams");
        rerender(box, () => {
        if (!data.streams.length) box.appendChild(h("p", { class: "dim" }, "no streams in this log"));
        for (const st of data.streams) {
          box.appendChild(h("h2", {}, st.stream, h("span", { class: "dim" }, " · " + st.partitions + " partitions · " + st.events + " events retained")));
          for (const g of st.groups) {
            const key = st.stream + "/" + g.group;
            const where = kept(typed, key + ":where", h("select", { "data-testid": "replay-from" },
              ["offset", "ago", "beginning", "end"].map((k) => h("option", { value: k }, k))));
            const value = kept(typed, key + ":value", h("input", { placeholder: "offset, or seconds ago", size: 16, "data-testid": "replay-value" }));
            const parts = kept(typed, key + ":parts", h("input", { placeholder: "partitions (all)", size: 12 }));
            const replay = actionButton("Replay", "/api/streams/" + encodeURIComponent(st.stream) + "/groups/" + encodeURIComponent(g.group) + "/replay", () => {
              const body = {};
              if (where.value === "beginning" || where.value === "end") body[where.value] = true;
              else {
                const n = Number(value.value);
                if (!value.value.trim() || !isFinite(n)) { toast("give a number", true); return null; }
                body[where.value] = where.value === "offset" ? Math.trunc(n) : n;
              }
              if (parts.value.trim()) body.partitions = parts.value.split(",").map((x) => Number(x.trim()));
              return body;
            }, { name: "replay", confirm: "Move group " + g.group + "? Its consumers re-deliver from there." });
            box.appendChild(h("h3", {}, "group " + g.group + " · lag " + g.lag));
            box.appendChild(h("table", { "data-testid": "partitions", "data-group": g.group },
              h("thead", {}, h("tr", {}, ["partition", "committed", "end", "first", "pending", "lag", "owner"].map((c) => h("th", {}, c)))),
              h("tbody", {}, g.partitions.map((pt) => h("tr", {},
                h("td", { class: "num" }, pt.partition), h("td", { class: "num" }, pt.committed), h("td", { class: "num" }, pt.end),
                h("td", { class: "num" }, pt.first), h("td", { class: "num" }, pt.pending),
                h("td", { class: "num" }, String(pt.lag) + (pt.behind_retention ? " (behind retention)" : "")),
                h("td", {}, pt.owners.length ? pt.owners.map((o) => h("div", {}, o.consumer + " ", status(o.state))) : h("span", { class: "dim" }, "unknown")))))));
            box.appendChild(h("div", { class: "toolbar" }, "replay from", where, value, parts, replay,
              h("a", { href: "#/streamdead/" + encodeURIComponent(st.stream) + "?group=" + encodeURIComponent(g.group) }, "dead letters")));
          }
        }
        });
      },
    };
  };

  views.streamdead = (r) => {
    const box = h("div", {});
    view.appendChild(box);
    return {
      async refresh() {
        const group = r.params.get("group");
        const data = await api("/api/streams/" + encodeURIComponent(r.arg) + "/dead" + (group ? "?group=" + encodeURIComponent(group) : ""));
        clear(box);
        box.appendChild(h("h2", {}, "dead letters of " + r.arg + (group ? " · group " + group : "")));
        box.appendChild(h("table", { "data-testid": "stream-dead" },
          h("thead", {}, h("tr", {}, ["when", "group", "where", "event", "deliveries", "reason", "event data"].map((c) => h("th", {}, c)))),
          h("tbody", {}, data.dead.map((d) => h("tr", {}, h("td", {}, when(d.dead_at)), h("td", {}, d.group),
            h("td", {}, "p" + d.partition + "@" + d.offset + (d.last_offset ? ".." + d.last_offset : "")), h("td", { class: "mono" }, d.id || "–"),
            h("td", { class: "num" }, d.deliveries), h("td", {}, d.reason, d.error ? errorBlock(d.error) : null),
            h("td", { class: "mono" }, d.payload === null ? "–" : d.payload))))));
      },
    };
  };

  // -- fleet ---------------------------------------------------------------------------

  views.fleet = () => {
    const box = h("div", {});
    view.appendChild(box);
    return {
      refresh() {
        const fleet = (state.live && state.live.fleet) || [];
        clear(box);
        box.appendChild(h("p", { class: "dim" }, "Each process reports every second; one silent for three intervals (or whose pid is gone, on this host) is down."));
        box.appendChild(h("table", { "data-testid": "fleet" },
          h("thead", {}, h("tr", {}, ["state", "role", "process", "host", "pid", "uptime", "last report", "serves", "in flight", "completed"].map((c) => h("th", {}, c)))),
          h("tbody", {}, fleet.length ? fleet.map((m) => h("tr", { "data-member": m.id, "data-state": m.state, "data-pid": m.pid },
            h("td", { title: m.why }, status(m.state), h("div", { class: "dim" }, m.why)),
            h("td", {}, m.role), h("td", { class: "mono" }, (m.details && m.details.name) || m.id),
            h("td", {}, m.host), h("td", { class: "num" }, m.pid === null ? "–" : m.pid),
            h("td", {}, m.uptime === null ? "–" : dur(m.uptime)), h("td", {}, m.beat_at ? ago(m.beat_at) : "never"),
            h("td", {}, serves(m.details || {})),
            h("td", { class: "num" }, m.state === "up" ? num(m.in_flight) : "–"), h("td", { class: "num" }, num(m.completed))))
            : h("tr", {}, h("td", { colspan: 10, class: "dim" }, "no process has reported: start a worker (foundry worker app.py) or pass --url EXPORTER")))));
      },
    };
  };

  function serves(d) {
    const out = [];
    if (d.queues) out.push("queues " + d.queues.join(", "));
    if (d.workflows) out.push("workflows " + d.workflows.join(", "));
    if (d.pool) out.push("pool " + d.pool.map((u) => u + (d.workers && d.workers[u] ? " (" + d.workers[u].busy + "/" + d.workers[u].live + " busy)" : "")).join(", "));
    if (d.streams) out.push(d.streams.map((x) => x.stream + "/" + x.group + " p" + (x.owned || []).join(",")).join("; "));
    if (d.exporter) out.push("exporter " + d.exporter);
    return out.join(" · ");
  }

  // -- start ---------------------------------------------------------------------------

  async function start() {
    try {
      state.meta = await api("/api/meta");
    } catch (err) {
      banner("cannot reach the dashboard API: " + err.message, true);
      return;
    }
    state.poll = Math.max(1, state.meta.poll);
    state.window = state.meta.window;
    document.getElementById("app-name").textContent = state.meta.app || "";
    const engines = document.getElementById("engines");
    for (const [k, v] of Object.entries(state.meta.engines)) engines.appendChild(h("span", {}, k + " " + v));
    window.addEventListener("hashchange", show);
    await poll();
    show();
  }

  start();
})();
