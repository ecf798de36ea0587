// ftbus dashboard: helpers shared by every page. No framework: DOM built with textContent only
// (verdict texts and logs come from candidate code and are never parsed as HTML).
"use strict";
const FT = (() => {
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else if (key === "style") node.setAttribute("style", value);
      else node[key] = value;
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function num(value, digits = 4) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    return Number(value).toFixed(digits);
  }

  function signed(value, digits = 4) {
    if (value === null || value === undefined) return "–";
    const text = Number(value).toFixed(digits);
    return value > 0 ? "+" + text : text;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const s = Math.max(0, seconds);
    if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.round((s % 86400) / 3600) + " h";
  }

  // The server's clock, not the browser's: ages are "now on the server" minus a server timestamp.
  let skewMs = 0;
  function setServerNow(iso) { if (iso) skewMs = Date.parse(iso) - Date.now(); }
  function age(iso) { return iso ? duration((Date.now() + skewMs - Date.parse(iso)) / 1000) : "–"; }

  function tickAges() {
    for (const node of document.querySelectorAll("[data-since]")) node.textContent = age(node.dataset.since);
    const clock = document.getElementById("clock");
    if (clock) clock.textContent = new Date(Date.now() + skewMs).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }
  setInterval(tickAges, 1000);
  document.addEventListener("DOMContentLoaded", tickAges);

  // replaceChildren that skips null/false (optional parts of a view).
  function fill(node, ...children) {
    node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
    return node;
  }

  function debounce(fn, ms) {
    let timer = null;
    return (...args) => { clearTimeout(timer); timer = setTimeout(() => fn(...args), ms); };
  }

  // Re-runs `fn` when the previous run has finished: a burst of notices costs one fetch at a time.
  function serial(fn) {
    let running = false, again = false;
    const run = async () => {
      if (running) { again = true; return; }
      running = true;
      try { await fn(); } catch (err) { console.error(err); }
      running = false;
      if (again) { again = false; run(); }
    };
    return run;
  }

  async function getJSON(url) {
    const response = await fetch(url, { cache: "no-store" });
    const body = await response.json();
    if (!response.ok) { const err = new Error(body.error || response.statusText); err.status = response.status; throw err; }
    return body;
  }

  const conn = { sse: false, nats: null, reconnects: 0 };
  function showConn() {
    const badge = document.getElementById("conn");
    if (!badge) return;
    let text, cls;
    if (!conn.sse) { text = "live: reconnecting…"; cls = "bad"; }
    else if (conn.nats === false) { text = "live · NATS reconnecting…"; cls = "warn"; }
    else { text = "live" + (conn.reconnects ? ` · NATS reconnected ×${conn.reconnects}` : ""); cls = "ok"; }
    badge.textContent = text;
    badge.className = "conn " + cls;
    badge.dataset.state = cls;
  }
  function noteConnection(info) {
    if (!info) return;
    if ("connected" in info) conn.nats = !!info.connected;
    if ("reconnects" in info) conn.reconnects = info.reconnects;
    showConn();
  }

  // Live notices from /events. The browser's EventSource reconnects by itself (the dashboard
  // restarted, a proxy dropped the stream): on every (re)open the page re-reads everything.
  function live(onNotice) {
    const source = new EventSource("/events");
    source.addEventListener("open", () => { conn.sse = true; showConn(); onNotice({ type: "reopen" }); });
    source.addEventListener("error", () => { conn.sse = false; showConn(); });
    source.addEventListener("notice", (event) => {
      const notice = JSON.parse(event.data);
      if (notice.type === "connection" || notice.type === "hello") noteConnection(notice);
      onNotice(notice);
    });
    window.addEventListener("beforeunload", () => source.close());
    return source;
  }

  // A request that ended in a stage's failure (data processing, training, a benchmark...) is
  // "completed" for the pipeline but failed for its author: it shows "failed", red, never a green pill.
  function statusBadge(status, failedStage) {
    if (status === "completed" && failedStage) {
      return el("span", { class: "badge s-failed", "data-status": "failed", title: "failed in " + failedStage, text: "failed" });
    }
    return el("span", { class: "badge s-" + status, "data-status": status, text: status });
  }
  // "rejected" only for a model that went through the pipeline and was judged not good enough; a
  // request that failed in a stage, was cancelled or hit an error has no decision on its model.
  function decisionBadge(decision, request) {
    const failed = request && (request.failed_stage || (request.status && request.status !== "completed"));
    if (decision === null || decision === undefined || (failed && !decision)) {
      const why = failed ? (request.failed_stage ? "failed in " + request.failed_stage : request.status) + ": not judged" : null;
      return el("span", { class: "badge muted", "data-decision": "none", title: why, text: "–" });
    }
    // Under judge_policy=better (the default) "accepted" means better than the base model, confirmed on
    // hidden items; under any other policy it means less, and the pill says so rather than look the same.
    const policy = request && request.policy;
    const looser = policy && policy !== "better";
    const answer = request && request.answer;
    const said = { better: "better", indistinguishable: "not better", worse: "worse" }[answer];
    let text = decision ? "accepted" : "rejected";
    if (!decision && said) text += ": " + said;
    if (decision && looser) text += " (policy " + policy + ": not shown better)";
    const title = [request && request.answer_summary, looser ? "judge_policy=" + policy + ": accepted does not mean better" : null]
      .filter(Boolean).join("; ") || null;
    return el("span", { class: "badge " + (decision ? (looser ? "yes looser" : "yes") : "no"),
                        "data-decision": decision ? "accepted" : "rejected", "data-policy": policy || "",
                        "data-answer": answer || "", title, text });
  }

  return { el, fill, num, signed, duration, age, setServerNow, tickAges, debounce, serial, getJSON, live, noteConnection,
           statusBadge, decisionBadge };
})();
