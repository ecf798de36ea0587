"use strict";
(() => {
  const { el } = FT;

  async function load() {
    const data = await FT.getJSON("/api/dead-letters");
    document.getElementById("dl-total").textContent = data.total === null ? "" : `${data.total} in the stream`;
    FT.fill(document.querySelector("#dead-letters tbody"), ...data.dead_letters.map((d) =>
      el("tr", { "data-seq": d.seq },
        el("td", { text: d.seq }),
        el("td", { "data-since": d.emitted_at || "", text: FT.age(d.emitted_at) }),
        el("td", {}, d.request_id ? el("a", { href: "/requests/" + encodeURIComponent(d.request_id), text: d.request_id }) : "–"),
        el("td", { text: d.stage || "–" }),
        el("td", {}, el("code", { text: d.original_subject || "–" })),
        el("td", { class: "num", text: d.deliveries ?? "–" }),
        el("td", { class: "reason", text: d.reason || "" }))));
    document.getElementById("no-dead").hidden = data.dead_letters.length > 0;
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  }

  const reload = FT.serial(load);
  const soon = FT.debounce(reload, 300);
  FT.live((notice) => { if (notice.type === "stages" || notice.type === "reopen") soon(); });
  reload();
})();
