"use strict";
// The campaigns list (/campaigns) and one campaign (/campaigns/<name>): its incumbent and history.
(() => {
  const { el } = FT;
  const link = (rid) => el("a", { href: "/requests/" + encodeURIComponent(rid), text: rid });
  const level = (x) => (x === null || x === undefined ? "–" : x.toPrecision(3));
  const badge = (accepted) => el("span", { class: "badge " + (accepted ? "yes" : "no"), text: accepted ? "accepted" : "refused" });

  async function list() {
    const data = await FT.getJSON("/api/campaigns");
    FT.fill(document.querySelector("#campaigns tbody"), ...data.campaigns.map((c) =>
      el("tr", { "data-campaign": c.name },
        el("td", {}, el("a", { href: "/campaigns/" + encodeURIComponent(c.name), text: c.name })),
        el("td", { text: c.benchmark }), el("td", { text: c.base_model }),
        el("td", { class: "incumbent" }, c.incumbent ? link(c.incumbent) : el("span", { class: "muted", text: "none yet" })),
        el("td", { class: "num", text: c.incumbents }), el("td", { class: "num", text: c.judged }),
        el("td", { class: "num", text: c.tested }), el("td", { class: "num", text: level(c.next_level) }),
        el("td", {}, el("span", { "data-since": c.updated_at || "", text: FT.age(c.updated_at) }), el("span", { class: "muted", text: " ago" })))));
    document.getElementById("no-campaigns").hidden = data.campaigns.length > 0;
  }

  async function one(name) {
    const res = await fetch("/api/campaigns/" + encodeURIComponent(name));
    document.getElementById("campaign-missing").hidden = res.status !== 404;
    if (!res.ok) return;
    const c = await res.json();
    FT.fill(document.getElementById("campaign-task"), el("span", { text: `${c.base_model} on ${c.benchmark}` }),
      el("span", { class: "muted", text: ` · ${c.tested} tested (${c.procedure}, campaign alpha ${c.alpha}), next one-sided level ${level(c.next_level)}` }));
    FT.fill(document.getElementById("incumbent"), ...(c.incumbent
      ? [link(c.incumbent)] : [el("span", { class: "muted", text: "none yet: the next candidate is compared with the base model" })]));
    FT.fill(document.getElementById("incumbents"), ...c.incumbent_history.map((e) =>
      el("li", { "data-request-id": e.request_id }, link(e.request_id), el("span", { class: "muted", text: ` accepted as #${e.index}, ` }),
        el("span", { "data-since": e.judged_at || "", text: FT.age(e.judged_at) }), el("span", { class: "muted", text: " ago" }))));
    FT.fill(document.querySelector("#history tbody"), ...c.history.map((e) =>
      el("tr", { "data-request-id": e.request_id, "data-accepted": String(e.accepted) },
        el("td", { text: e.index ?? "–" }), el("td", {}, link(e.request_id)),
        el("td", {}, el("span", { "data-since": e.judged_at || "", text: FT.age(e.judged_at) }), el("span", { class: "muted", text: " ago" })),
        el("td", {}, e.incumbent ? link(e.incumbent) : el("span", { class: "muted", text: "the base model" })),
        el("td", { class: "num", text: level(e.level) }), el("td", {}, badge(e.accepted)),
        el("td", { class: "reason", text: e.summary }))));
  }

  const root = document.getElementById("campaign");
  async function load() {
    await (root ? one(root.dataset.campaign) : list());
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  }
  const reload = FT.serial(load);
  const soon = FT.debounce(reload, 300);
  // A judged request changes its record; the campaign changed with it.
  FT.live((notice) => { if (notice.type === "records" || notice.type === "reopen") soon(); });
  reload();
})();
