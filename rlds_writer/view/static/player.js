// The episode player: one step clock drives every camera and every plot.
// A step is shown only when every camera's frame for it is decoded, so the
// cameras never drift from each other or from the plots; frames are fetched
// ahead of the clock (the stored PNG/JPEG bytes, decoded by the browser).
"use strict";
window.RV = window.RV || {};

(function () {
  const CHUNK = 256;        // exact values fetched per request, for the cursor
  const BEHIND = 30;        // decoded frames kept behind the clock
  const IN_FLIGHT = 12;     // frame requests at once
  const BUFFER = 30;        // steps decoded ahead before playing starts (or resumes)
  const AHEAD_MS = 4000;    // how far ahead of the clock frames are fetched...
  const DECODED_BYTES = 96 << 20;  // ...within this much decoded frame memory

  class Player {
    constructor(onStep) {
      this.onStep = onStep;   // (split, episode, step) after each shown step
      this.episode = null;
      this.step = 0;
      this.playing = false;
      this.plots = [];
      this.cameras = [];
      this.stats = { shown: 0, stalls: 0 };
      RV.stats = this.stats;
      this.loadSeq = 0;
      this.el = {
        play: document.getElementById("play"),
        scrub: document.getElementById("scrub"),
        label: document.getElementById("step-label"),
        fps: document.getElementById("fps"),
        speed: document.getElementById("speed"),
        stalls: document.getElementById("stalls"),
      };
      this.el.play.addEventListener("click", () => this.toggle());
      document.getElementById("back").addEventListener("click", () => this.stepBy(-1));
      document.getElementById("forward").addEventListener("click", () => this.stepBy(1));
      this.el.scrub.addEventListener("input", () => this.seek(Number(this.el.scrub.value)));
      this.tick = this.tick.bind(this);
    }

    get interval() {
      const fps = Math.max(1, Math.min(240, Number(this.el.fps.value) || 30));
      return 1000 / (fps * Number(this.el.speed.value || 1));
    }

    async open(split, id, step) {
      const seq = ++this.loadSeq;
      this.pause();
      const response = await fetch("/api/episodes/" + id + "?split=" + encodeURIComponent(split));
      const ep = await response.json();
      if (seq !== this.loadSeq) return false;
      if (!response.ok) throw new Error(ep.error || response.statusText);
      this.close();
      this.split = split;
      this.episode = ep;
      this.chunks = new Map();
      this.inFlight = 0;
      document.getElementById("empty").hidden = true;
      document.getElementById("episode").hidden = false;
      document.getElementById("episode-title").textContent =
        "episode " + ep.id + " · " + ep.length + " steps · " + ep.ending.replace("_", " ") +
        (typeof ep.return === "number" ? " · return " + RV.format(ep.return) : "");
      document.getElementById("instruction").textContent = ep.instruction || "";
      this.buildCameras(ep);
      this.buildPlots(ep);
      this.buildTexts(ep);
      this.buildMetadata(ep);
      this.el.scrub.max = String(Math.max(0, ep.length - 1));
      this.seek(Math.max(0, Math.min(ep.length - 1, step || 0)));
      return true;
    }

    close() {
      for (const plot of this.plots) plot.destroy();
      for (const cam of this.cameras) {
        for (const entry of cam.frames.values()) if (entry.bitmap) entry.bitmap.close();
      }
      this.plots = [];
      this.cameras = [];
    }

    buildCameras(ep) {
      const box = document.getElementById("cameras");
      box.replaceChildren();
      for (const meta of ep.cameras) {
        const figure = document.createElement("figure");
        figure.className = "camera";
        const canvas = document.createElement("canvas");
        canvas.dataset.camera = meta.name;
        canvas.dataset.step = "";
        const caption = document.createElement("figcaption");
        caption.textContent = meta.name;
        figure.append(canvas, caption);
        box.appendChild(figure);
        this.cameras.push({ meta, canvas, caption, frames: new Map() });
      }
    }

    buildPlots(ep) {
      const box = document.getElementById("plots");
      box.replaceChildren();
      const metas = RV.dataset.fields.plots;
      for (const data of ep.plots) {
        const meta = metas[data.id];
        this.plots.push(new RV.Plot(box, meta, data, ep.flags, ep.length, (s) => {
          this.pause();
          this.seek(s);
        }));
      }
    }

    buildTexts(ep) {
      const list = document.getElementById("text-changes");
      list.replaceChildren();
      for (const [name, changes] of Object.entries(ep.texts)) {
        for (const [step, text] of changes) {
          const li = document.createElement("li");
          const link = document.createElement("a");
          link.href = "#";
          link.textContent = "step " + step;
          link.addEventListener("click", (ev) => { ev.preventDefault(); this.pause(); this.seek(step); });
          li.append(link, " " + name + ": " + text);
          list.appendChild(li);
        }
      }
    }

    buildMetadata(ep) {
      const table = document.getElementById("metadata");
      table.replaceChildren();
      const entries = Object.entries(ep.metadata);
      if (!entries.length) {
        const tr = table.insertRow();
        tr.insertCell().textContent = "(no episode-level fields)";
      }
      for (const [key, value] of entries) {
        const tr = table.insertRow();
        tr.insertCell().textContent = key;
        tr.insertCell().textContent = typeof value === "string" ? value : JSON.stringify(value);
      }
    }

    // --- the clock -----------------------------------------------------------

    toggle() { if (this.playing) this.pause(); else this.play(); }

    play() {
      if (!this.episode) return;
      if (this.step >= this.episode.length - 1) this.seek(0);
      this.playing = true;
      this.el.play.textContent = "❚❚";
      this.due = performance.now() + this.interval;
      this.waiting = false;
      this.buffering = true;
      this.prefetch();
      requestAnimationFrame(this.tick);
    }

    pause() {
      this.playing = false;
      this.el.play.textContent = "▶";
    }

    tick(now) {
      if (!this.playing || !this.episode) return;
      if (this.buffering) {
        // Like a video player: start once the next steps' frames are decoded.
        const until = Math.min(this.episode.length - 1, this.step + BUFFER);
        let ok = true;
        for (let s = this.step + 1; s <= until && ok; s++) ok = this.ready(s);
        if (ok) { this.buffering = false; this.due = now + this.interval; }
      } else if (now >= this.due) {
        const next = this.step + 1;
        if (next >= this.episode.length) { this.pause(); return; }
        if (this.ready(next)) {
          // Late by less than a step: keep the rhythm; later than that: start again from now.
          this.due = now - this.due < this.interval ? this.due + this.interval : now + this.interval;
          this.waiting = false;
          this.show(next);
        } else if (!this.waiting) {
          this.waiting = true;   // the clock waits for the frame: counted, never skipped,
          this.buffering = true; // and plays on once a cushion of frames is decoded again
          this.stats.stalls += 1;
          this.el.stalls.textContent = "waited for frames " + this.stats.stalls + "×";
        }
      }
      this.prefetch();
      requestAnimationFrame(this.tick);
    }

    ready(step) {
      return this.cameras.every((cam) => {
        if (step >= cam.meta.frames) return true;
        const entry = cam.frames.get(step);
        return entry && (entry.bitmap || entry.error);
      });
    }

    stepBy(delta) {
      if (!this.episode) return;
      this.pause();
      this.seek(Math.max(0, Math.min(this.episode.length - 1, this.step + delta)));
    }

    seek(step) {
      this.show(step);
      this.prefetch();
    }

    // Shows `step` everywhere at once: cameras, plot cursors, values, texts, the URL.
    show(step) {
      this.step = step;
      this.stats.shown += 1;
      for (const cam of this.cameras) this.drawFrame(cam, step);
      this.el.scrub.value = String(step);
      this.el.label.textContent = "step " + step + " / " + (this.episode.length - 1);
      const row = this.exact(step);
      for (let i = 0; i < this.plots.length; i++) {
        this.plots[i].setCursor(step, row ? row.plots[this.plots[i].meta.id] : null);
      }
      this.showTexts(step, row);
      this.onStep(this.split, this.episode.id, step);
    }

    showTexts(step, row) {
      const box = document.getElementById("step-texts");
      const lines = [];
      for (const [name, changes] of Object.entries(this.episode.texts)) {
        let text = "";
        for (const [at, value] of changes) { if (at <= step) text = value; else break; }
        if (row && row.texts[name] !== undefined) text = row.texts[name];
        lines.push([name, text]);
      }
      box.replaceChildren(...lines.map(([name, text]) => {
        const div = document.createElement("div");
        const b = document.createElement("b");
        b.textContent = name + ": ";
        div.append(b, text);
        return div;
      }));
    }

    drawFrame(cam, step) {
      const entry = cam.frames.get(step);
      if (step >= cam.meta.frames) {
        cam.caption.textContent = cam.meta.name + " (no frame at step " + step + ")";
        cam.canvas.dataset.step = String(step);
        return;
      }
      if (!entry || !(entry.bitmap || entry.error)) {
        cam.pending = step;   // drawn when it arrives, if still wanted
        this.fetchFrame(cam, step);
        return;
      }
      cam.pending = null;
      if (entry.error) {
        cam.caption.textContent = cam.meta.name + ": " + entry.error;
      } else {
        const bitmap = entry.bitmap;
        if (cam.canvas.width !== bitmap.width || cam.canvas.height !== bitmap.height) {
          cam.canvas.width = bitmap.width;
          cam.canvas.height = bitmap.height;
        }
        cam.canvas.getContext("2d").drawImage(bitmap, 0, 0);
        cam.caption.textContent = cam.meta.name;
      }
      cam.canvas.dataset.step = String(step);
    }

    prefetch() {
      if (!this.episode) return;
      const ahead = this.aheadSteps();
      for (let s = this.step; s < Math.min(this.episode.length, this.step + ahead); s++) {
        for (const cam of this.cameras) {
          if (this.inFlight >= IN_FLIGHT) return;
          if (s < cam.meta.frames && !cam.frames.has(s)) this.fetchFrame(cam, s);
        }
      }
      const chunk = Math.floor(this.step / CHUNK) + 1;
      if (chunk * CHUNK < this.episode.length) this.loadChunk(chunk);
      // Decoded frames far from the clock are let go: memory stays bounded.
      for (const cam of this.cameras) {
        for (const [s, entry] of cam.frames) {
          if (s < this.step - BEHIND || s > this.step + ahead + BEHIND) {
            if (entry.bitmap) entry.bitmap.close();
            cam.frames.delete(s);
          }
        }
      }
    }

    // Steps fetched ahead: AHEAD_MS of playing, at most DECODED_BYTES of decoded frames.
    aheadSteps() {
      let perStep = 0;
      for (const cam of this.cameras) {
        const [h, w] = RV.dataset.fields.cameras[cam.meta.id].shape;
        perStep += (h || 480) * (w || 640) * 4;
      }
      const byMemory = perStep ? Math.floor(DECODED_BYTES / perStep) : 240;
      const byTime = Math.round(AHEAD_MS / this.interval);
      return Math.max(BUFFER * 2, Math.min(240, byTime, byMemory));
    }

    async fetchFrame(cam, step) {
      if (cam.frames.has(step)) return;
      const entry = {};
      cam.frames.set(step, entry);
      const episode = this.episode;
      this.inFlight += 1;
      try {
        const url = "/api/episodes/" + episode.id + "/frames/" + cam.meta.id + "/" + step +
          "?split=" + encodeURIComponent(this.split);
        const response = await fetch(url);
        if (!response.ok) {
          const answer = await response.json();
          entry.error = answer.error || response.statusText;
        } else {
          entry.bitmap = await createImageBitmap(await response.blob());
        }
      } catch (e) {
        entry.error = "cannot show the frame: " + e.message;
      } finally {
        this.inFlight -= 1;
      }
      if (this.episode !== episode || cam.frames.get(step) !== entry) {
        if (entry.bitmap) entry.bitmap.close();  // a stale answer: episode changed or evicted
        return;
      }
      if (cam.pending === step) this.drawFrame(cam, step);
    }

    // Exact values of the cursor's step, from chunks of CHUNK steps.
    exact(step) {
      const chunk = Math.floor(step / CHUNK);
      const data = this.chunks.get(chunk);
      if (!data || data.pending) { this.loadChunk(chunk); return null; }
      const i = step - data.start;
      return {
        plots: data.plots.map((rows) => rows[i]),
        texts: Object.fromEntries(Object.entries(data.texts).map(([k, v]) => [k, v[i]])),
      };
    }

    async loadChunk(chunk) {
      if (this.chunks.has(chunk)) return;
      const episode = this.episode;
      this.chunks.set(chunk, { pending: true });
      const url = "/api/episodes/" + episode.id + "/steps?split=" + encodeURIComponent(this.split) +
        "&start=" + chunk * CHUNK + "&stop=" + (chunk + 1) * CHUNK;
      try {
        const response = await fetch(url);
        const data = await response.json();
        if (!response.ok) throw new Error(data.error);
        if (this.episode !== episode) return;
        this.chunks.set(chunk, data);
        if (Math.floor(this.step / CHUNK) === chunk) {
          const row = this.exact(this.step);
          for (const plot of this.plots) plot.setCursor(this.step, row.plots[plot.meta.id]);
          this.showTexts(this.step, row);
        }
      } catch (e) {
        if (this.episode === episode) this.chunks.delete(chunk);
      }
    }
  }

  RV.Player = Player;
})();
