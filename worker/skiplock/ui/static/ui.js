// skiplock UI: confirmation of destructive forms, one submission per form, and the queues page's live refresh
// (a small poll of /api/queues every 2 s that updates the table's cells in place; no page reload).
"use strict";

document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
    return;
  }
  if (form.method === "post") {
    // a second click sends nothing: the first submission is on its way (the server dedupes by action key too)
    if (form.dataset.sent) { event.preventDefault(); return; }
    form.dataset.sent = "1";
    form.querySelectorAll("button").forEach((b) => { b.disabled = true; });
  }
});

function formatCell(key, value) {
  if (key === "oldest_ready_age_seconds") return `${Number(value).toFixed(1)} s`;
  if (key === "paused") return null;
  return Number(value).toLocaleString("en-US");
}

async function refreshQueues(table) {
  const live = document.getElementById("live");
  try {
    const response = await fetch(table.dataset.poll, { headers: { Accept: "application/json" }, cache: "no-store" });
    if (!response.ok) throw new Error(String(response.status));
    const data = await response.json();
    const known = new Set();
    for (const q of data.queues) {
      const row = table.querySelector(`tr[data-queue="${CSS.escape(q.queue)}"]`);
      if (!row) { window.location.reload(); return; }  // a new queue: render its row with its buttons
      known.add(q.queue);
      for (const cell of row.querySelectorAll("[data-k]")) {
        const key = cell.dataset.k;
        const text = formatCell(key, q[key]);
        if (text === null) continue;
        const target = cell.querySelector("a") || cell;
        if (target.textContent !== text) target.textContent = text;
      }
      const state = row.querySelector('[data-k="paused"] .status');
      if (state && (state.textContent === "paused") !== q.paused) { window.location.reload(); return; }
    }
    live.textContent = `live · ${new Date().toLocaleTimeString()}`;
    live.classList.remove("stale");
    live.dataset.updated = String(Date.now());
  } catch (err) {
    live.textContent = "live refresh failed, retrying";
    live.classList.add("stale");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  // a bulk action whose request ran out of time: send it again (same action key), it goes on where it stopped
  const resume = document.querySelector("form[data-autosubmit]");
  if (resume) resume.submit();
  const table = document.querySelector("table[data-poll]");
  if (!table) return;
  setInterval(() => refreshQueues(table), 2000);
});
