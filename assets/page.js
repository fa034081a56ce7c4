// The page's own script (launch.py puts it in the page's <head>). Plain DOM, no framework:
// 1. Files dropped on the request table go through the "Upload CSV or JSONL" button's parser
//    (Gradio's own drop zone on the table would import them without the page's checks, and
//    refuse a JSONL file with "Only .csv, .tsv allowed"), on a cell's text too.
// 2. A run waiting in Gradio's own queue (ZeroGPU) says its place and wait in the status line, in
//    words; not while the status line gives the page's own queue line ("Waiting for the model"):
//    a second Run event of the session (a repeat press, answered at once) passes through Gradio's
//    queue for a moment, and its "yours is next" stood under the page's own.
// 3. The metrics table's column names get hover definitions (window.CBP_METRIC_HELP, set below
//    by launch.py from engine/page/tables.py), the scheduling policies theirs
//    (window.CBP_POLICY_HELP, from engine/page/panels/settings_panel.py), the packed mask's
//    layer types theirs, by the label's first word (window.CBP_LAYER_HELP, from results_panel.py).
// 4. Clicks on Run ("Run live anyway" too) and Stop are numbered in one sequence: the latest
//    Run click's number (window.cbpRunClick) goes with each Run press, the Stop click's with
//    Stop, so the server acts in click order and tells Gradio's replay of a deferred click.
// 5. A KV block map label ("R12", "R0 ×3") wider than its block is hidden instead of running into
//    its neighbours' ("R1R2R3" on a phone); the block's hover still names it.
(() => {
  let clicks = 0;
  document.addEventListener("click", (e) => {
    const button = e.target instanceof Element && e.target.closest("button");
    if (!button) return;
    if (button.id === "run_button" || button.id === "live_button") window.cbpRunClick = ++clicks;
    if (button.id === "stop_button") window.cbpStopClick = ++clicks;
  }, true);  // capture: numbered before Gradio's own handler sends the press or Stop

  // Firefox aims drag events at the text node under the pointer: its parent is the element.
  const elementOf = (target) => target instanceof Element ? target
    : target instanceof Node ? target.parentElement : null;
  const onTable = (e) => !!elementOf(e.target)?.closest("#requests_table");
  const hasFiles = (e) => !!e.dataTransfer && Array.from(e.dataTransfer.types || []).includes("Files");
  for (const type of ["dragenter", "dragover", "dragleave"]) {
    document.addEventListener(type, (e) => {
      if (!onTable(e) || !hasFiles(e)) return;
      e.preventDefault();
      e.stopPropagation();
      if (type === "dragover") e.dataTransfer.dropEffect = "copy";
    }, true);
  }
  document.addEventListener("drop", (e) => {
    if (!onTable(e) || !hasFiles(e)) return;
    e.preventDefault();
    e.stopPropagation();
    const button = document.getElementById("upload_button");
    const input = button && button.parentElement.querySelector("input[type=file]");
    if (!input || !e.dataTransfer.files.length) return;
    const files = new DataTransfer();
    files.items.add(e.dataTransfer.files[0]);
    input.files = files.files;
    input.dispatchEvent(new Event("change", { bubbles: true }));
  }, true);

  // Gradio's tracker writes "queue: 2/3 | 4.1/26.0s" (place/size | waited/estimate).
  const QUEUE = /queue:\s*(\d+)\s*\/\s*(\d+)\s*\|\s*([\d.]+)(?:\s*\/\s*([\d.]+))?\s*s/;
  const PAGE_QUEUE = /^\s*Waiting for the model:/;  // progress_view.queue_line
  const queueNote = () => {
    const block = document.getElementById("status_markdown");
    if (!block) return;
    const tracker = block.querySelector("[data-testid=status-tracker]");
    const shown = tracker && !tracker.classList.contains("hide");
    const line = block.querySelector("[data-testid=markdown]");
    const waiting = PAGE_QUEUE.test((line && line.textContent) || "");  // the page's own line
    const m = shown && !waiting ? QUEUE.exec(tracker.textContent || "") : null;
    let note = document.getElementById("queue_note");
    if (!m) {
      if (note) note.remove();
      return;
    }
    if (!note) {
      note = document.createElement("div");
      note.id = "queue_note";
      note.setAttribute("role", "status");
      block.appendChild(note);
    }
    const [, place, size, waited, estimate] = m;
    const ahead = Number(place) - 1;
    let text = `Waiting in the queue: place ${place} of ${size}`;
    text += ahead ? ` (${ahead} waiting before yours)` : " (yours is next)";
    text += ` · waited ${Number(waited).toFixed(0)} s`;
    if (estimate) text += ` · estimate ${Number(estimate).toFixed(0)} s`;
    text += ". Your run starts by itself: no need to press Run again.";
    if (note.textContent !== text) note.textContent = text;
  };

  const metricHelp = () => {
    const help = window.CBP_METRIC_HELP || {};
    for (const cell of document.querySelectorAll("#metrics_table th")) {
      const label = cell.querySelector(".header") || cell;  // not the cell menu's "⋮"
      const name = (label.textContent || "").trim();
      if (help[name] && cell.title !== help[name]) cell.title = help[name];
    }
  };

  const policyHelp = () => {
    const help = window.CBP_POLICY_HELP || {};
    for (const choice of document.querySelectorAll("#policy_radio label")) {
      const name = (choice.textContent || "").trim();
      if (help[name] && choice.title !== help[name]) choice.title = help[name];
    }
    const layers = window.CBP_LAYER_HELP || {};
    for (const choice of document.querySelectorAll("#mask_layer_radio label")) {
      const name = (choice.textContent || "").trim().split(" ")[0];
      if (layers[name] && choice.title !== layers[name]) choice.title = layers[name];
    }
    const servers = window.CBP_SERVERS_HELP || "";
    for (const choice of document.querySelectorAll("#servers_checkbox label")) {
      if (servers && choice.title !== servers) choice.title = servers;
    }
  };

  const blockLabels = () => {
    const plot = document.querySelector("#block_map_plot .js-plotly-plot");
    const trace = plot && plot.data && plot.data[0];
    const axis = plot && plot._fullLayout && plot._fullLayout.xaxis;
    if (!trace || !axis || !trace.z || !trace.z.length) return;
    const roomPx = axis._length / trace.z[0].length - (trace.xgap || 0) - 2;
    for (const label of plot.querySelectorAll("g.heatmap-label text")) {
      if (label.cbpRoomPx === roomPx) continue;  // measured at this width (Plotly redraws anew)
      label.cbpRoomPx = roomPx;
      label.style.visibility = label.getBBox().width <= roomPx ? "" : "hidden";
    }
  };

  setInterval(() => { queueNote(); metricHelp(); policyHelp(); blockLabels(); }, 250);
})();
