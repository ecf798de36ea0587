"use strict";
(() => {
  const { el } = FT;
  function card(s) {
    const stat = (label, value, key) => el("div", { class: "stat", "data-key": key },
      el("span", { class: "v", text: value }), el("span", { class: "l", text: label }));
    return el("div", { class: "card" + (s.error ? " off" : s.pending > 0 ? " busy" : ""), "data-stage": s.stage },
      el("h3", {}, s.label, el("code", { text: s.consumer })),  // the label: the pipeline table's (ftbus/stages.py)
      el("div", { class: "stats" },
        stat("pending", s.pending, "pending"),
        stat("in flight", s.in_flight, "in_flight"),
        stat("redeliveries", s.redeliveries, "redeliveries"),
        stat("workers bound", s.workers, "workers")),
      s.error ? el("p", { class: "err", text: s.error }) : null);
  }

  function progressCell(r) {
    const p = r.progress;
    if (!p) return el("td", { class: "muted", text: "" });
    let text = p.stage + " " + p.state;
    if (p.step !== null && p.total) text = `step ${p.step}/${p.total}` + (p.loss !== null ? ` · loss ${FT.num(p.loss)}` : "");
    const pct = p.step !== null && p.total ? Math.round(100 * p.step / p.total) : null;
    return el("td", { class: "prog" },
      pct !== null ? el("div", { class: "bar" }, el("div", { style: `width:${pct}%` })) : null, el("span", { text }));
  }

  function row(r) {
    return el("tr", { "data-request-id": r.request_id, "data-status": r.status },
      el("td", {}, el("a", { href: "/requests/" + encodeURIComponent(r.request_id), text: r.request_id })),
      el("td", {}, FT.statusBadge(r.status, r.failed_stage)),
      el("td", { class: "stage", text: r.failed_stage ? "failed: " + r.failed_stage
        : ["completed", "cancelled"].includes(r.status) ? "done" : (r.stage || "–") }),
      progressCell(r),
      el("td", { text: r.base_model || "–" }),
      el("td", { text: r.benchmark || "–" }),
      el("td", { "data-since": r.submitted_at || "", text: FT.age(r.submitted_at) }),
      el("td", {}, FT.decisionBadge(r.final_decision, r)));
  }

  async function load() {
    const data = await FT.getJSON("/api/overview");
    FT.setServerNow(data.now);
    FT.noteConnection(data.connection);
    FT.fill(document.getElementById("stages"), ...data.stages.map(card));
    const order = ["queued", "running", "completed", "error", "cancelled"];
    FT.fill(document.getElementById("summary"), ...order.filter((k) => data.counts[k]).map((k) =>
      el("span", { class: "count s-" + k, "data-status": k }, el("b", { text: data.counts[k] }), " " + k)));
    const dlq = document.getElementById("dlq-count");
    dlq.textContent = data.dead_letters === null ? "?" : data.dead_letters;
    document.getElementById("dlq").classList.toggle("has", !!data.dead_letters);
    FT.fill(document.querySelector("#requests tbody"), ...data.requests.map(row));
    document.getElementById("no-requests").hidden = data.requests.length > 0;
    document.getElementById("req-count").textContent =
      data.total > data.requests.length ? `newest ${data.requests.length} of ${data.total}` : `${data.total}`;
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  }

  const reload = FT.serial(load);
  const soon = FT.debounce(reload, 150);
  let lastProgress = 0;
  FT.live((notice) => {
    if (notice.type === "progress") {
      const now = Date.now();  // progress can come many times a second: redraw at most twice a second
      if (now - lastProgress > 500) { lastProgress = now; soon(); }
    } else if (notice.type !== "hello") {
      soon();
    }
  });
  reload();
})();
