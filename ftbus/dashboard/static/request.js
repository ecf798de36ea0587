"use strict";
(() => {
  const { el } = FT;
  const root = document.getElementById("request");
  const RID = root.dataset.requestId;

  function timeline(rows) {
    const span = Math.max(1e-9, ...rows.map((r) => (r.offset_s || 0) + (r.elapsed_s || 0)));
    return rows.map((r) => {
      const left = 100 * (r.offset_s || 0) / span, width = Math.max(0.8, 100 * (r.elapsed_s || 0) / span);
      const cls = r.running ? "run" : r.ok === false ? "fail" : r.ok ? "ok" : "wait";
      return el("tr", { "data-stage": r.stage, "data-attempts": r.attempts },
        el("td", { text: r.stage }),
        el("td", { class: "num", text: r.attempts }),
        el("td", { class: "num", text: FT.duration(r.elapsed_s) + (r.running ? " …" : "") }),
        el("td", { class: "barcol" }, el("div", { class: "gantt" },
          el("div", { class: "g " + cls, style: `left:${left}%;width:${Math.min(width, 100 - left)}%`,
                      title: `${r.started_at || ""} → ${r.finished_at || "running"}` }))),
        el("td", { text: r.ok === null ? (r.running ? "running" : "–") : r.ok ? "yes" : "no" }));
    });
  }

  function drawLoss(loss) {
    const div = document.getElementById("loss");
    const train = loss.train || [];
    const traces = [{
      x: train.map((p) => p.step), y: train.map((p) => p.loss), name: "train loss",
      mode: "lines+markers", line: { color: "#2563eb", width: 2 }, marker: { size: 6 },
    }];
    if (loss.eval && loss.eval.length) {
      traces.push({ x: loss.eval.map((p) => p.step), y: loss.eval.map((p) => p.loss), name: "eval loss",
                    mode: "markers", marker: { size: 9, symbol: "diamond", color: "#f59e0b" } });
    }
    const layout = {
      margin: { l: 50, r: 10, t: 10, b: 40 }, height: 260, showlegend: traces.length > 1,
      legend: { orientation: "h", y: 1.12 },
      xaxis: { title: { text: "step" }, range: loss.total ? [0, loss.total + 0.5] : undefined, zeroline: false },
      yaxis: { title: { text: "loss" }, zeroline: false },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fbfbfd",
    };
    Plotly.react(div, traces, layout, { displayModeBar: false, responsive: true, staticPlot: false });
    div.dataset.points = String(train.length);
    div.dataset.source = loss.source;
    const label = { history: "complete, from the loss history", live: "live, from progress events", none: "no points yet" };
    document.getElementById("loss-source").textContent =
      label[loss.source] + (loss.total && loss.source === "live" ? ` (${train.length}/${loss.total} steps)` : "");
  }

  function scoresTable(v) {
    const rows = v.rows.map((r) => el("tr", { "data-subset": r.subset, "data-metric": r.metric },
      el("td", { text: r.subset }), el("td", { text: r.metric }),
      el("td", { class: "num cand", text: FT.num(r.candidate) }),
      el("td", { class: "num base", text: FT.num(r.baseline) }),
      el("td", { class: "num diff " + (r.difference > 0 ? "up" : r.difference < 0 ? "down" : ""), text: FT.signed(r.difference) })));
    return [
      el("table", { class: "grid", id: "validation-table" },
        el("thead", {}, el("tr", {}, ...["subset", "metric", "candidate", "baseline", "difference"].map((h) => el("th", { text: h })))),
        el("tbody", {}, ...rows),
        el("tfoot", {}, el("tr", {}, el("td", { text: "primary" }), el("td", { text: v.primary_metric || "–" }),
          el("td", { class: "num", text: FT.num(v.candidate_value) }), el("td", { class: "num", text: FT.num(v.baseline_value) }),
          el("td", { class: "num " + (v.difference > 0 ? "up" : v.difference < 0 ? "down" : ""), text: FT.signed(v.difference) })))),
      el("p", { class: "scorer", id: "validation-scorer", text: "scorer: " + (v.scorer || "–") + " · protocol: " + (v.protocol || "–") }),
      v.decision ? el("p", { id: "decision-summary", class: "decision " + v.decision.answer, "data-answer": v.decision.answer,
                             text: "decision: " + v.decision.answer + ": " + v.decision.summary }) : null,
      pairedComparison(v.paired, v.summary),
      ...(v.notes || []).map((n) => el("p", { class: "note", text: n })),
    ];
  }

  // A paired difference or interval end, signed as the verdict's words sign it (+0.0000 too).
  function sg(x) { return (x >= 0 ? "+" : "") + FT.num(x); }

  // The paired comparison with the base model on the same items: the words, then the numbers they rest on.
  function pairedComparison(p, summary) {
    if (!p) return summary ? el("p", { class: "muted", id: "paired-summary", text: summary }) : null;
    const cls = p.direction === "better" ? "up" : p.direction === "worse" ? "down" : "";
    const pText = p.p_value < 0.001 ? "< 0.001" : p.p_value.toFixed(3);
    const test = p.test === "mcnemar" ? `${p.method} (${p.candidate_only} items only the candidate got right, ${p.baseline_only} only the base model)`
      : p.method;
    return el("div", { id: "paired", "data-direction": p.direction },
      el("p", { id: "paired-summary", class: "paired " + cls, text: summary || "" }),
      el("table", { class: "grid", id: "paired-table" },
        el("thead", {}, el("tr", {}, ...["difference", `${Math.round(p.level * 100)}% CI`, "p", "items", "test"].map((h) => el("th", { text: h })))),
        el("tbody", {}, el("tr", {},
          el("td", { class: "num " + cls, text: sg(p.difference) }),
          el("td", { class: "num ci", text: `${sg(p.ci_low)} to ${sg(p.ci_high)}` }),
          el("td", { class: "num p", text: pText }),
          el("td", { class: "num items", text: p.items }),
          el("td", { class: "muted", text: test })))));
  }

  function testTable(t) {
    const out = [];
    if (t.rows.length) {
      out.push(el("table", { class: "grid", id: "test-table" },
        el("thead", {}, el("tr", {}, ...["subset", "metric", "score"].map((h) => el("th", { text: h })))),
        el("tbody", {}, ...t.rows.map((r) => el("tr", { "data-subset": r.subset },
          el("td", { text: r.subset }), el("td", { text: r.metric }), el("td", { class: "num", text: FT.num(r.value) })))),
        el("tfoot", {}, el("tr", {}, el("td", { text: "primary" }), el("td", { text: t.primary_metric || "–" }),
          el("td", { class: "num", text: FT.num(t.primary_value) })))));
      out.push(el("p", { class: "scorer", id: "test-protocol", text: "protocol: " + (t.protocol || "–") }));
    }
    if (t.error) out.push(el("p", { class: "err", text: t.error }));
    return out;
  }

  function feedback(f, judge) {
    const keys = ["execution", "return_checking", "code", "raw_execution"];
    const who = judge ? (judge.kind === "llm" ? `LLM judge (${judge.model})` : `rules (${judge.reason || "no LLM configured"})`) : "";
    return [
      who ? el("p", { class: "muted", text: "judge: " + who }) : null,
      el("div", { class: "texts" }, ...keys.map((k) => el("details", { open: k !== "raw_execution", "data-field": k },
        el("summary", { text: k }), el("pre", { text: f[k] || "" })))),
    ];
  }

  function dataStats(d, cached) {
    const cols = Object.entries(d.token_stats || {});
    return [
      el("p", {}, el("b", { text: d.total_samples }), " samples · tokenizer ", el("code", { text: d.tokenizer }),
        cached ? el("span", { class: "badge muted", text: "cached" }) : null),
      cols.length ? el("table", { class: "grid" },
        el("thead", {}, el("tr", {}, ...["column", "empty", "min", "p50", "p99", "max"].map((h) => el("th", { text: h + (h === "column" ? "" : "") })))),
        el("tbody", {}, ...cols.map(([name, c]) => el("tr", {}, el("td", { text: name }), el("td", { class: "num", text: c.empty_count }),
          el("td", { class: "num", text: c.min_tokens }), el("td", { class: "num", text: c.p50_tokens }),
          el("td", { class: "num", text: c.p99_tokens }), el("td", { class: "num", text: c.max_tokens }))))) : null,
      d.stdout_summary ? el("details", {}, el("summary", { text: "process_data.py output" }), el("pre", { text: d.stdout_summary })) : null,
    ];
  }

  function sandboxBadge(sandbox) {
    if (!sandbox) return null;
    if (sandbox === "local") {
      return el("span", { class: "badge no", "data-sandbox": sandbox, text: "no sandbox",
        title: "sandbox=local: the candidate's code ran without isolation (development only)" });
    }
    return el("span", { class: "badge muted", "data-sandbox": sandbox, text: "sandbox " + sandbox,
      title: "the candidate's code ran in this sandbox (docs/sandbox.md)" });
  }

  function llmUsage(u) {
    const budget = [u.budget_requests ? `${u.budget_requests} calls` : null, u.budget_tokens ? `${u.budget_tokens} tokens` : null,
      u.budget_wall_s ? FT.duration(u.budget_wall_s) : null].filter(Boolean).join(", ");
    return el("p", { "data-llm-usage": "" }, "LLM calls by process_data.py: ", el("b", { text: u.requests }),
      ` · ${u.prompt_tokens} prompt + ${u.completion_tokens} completion tokens`,
      u.refused ? el("span", { class: "badge no", text: `${u.refused} refused (budget spent)` }) : null,
      budget ? el("span", { class: "muted", text: ` · budget ${budget}` }) : null);
  }

  async function load() {
    let d;
    try {
      d = await FT.getJSON("/api/requests/" + encodeURIComponent(RID));
    } catch (err) {
      if (err.status === 404) { document.getElementById("missing").hidden = false; return; }
      throw err;
    }
    document.getElementById("missing").hidden = true;
    const status = document.getElementById("status");
    status.replaceWith(Object.assign(FT.statusBadge(d.status, d.failed_stage), { id: "status" }));
    document.getElementById("decision").replaceWith(Object.assign(FT.decisionBadge(d.final_decision, d), { id: "decision" }));
    FT.fill(document.getElementById("task"),
      el("span", { text: `${d.base_model || "?"} on ${d.benchmark || "?"}` }),
      d.description ? el("span", { class: "muted", text: " · " + d.description }) : null,
      el("span", { class: "muted", text: " · submitted " }), el("span", { "data-since": d.submitted_at || "", text: FT.age(d.submitted_at) }),
      el("span", { class: "muted", text: " ago" }),
      d.failed_stage ? el("span", { class: "badge no", text: "failed at " + d.failed_stage }) : null,
      sandboxBadge(d.sandbox));
    FT.fill(document.querySelector("#timeline tbody"), ...timeline(d.timeline));
    const p = d.progress;
    document.getElementById("progress").textContent = p ? `${p.stage} ${p.state}` + (p.step !== null ? ` · step ${p.step}/${p.total}` : "")
      + (p.loss !== null ? ` · loss ${FT.num(p.loss)}` : "") + (p.eta_s ? ` · ETA ${FT.duration(p.eta_s)}` : "") + (p.message ? ` · ${p.message}` : "") : "";
    drawLoss(d.loss);
    if (d.validation) FT.fill(document.getElementById("validation"), ...scoresTable(d.validation));
    if (d.test) FT.fill(document.getElementById("test"), ...testTable(d.test));
    if (d.feedback) FT.fill(document.getElementById("feedback"), ...feedback(d.feedback, d.judge));
    const c = d.campaign;
    document.getElementById("campaign-section").hidden = !c;
    if (c) {
      FT.fill(document.getElementById("campaign-check"),
        el("a", { href: "/campaigns/" + encodeURIComponent(c.campaign), text: c.campaign }),
        el("span", { class: "muted", text: c.index ? ` · tested #${c.index} at one-sided level ${c.level.toPrecision(3)} · ` : " · " }),
        el("span", { class: "badge " + (c.accepted ? "yes" : "no"), text: c.accepted ? "became the incumbent" : "refused" }),
        " ", el("span", { id: "campaign-summary", text: c.summary }));
    }
    if (d.data_stats || d.llm_usage) {
      FT.fill(document.getElementById("data"), ...(d.data_stats ? dataStats(d.data_stats, d.data_cached) : []),
        d.llm_usage ? llmUsage(d.llm_usage) : null);
    }
    FT.fill(document.getElementById("logs"), ...(d.logs.length ? d.logs.map((l) => el("li", { "data-log": l.name },
      el("a", { href: l.url, target: "_blank", text: l.name }), el("span", { class: "muted", text: ` ${l.size} bytes` }),
      l.hidden_test ? el("span", { class: "badge muted", text: "hidden test" }) : null)) : [el("li", { class: "muted", text: "none yet" })]));
    const samples = d.error_samples || [];
    document.getElementById("err-count").textContent = samples.length ? String(samples.length) : "";
    if (samples.length) {
      FT.fill(document.getElementById("errors"), el("table", { class: "grid samples" },
        el("thead", {}, el("tr", {}, ...["question", "gold", "model output"].map((h) => el("th", { text: h })))),
        el("tbody", {}, ...samples.map((s) => el("tr", {}, el("td", {}, el("pre", { text: s.question })),
          el("td", {}, el("pre", { text: s.gold })), el("td", {}, el("pre", { text: s.model_output })))))));
    }
    root.dataset.status = d.status;
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  }

  const reload = FT.serial(load);
  const soon = FT.debounce(reload, 120);
  FT.live((notice) => {
    if (notice.type === "reopen" || notice.request_id === RID || (notice.type === "records" && !notice.request_id)) soon();
  });
  reload();
})();
