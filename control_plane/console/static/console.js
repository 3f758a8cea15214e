// Orbit console: small progressive enhancements. Every page works without this file.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  // Forms that change something irreversible ask first.
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
  // "Select all" checkboxes tick the boxes of the same name.
  for (const box of document.querySelectorAll("input[data-select-all]")) {
    box.addEventListener("change", () => {
      for (const other of box.form.querySelectorAll(`input[type=checkbox][name="${box.dataset.selectAll}"]`)) {
        other.checked = box.checked;
      }
    });
  }
  // Epoch-millisecond times in the reader's local time.
  for (const t of document.querySelectorAll("time[data-ms]")) {
    const ms = Number(t.dataset.ms);
    if (ms > 0) {
      const d = new Date(ms);
      t.dateTime = d.toISOString();
      t.textContent = d.toLocaleString();
    }
  }
  // "Back" links go back when there is a page to go back to.
  for (const a of document.querySelectorAll("a[data-back]")) {
    a.addEventListener("click", (event) => {
      if (window.history.length > 1) { event.preventDefault(); window.history.back(); }
    });
  }
  // Lag tables refresh themselves while their box is ticked (the choice survives the reload).
  const refresh = document.getElementById("auto-refresh");
  if (refresh) {
    const key = "orbit.console.refresh";
    refresh.checked = window.sessionStorage.getItem(key) === "on";
    let timer = null;
    const arm = () => {
      window.clearTimeout(timer);
      if (refresh.checked) timer = window.setTimeout(() => window.location.reload(), Number(refresh.dataset.refreshSeconds) * 1000);
    };
    refresh.addEventListener("change", () => {
      window.sessionStorage.setItem(key, refresh.checked ? "on" : "off");
      arm();
    });
    arm();
  }
});
