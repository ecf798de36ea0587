"use strict";
(() => {
  const { el } = FT;

  function board(b) {
    const arrow = b.higher_is_better ? "higher is better" : "lower is better";
    return el("section", { class: "board", "data-base-model": b.base_model, "data-benchmark": b.benchmark },
      el("h2", {}, el("span", { text: b.base_model }), " on ", el("span", { text: b.benchmark }),
        el("small", { class: "scorer", text: ` ${b.primary_metric || "score"} (scorer ${b.scorer || "–"}) · ${arrow} · ${b.rows.length} candidates` })),
      el("table", { class: "grid lb" },
        el("thead", {}, el("tr", {}, ...["#", "request", "validation", "baseline", "difference", "test (hidden)",
          "training", "decision"].map((h) => el("th", { text: h })))),
        el("tbody", {}, ...b.rows.map((r) => el("tr", { "data-request-id": r.request_id, "data-rank": r.rank },
          el("td", { class: "rank", text: r.rank }),
          el("td", {}, el("a", { href: "/requests/" + encodeURIComponent(r.request_id), text: r.request_id })),
          el("td", { class: "num val", text: FT.num(r.validation) }),
          el("td", { class: "num", text: FT.num(r.baseline) }),
          el("td", { class: "num " + (r.difference > 0 ? "up" : r.difference < 0 ? "down" : ""), text: FT.signed(r.difference) }),
          el("td", { class: "num", text: FT.num(r.test) }),
          el("td", { class: "num", text: FT.duration(r.train_s) }),
          el("td", {}, FT.decisionBadge(r.final_decision)))))));
  }

  async function load() {
    const data = await FT.getJSON("/api/leaderboard");
    FT.fill(document.getElementById("boards"), ...data.boards.map(board));
    document.getElementById("no-boards").hidden = data.boards.length > 0;
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  }

  const reload = FT.serial(load);
  const soon = FT.debounce(reload, 200);
  FT.live((notice) => { if (notice.type === "records" || notice.type === "reopen") soon(); });
  reload();
})();
