// One plot per numeric step field, drawn on two stacked canvases: the lines
// (redrawn on resize or a series toggle) and the cursor (redrawn every step).
"use strict";
window.RV = window.RV || {};

(function () {
  // Colours by series index: the same dimension has the same colour in every episode.
  const PALETTE = ["#4e9bff", "#ff7a45", "#3cc47c", "#e45bd4", "#f2c12e", "#27c2c9",
    "#ff5c6c", "#a98bff", "#9bd35a", "#ff9fd0", "#c7a06b", "#7fa0b8"];
  const FLAG_STYLE = {
    is_first: { colour: "#3cc47c", dash: [4, 3], label: "F" },
    is_last: { colour: "#f2c12e", dash: [4, 3], label: "L" },
    is_terminal: { colour: "#ff5c6c", dash: [], label: "T" },
  };
  const HEIGHT = 120;
  const PAD = { left: 52, right: 8, top: 12, bottom: 16 };

  // Round values between lo and hi for the y axis (steps of 1, 2 or 5 times a power of ten).
  function ticks(lo, hi) {
    const rough = (hi - lo) / 3;
    const magnitude = Math.pow(10, Math.floor(Math.log10(rough)));
    const norm = rough / magnitude;
    const step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * magnitude;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi && out.length < 8; v += step) {
      out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    }
    return out;
  }

  function tickText(v) {
    const a = Math.abs(v);
    return (a !== 0 && (a < 1e-3 || a >= 1e6)) ? v.toExponential(1) : String(+v.toPrecision(6));
  }

  function colour(i) { return PALETTE[i % PALETTE.length]; }

  function hiddenKey(name) { return "rv-hidden:" + name; }

  function loadHidden(name) {
    try { return new Set(JSON.parse(localStorage.getItem(hiddenKey(name)) || "[]")); }
    catch (e) { return new Set(); }
  }

  function format(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "boolean") return v ? "true" : "false";
    if (typeof v === "string") return v;
    if (Number.isInteger(v)) return String(v);
    const a = Math.abs(v);
    return (a !== 0 && (a < 1e-3 || a >= 1e5)) ? v.toExponential(3) : String(+v.toPrecision(4));
  }

  class Plot {
    constructor(parent, meta, data, flags, length, onSeek) {
      this.meta = meta;       // {id, name, series: [names]}
      this.data = data;       // {bucket, values} or {bucket, min, max}
      this.flags = flags;     // {is_first: [steps], ...}
      this.length = length;
      this.onSeek = onSeek;
      this.hidden = loadHidden(meta.name);
      this.cursor = 0;
      this.el = document.createElement("div");
      this.el.className = "plot";
      this.el.dataset.field = meta.name;
      const title = document.createElement("div");
      title.className = "plot-title";
      title.textContent = meta.name + (data.bucket > 1 ? "  (min–max per " + data.bucket + " steps)" : "");
      this.el.appendChild(title);
      const body = document.createElement("div");
      body.className = "plot-body";
      this.stage = document.createElement("div");
      this.stage.className = "plot-stage";
      this.base = document.createElement("canvas");
      this.overlay = document.createElement("canvas");
      this.overlay.className = "plot-overlay";
      this.stage.appendChild(this.base);
      this.stage.appendChild(this.overlay);
      body.appendChild(this.stage);
      this.legend = document.createElement("div");
      this.legend.className = "legend";
      body.appendChild(this.legend);
      this.el.appendChild(body);
      parent.appendChild(this.el);
      this.valueEls = [];
      meta.series.forEach((name, i) => this.addLegendItem(name, i));
      this.overlay.addEventListener("click", (ev) => this.click(ev));
      this.resize = new ResizeObserver(() => this.draw());
      this.resize.observe(this.stage);
    }

    addLegendItem(name, i) {
      const item = document.createElement("label");
      item.className = "series";
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = !this.hidden.has(i);
      box.addEventListener("change", () => {
        if (box.checked) this.hidden.delete(i); else this.hidden.add(i);
        try { localStorage.setItem(hiddenKey(this.meta.name), JSON.stringify([...this.hidden])); }
        catch (e) { /* private mode: toggles last for the page */ }
        this.draw();
      });
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = colour(i);
      const label = document.createElement("span");
      label.className = "series-name";
      label.textContent = this.meta.series.length > 1 ? name.slice(this.meta.name.length) : name;
      label.title = name;
      const value = document.createElement("span");
      value.className = "value";
      value.textContent = "–";
      item.append(box, swatch, label, value);
      this.legend.appendChild(item);
      this.valueEls.push(value);
    }

    x(step, width) {
      const span = Math.max(1, this.length - 1);
      return PAD.left + (step / span) * (width - PAD.left - PAD.right);
    }

    step(px, width) {
      const span = Math.max(1, this.length - 1);
      const t = (px - PAD.left) / Math.max(1, width - PAD.left - PAD.right);
      return Math.max(0, Math.min(this.length - 1, Math.round(t * span)));
    }

    range() {
      let lo = Infinity, hi = -Infinity;
      const lows = this.data.values || this.data.min;
      const highs = this.data.values || this.data.max;
      for (let s = 0; s < lows.length; s++) {
        if (this.hidden.has(s)) continue;
        for (const v of lows[s]) if (v !== null && v < lo) lo = v;
        for (const v of highs[s]) if (v !== null && v > hi) hi = v;
      }
      if (!(lo <= hi)) { lo = 0; hi = 1; }
      if (lo === hi) { lo -= 0.5; hi += 0.5; }
      const pad = (hi - lo) * 0.06;
      return [lo - pad, hi + pad];
    }

    size(canvas) {
      const ratio = window.devicePixelRatio || 1;
      const width = Math.max(100, this.stage.clientWidth);
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(HEIGHT * ratio);
      canvas.style.width = width + "px";
      canvas.style.height = HEIGHT + "px";
      const ctx = canvas.getContext("2d");
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      return [ctx, width];
    }

    draw() {
      const [ctx, width] = this.size(this.base);
      this.size(this.overlay);  // sized here only: the cursor is redrawn every step
      this.width = width;
      const [lo, hi] = this.range();
      this.yRange = [lo, hi];
      const y = (v) => PAD.top + (1 - (v - lo) / (hi - lo)) * (HEIGHT - PAD.top - PAD.bottom);
      ctx.clearRect(0, 0, width, HEIGHT);
      ctx.font = "10px sans-serif";
      ctx.fillStyle = "#8b93a1";
      ctx.strokeStyle = "#2c313a";
      ctx.lineWidth = 1;
      for (const v of ticks(lo, hi)) {
        const py = Math.round(y(v)) + 0.5;
        ctx.beginPath();
        ctx.moveTo(PAD.left, py);
        ctx.lineTo(width - PAD.right, py);
        ctx.stroke();
        const text = tickText(v);
        ctx.fillText(text, PAD.left - 4 - ctx.measureText(text).width, py + 3);
      }
      ctx.fillText("0", PAD.left - 3, HEIGHT - 3);
      const end = String(this.length - 1);
      ctx.fillText(end, width - PAD.right - ctx.measureText(end).width, HEIGHT - 3);
      // Flags: a line per marked step, their letters together beside it.
      const marks = new Map();
      for (const [name, steps] of Object.entries(this.flags)) {
        const style = FLAG_STYLE[name];
        if (!style) continue;
        ctx.strokeStyle = style.colour;
        ctx.setLineDash(style.dash);
        for (const s of steps) {
          const px = Math.round(this.x(s, width)) + 0.5;
          ctx.beginPath();
          ctx.moveTo(px, PAD.top);
          ctx.lineTo(px, HEIGHT - PAD.bottom);
          ctx.stroke();
          if (!marks.has(s)) marks.set(s, []);
          marks.get(s).push(style);
        }
      }
      for (const [s, styles] of marks) {
        const px = this.x(s, width);
        const total = styles.reduce((n, st) => n + ctx.measureText(st.label).width + 2, 0);
        let tx = px + total + 4 > width ? px - total - 2 : px + 3;
        for (const st of styles) {
          ctx.fillStyle = st.colour;
          ctx.fillText(st.label, tx, PAD.top - 2);
          tx += ctx.measureText(st.label).width + 2;
        }
      }
      ctx.setLineDash([]);
      const bucket = this.data.bucket;
      const series = (this.data.values || this.data.min).length;
      for (let s = 0; s < series; s++) {
        if (this.hidden.has(s)) continue;
        ctx.strokeStyle = colour(s);
        ctx.lineWidth = 1.25;
        if (bucket === 1) this.line(ctx, this.data.values[s], 1, y, width);
        else {
          const lows = this.data.min[s], highs = this.data.max[s];
          ctx.globalAlpha = 0.45;
          ctx.beginPath();
          for (let i = 0; i < lows.length; i++) {
            if (lows[i] === null) continue;
            const px = this.x(Math.min(this.length - 1, i * bucket + bucket / 2), width);
            ctx.moveTo(px, y(lows[i]));
            ctx.lineTo(px, y(highs[i]) - 0.5);
          }
          ctx.stroke();
          ctx.globalAlpha = 1;
          this.line(ctx, highs, bucket, y, width);
          this.line(ctx, lows, bucket, y, width);
        }
      }
      this.drawCursor();
    }

    line(ctx, values, bucket, y, width) {
      ctx.beginPath();
      let open = false;
      for (let i = 0; i < values.length; i++) {
        const v = values[i];
        if (v === null) { open = false; continue; }
        const step = bucket === 1 ? i : Math.min(this.length - 1, i * bucket + bucket / 2);
        const px = this.x(step, width);
        if (open) ctx.lineTo(px, y(v)); else ctx.moveTo(px, y(v));
        open = true;
      }
      ctx.stroke();
    }

    setCursor(step, values) {
      this.cursor = step;
      this.el.dataset.cursor = String(step);
      this.drawCursor();
      for (let i = 0; i < this.valueEls.length; i++) {
        this.valueEls[i].textContent = values ? format(values[i]) : "…";
      }
    }

    drawCursor() {
      if (!this.width) return;
      const width = this.width;
      const ctx = this.overlay.getContext("2d");
      ctx.clearRect(0, 0, width, HEIGHT);
      const px = Math.round(this.x(this.cursor, width)) + 0.5;
      ctx.strokeStyle = "#e8eaed";
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(px, 2);
      ctx.lineTo(px, HEIGHT - PAD.bottom + 2);
      ctx.stroke();
    }

    click(ev) {
      const rect = this.overlay.getBoundingClientRect();
      this.onSeek(this.step(ev.clientX - rect.left, rect.width));
    }

    destroy() {
      this.resize.disconnect();
      this.el.remove();
    }
  }

  RV.Plot = Plot;
  RV.format = format;
})();
