// The episode list: filters, sorting and paging, all done by the server.
"use strict";
window.RV = window.RV || {};

(function () {
  const PAGE = 50;
  const FILTERS = {
    text: "f-text", min_length: "f-min-length", max_length: "f-max-length",
    min_return: "f-min-return", max_return: "f-max-return", ending: "f-ending", meta: "f-meta",
  };

  class EpisodeList {
    constructor(onOpen) {
      this.onOpen = onOpen;
      this.split = "";
      this.sort = "id";
      this.order = "asc";
      this.offset = 0;
      this.current = null;
      this.seq = 0;
      this.body = document.querySelector("#episodes tbody");
      this.status = document.getElementById("list-status");
      let timer = null;
      for (const id of Object.values(FILTERS)) {
        const input = document.getElementById(id);
        const later = () => {
          clearTimeout(timer);
          timer = setTimeout(() => { this.offset = 0; this.load(); }, 250);
        };
        input.addEventListener("input", later);
        input.addEventListener("change", later);
      }
      document.getElementById("filters").addEventListener("submit", (ev) => ev.preventDefault());
      for (const th of document.querySelectorAll("#episodes th[data-sort]")) {
        th.addEventListener("click", () => {
          const key = th.dataset.sort;
          if (this.sort === key) this.order = this.order === "asc" ? "desc" : "asc";
          else { this.sort = key; this.order = key === "id" ? "asc" : "desc"; }
          this.offset = 0;
          this.load();
        });
      }
      document.getElementById("prev-page").addEventListener("click", () => {
        this.offset = Math.max(0, this.offset - PAGE);
        this.load();
      });
      document.getElementById("next-page").addEventListener("click", () => {
        if (this.offset + PAGE < this.matched) { this.offset += PAGE; this.load(); }
      });
    }

    // The list's query (filters and order) as URL parameters, for pages and neighbours.
    params() {
      const p = new URLSearchParams({ split: this.split, sort: this.sort, order: this.order });
      for (const [key, id] of Object.entries(FILTERS)) {
        const value = document.getElementById(id).value.trim();
        if (value) p.set(key, value);
      }
      return p;
    }

    async load() {
      const seq = ++this.seq;
      const p = this.params();
      p.set("offset", String(this.offset));
      p.set("limit", String(PAGE));
      let page;
      try {
        const response = await fetch("/api/episodes?" + p);
        page = await response.json();
        if (!response.ok) throw new Error(page.error || response.statusText);
      } catch (e) {
        if (seq === this.seq) this.status.textContent = "cannot list episodes: " + e.message;
        return;
      }
      if (seq !== this.seq) return;  // a newer query answered first
      this.render(page);
    }

    render(page) {
      this.matched = page.matched;
      const rows = document.createDocumentFragment();
      for (const ep of page.episodes) {
        const tr = document.createElement("tr");
        tr.dataset.id = String(ep.id);
        if (ep.id === this.current) tr.className = "current";
        const ret = typeof ep.return === "number" ? RV.format(ep.return) : (ep.return ?? "–");
        const said = ep.error ? "cannot read: " + ep.error : ep.instruction;
        for (const text of [ep.id, ep.length, ret, ep.ending.replace("_", " "), said]) {
          const td = document.createElement("td");
          td.textContent = String(text);
          tr.appendChild(td);
        }
        tr.title = Object.entries(ep.metadata).map(([k, v]) => k + ": " + JSON.stringify(v)).join("\n");
        tr.addEventListener("click", () => this.onOpen(ep.id, 0));
        rows.appendChild(tr);
      }
      this.body.replaceChildren(rows);
      const shown = page.episodes.length;
      this.status.textContent = page.matched === page.total
        ? page.total + " episodes"
        : page.matched + " of " + page.total + " episodes match";
      document.getElementById("page-info").textContent = shown
        ? (page.offset + 1) + "–" + (page.offset + shown) : "none";
      for (const th of document.querySelectorAll("#episodes th[data-sort]")) {
        th.classList.toggle("sorted", th.dataset.sort === this.sort);
        th.dataset.order = th.dataset.sort === this.sort ? this.order : "";
      }
      if (RV.firstListPaint === undefined) {
        // Measured after the rows are laid out and painted (benchmarks/viewer.py).
        requestAnimationFrame(() => setTimeout(() => { RV.firstListPaint = performance.now(); }, 0));
      }
    }

    highlight(id) {
      this.current = id;
      for (const tr of this.body.children) {
        tr.classList.toggle("current", Number(tr.dataset.id) === id);
      }
    }

    async neighbour(id, dir) {
      const p = this.params();
      p.set("dir", String(dir));
      const response = await fetch("/api/episodes/" + id + "/next?" + p);
      const answer = await response.json();
      return response.ok ? answer.id : null;
    }
  }

  RV.EpisodeList = EpisodeList;
})();
