"use strict";
(() => {
  const { el } = FT;

  // The row's own 95% interval (mean over items +- 1.96 standard errors).
  function interval(r) {
    return r.interval ? `[${FT.num(r.interval[0])}, ${FT.num(r.interval[1])}]` : "–";
  }

  // A paired difference or interval end, signed as the verdict's words sign it (+0.0000 too).
  function sg(x) { return (x >= 0 ? "+" : "") + FT.num(x); }

  // Against the leader: the paired difference and its interval on the shared items, or why there is none
  // (no pairing, no standing: two intervals overlapping is no test of the difference).
  function vsLeader(r) {
    if (r.standing === "leader") return el("span", { class: "badge yes", text: "leader" });
    const p = r.vs_leader;
    const badge = r.standing === "tied" ? el("span", { class: "badge muted", text: "tied" }) : null;
    if (!p) return el("span", { title: r.vs_leader_note || "" }, el("span", { class: "muted", text: "not paired" }));
    const pText = p.p_value < 0.001 ? "p < 0.001" : `p = ${p.p_value.toFixed(3)}`;
    // Holm's level for this row, when the board has more than one comparison with the leader.
    const level = p.comparisons > 1 ? ` at ${(p.level * 100).toFixed(1)}%` : "";
    return el("span", { title: p.summary }, badge, " ", sg(p.difference),
      ` [${sg(p.ci_low)}, ${sg(p.ci_high)}]${level} `, el("span", { class: "muted", text: `${pText}, ${p.items} items` }));
  }

  function board(b) {
    const arrow = b.higher_is_better ? "higher is better" : "lower is better";
    return el("section", { class: "board", "data-base-model": b.base_model, "data-benchmark": b.benchmark },
      el("h2", {}, el("span", { text: b.base_model }), " on ", el("span", { text: b.benchmark }),
        el("small", { class: "scorer", text: ` ${b.primary_metric || "score"} (scorer ${b.scorer || "–"}, protocol ${b.protocol || "–"}) · ${arrow} · ${b.rows.length} candidates` })),
      el("table", { class: "grid lb" },
        el("thead", {}, el("tr", {}, ...["#", "request", "validation", "95% interval", "vs leader (paired, Holm-corrected 95%)", "baseline", "difference", "test (hidden)",
          "training", "decision"].map((h) => el("th", { text: h })))),
        el("tbody", {}, ...b.rows.map((r) => el("tr", { "data-request-id": r.request_id, "data-rank": r.rank,
          "data-standing": r.standing || "", "data-tie-basis": r.tie_basis || "", class: r.standing === "tied" ? "tied" : null },
          // A candidate tied with the leader shares its rank: a difference inside the noise ranks nothing.
          el("td", { class: "rank", text: r.standing === "tied" ? "=1" : r.rank,
            title: r.standing === "tied" ? "tied with the leader: not distinguishable at 95% family-wise (Holm over the board's comparisons with the leader)" : null }),
          el("td", {}, el("a", { href: "/requests/" + encodeURIComponent(r.request_id), text: r.request_id })),
          el("td", { class: "num val", text: FT.num(r.validation) }),
          el("td", { class: "num interval", text: interval(r) }),
          el("td", { class: "vs-leader" }, vsLeader(r)),
          el("td", { class: "num", text: FT.num(r.baseline) }),
          el("td", { class: "num " + (r.difference > 0 ? "up" : r.difference < 0 ? "down" : ""), text: FT.signed(r.difference) }),
          el("td", { class: "num", text: FT.num(r.test) }),
          el("td", { class: "num", text: FT.duration(r.train_s) }),
          el("td", {}, FT.decisionBadge(r.final_decision, r)))))));
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
